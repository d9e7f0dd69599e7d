"""Collusion benchmark: does a fake Δ reach the model when the cheater's accomplices hold a share
q of the verifier stake, and does faking pay? Seeded trials on the chain's state machine next to
the exact formula (`protocol.collusion`).

Each trial is a fresh chain: one cheating host, N = 10 verifier keys of equal stake of which
A = q·N are accomplices (for the defaults also N = 20 and 100, to reach q = 45% and 49%), one
outer step of the real module (stake-weighted draws, audit lottery
from a post-verdict seed, disputes decided by verifier stake, fraud slashes, rewards only for Δs
that reach the model). The coalition plays its best strategy: an accomplice ACCEPTs only when
every verifier drawn in its stage (initial, audit) is an accomplice, and REJECTs otherwise or on a
dispute panel (no accomplice ever contradicts a dispute it cannot win); honest verifiers REJECT
the fake. The cheater's profit per outer step = reward received − its slash − its accomplices'
slashes, in units of the reward R.

    .venv/bin/python -m bench.collusion [--quick]

Prints the table and writes bench/results/collusion.json. A measurement, not a test.

`--windows` (issue 34) runs the same under sampling windows at the issue's H = 500, k = 5, w = 3
(B = 34 blocks, v + a = 7 slots, each its own block) and writes bench/results/collusion_windows.json:

- the fake-Δ table again, under the windows rule (specs §6): only a check that ends at θ_H
  (`RunConfig.window_reaches_end`: the last block's) checks Δ against it, so an honest slot holder
  rejects the fake Δ (DELTA_MISMATCH) only if its window reaches θ_H, and accepts otherwise (its
  window replays clean; it fetched the Δ only to keep it); honest panel members and revotes (Δ
  first) reject it. A fake Δ is then a one-block fake of the last block: next to the exact
  `window_odds_keys(A, H, B, 1, d)` and the planner's many-keys `window_cheat(B, 1, …)`. The
  coalition's best play under the chain's rule (`ends_short`): an accomplice accepts on its slot
  (an ACCEPT of a window short of θ_H answers no Δ question, so it is never contradicted, and the
  one slot on the last block is the only check that sees the fake) and, in a dispute, accepts
  whenever the coalition does not lose the Δ vote;
- a host faking a fraction f = 0.5 of its segments (`lazy`: F = 17 whole blocks) and one faking one
  segment (`one_fake`: F = 1), against N = 10 and 100 keys: honest slot holders reject iff their
  window (`Contribution.windows[slots[x]]`) holds a faked segment, accomplices accept on their slots
  and, on a dispute panel, accept whenever that does not lose the segments vote (reject otherwise:
  no accomplice is slashed for a vote it could not win); honest panel members reject (the disputed
  windows are fake). Next to the exact `protocol.collusion.window_odds_keys` and the planner's
  many-keys `gonka_diloco.plan.window_cheat`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import time
from functools import lru_cache
from pathlib import Path
from typing import Any

from cosmpy.crypto.address import Address

from chain.genesis import Genesis, genesis_state
from chain.module import (
    BlockContext,
    TxContext,
    begin_block,
    disputed_windows,
    end_block,
    owes_revote,
    process_msg,
)
from chain.params import BONDING_DELAY_BLOCKS, Outcome, Phase, Review
from chain.state import ChainState, Contribution
from protocol import merkle
from protocol.collusion import (
    Defense,
    every_minority,
    expected_profit,
    expected_profit_keys,
    max_safe_share,
    pass_probability,
    pass_probability_keys,
    window_expected_profit_keys,
    window_odds_keys,
)
from protocol.config import Codec, ModelSpec, Phases, RunConfig, Sampling, Stake
from protocol.messages import (
    EnvFingerprint,
    MsgCommitPseudoGradient,
    MsgCreateRun,
    MsgJoinRun,
    MsgRevealContribution,
    MsgSubmitOuterResult,
    MsgSubmitVerdict,
    Reason,
    Role,
    SegmentOpening,
)
from protocol.prf import window, window_blocks

RESULTS = Path(__file__).parent / "results" / "collusion.json"
GNK = 10**9
N_KEYS = 10
SHARES = [i / N_KEYS for i in range(6)]  # 0 %, 10 %, …, 50 % of the verifier stake
EXTRA = [(9, 20), (49, 100)]  # (accomplice keys, keys) for the defaults: q = 45 %, 49 %
PREVIOUS = (4, 5000, 1)  # the defaults before issue 10's last round: ≤ 1 % only up to q = 34.9 %
DEFAULTS = RunConfig.model_fields
DEFAULT_STAKE = Stake()


def _addr(name: str) -> str:
    return str(Address(hashlib.sha256(name.encode()).digest()[:20], prefix="gonka"))


def _h(*parts: object) -> str:
    return hashlib.sha256(":".join(map(str, parts)).encode()).hexdigest()


AUTHORITY = _addr("collusion authority")
CHEATER = _addr("collusion cheater")
ALL_KEYS = [_addr(f"collusion verifier {i}") for i in range(max(n for _, n in EXTRA))]
KEYS = ALL_KEYS[:N_KEYS]
ENV = EnvFingerprint(torch_version="2.13.0", threads=1)


WINDOWED = {"inner_steps": 500, "segment_len": 5, "window_segments": 3}
"""Issue 34's defaults for the windows runs: n = 100 segments, B = 34 blocks > v + a = 7 slots."""


def bench_config(
    v: int, audit_bps: int, audit_verifiers: int, sampling: Sampling = Sampling.SEGMENTS
) -> RunConfig:
    """The run defaults' stake and slashing, short phases (they do not change any probability).
    The keys join in block 2; training waits `BONDING_DELAY_BLOCKS` blocks so that their stake is
    in the challenge's pool (§2.3; with one join block the draws found no verifier at all)."""
    shape = WINDOWED if sampling is Sampling.WINDOWS else {"inner_steps": 4, "segment_len": 2}
    return RunConfig(
        model=ModelSpec(factory="trainer.model:tiny", config={"param_count": 1000}),
        dataset_manifest_hash=_h("data"), initial_model_hash=_h("g0"), **shape, sampled_segments=1,
        sampling=sampling, verifiers_per_contribution=v, audit_bps=audit_bps, audit_verifiers=audit_verifiers,
        batch_size=2, seq_len=8, codec=Codec.INT8, max_outer_steps=1,
        phases=Phases(join_blocks=BONDING_DELAY_BLOCKS, train_blocks=1, reveal_blocks=1, verify_blocks=1,
                      escalation_blocks=1, max_escalations=0, audit_blocks=1, confirm_blocks=1,
                      result_blocks=1, result_rounds=1, epoch_length=10**6),
        stake=DEFAULT_STAKE,
    )  # fmt: skip


@lru_cache(maxsize=8)
def _leaves(n: int) -> list[bytes]:
    """One trajectory per segment count: the draws come from block hashes, not from the leaves,
    so every trial may open the same tree (and its proofs are built once)."""
    return [hashlib.sha256(f"collusion leaf:{i}".encode()).digest() for i in range(n + 1)]


@lru_cache(maxsize=1024)
def _opening(n: int, j: int) -> SegmentOpening:
    lv = _leaves(n)
    return SegmentOpening(segment=j, start_leaf=lv[j].hex(), end_leaf=lv[j + 1].hex(),
                          proof=[p.hex() for p in merkle.pair_proof(lv, j)])  # fmt: skip


class Trial:
    """One outer step of one cheater against N keys, A of them accomplices, on the module itself.
    `faked`: the segments a windowed host faked (its Δ is then consistent with its θ_H); None: a
    fake Δ, which every check rejects."""

    def __init__(
        self, config: RunConfig, accomplices: set[str], seed: str, keys: list[str] = KEYS,
        faked: set[int] | None = None,
    ) -> None:  # fmt: skip
        self.keys, self.faked = keys, faked
        funded = dict.fromkeys([AUTHORITY, CHEATER, *keys], 1000 * GNK)
        self.state: ChainState = genesis_state(
            Genesis(authority=AUTHORITY, accounts=funded, reward_pool=10**6 * GNK)
        )
        self.config, self.accomplices, self.seed = config, accomplices, seed
        self.height = 0
        self.leaves = _leaves(config.n_segments)

    def block(self, msgs: list[Any]) -> None:
        h = self.height + 1
        ctx = BlockContext(height=h, time_ns=h * 10**9, prev_block_hash=_h(self.seed, h))
        begin_block(self.state, ctx)
        for i, m in enumerate(msgs or self.react()):
            process_msg(self.state, m, TxContext(h, h * 10**9, _h(self.seed, h, i), m.creator))
        end_block(self.state, ctx)
        self.height = h

    def contribution(self) -> Contribution | None:
        return self.state.runs[1].steps[0].contributions.get(CHEATER)

    def vote(self, verifier: str, c: Contribution) -> Reason:
        """The coalition's best play; honest verifiers reject the fake."""
        if self.faked is not None:
            return self.window_vote(verifier, c)
        if c.windows:
            return self.delta_window_vote(verifier, c)
        if verifier not in self.accomplices or c.review == Review.CONFIRM:
            return Reason.DELTA_MISMATCH
        stage = c.verifier_rounds[verifier]
        same_stage = [x for x, r in c.verifier_rounds.items() if r == stage]
        return Reason.ACCEPT if all(x in self.accomplices for x in same_stage) else Reason.DELTA_MISMATCH

    def window_vote(self, verifier: str, c: Contribution) -> Reason:
        """Faked segments under windows: a slot holder replays its window; a panel member (no slot)
        and a revote (a slot holder of a window nobody disputed, in a dispute) the disputed ones.
        An accomplice accepts on its slot (nobody else replays an undisputed window) and, in a
        dispute, whenever the coalition does not lose (every assigned verifier votes, §2.5.3)."""
        assert self.faked is not None
        n, w = self.config.n_segments, self.config.window_len
        own = verifier in c.slots and not owes_revote(c, verifier)
        mine = [c.windows[c.slots[verifier]]] if own else disputed_windows(c)
        fake = any(seg in self.faked for start in mine for seg in window(start, n, w))
        if verifier not in self.accomplices:
            return Reason.REPLAY_MISMATCH if fake else Reason.ACCEPT
        if own:
            return Reason.ACCEPT
        return Reason.ACCEPT if self.coalition_holds(c) else Reason.REPLAY_MISMATCH

    def delta_window_vote(self, verifier: str, c: Contribution) -> Reason:
        """A fake Δ under windows (specs §6): only a check that ends at θ_H checks Δ against it. An
        honest slot holder rejects (DELTA_MISMATCH) iff its window reaches θ_H, else accepts (its
        window replays clean); an honest panel member or revote (Δ first) rejects. An accomplice
        accepts on its slot: a window short of θ_H answers no Δ question (chain `ends_short`), so
        that ACCEPT is never contradicted, and the last block is one slot's, so an accomplice there
        is the only check that sees the fake; in a dispute it accepts whenever the coalition does
        not lose the Δ vote (every assigned verifier answers it, the short slots by their revotes)."""
        own = verifier in c.slots and not owes_revote(c, verifier)
        if verifier not in self.accomplices:
            short = own and not self.config.window_reaches_end(c.windows[c.slots[verifier]])
            return Reason.ACCEPT if short else Reason.DELTA_MISMATCH
        if own:
            return Reason.ACCEPT
        return Reason.ACCEPT if self.coalition_holds(c) else Reason.DELTA_MISMATCH

    def coalition_holds(self, c: Contribution) -> bool:
        """In a dispute: the accomplices' stake among its voters is at least the honest ones' (an
        accept then does not lose: it wins, or ties into UNVERIFIED, and nobody is contradicted)."""
        stake = self.state.runs[1].participants
        ours = sum(stake[x].stake for x in c.verifier_rounds if x in self.accomplices)
        theirs = sum(stake[x].stake for x in c.verifier_rounds if x not in self.accomplices)
        return ours >= theirs

    def react(self) -> list[Any]:
        """What the participants send in this block, given the state after begin_block."""
        step = self.state.runs[1].steps[0]
        c = self.contribution()
        if step.phase == Phase.TRAIN and c is None:
            return [MsgCommitPseudoGradient(
                creator=CHEATER, run_id=1, outer_step=0, base_model_hash=step.base_model_hash,
                trajectory_root=merkle.merkle_root(self.leaves).hex(), leaf_count=len(self.leaves),
                delta_hash=_h("fake", self.seed), final_optimizer_hash=_h("opt", self.seed), codec=Codec.INT8,
                tokens=self.config.tokens_per_outer_step, env=ENV,
            )]  # fmt: skip
        if c is None:
            return []
        msgs: list[Any] = []
        if step.phase == Phase.REVEAL and c.reveal_height is None:
            openings = [_opening(self.config.n_segments, j) for j in c.sampled_segments]
            msgs.append(MsgRevealContribution(creator=CHEATER, run_id=1, outer_step=0,
                                              openings=openings))  # fmt: skip
        if step.phase in (Phase.REVEAL, Phase.VERIFY, Phase.AUDIT, Phase.CONFIRM) and c.outcome is None:
            for v in sorted(c.verifier_rounds):
                owed = v not in c.verdicts or owes_revote(c, v)
                if owed and (c.reveal_height is not None or msgs):
                    vote = MsgSubmitVerdict(creator=v, run_id=1, outer_step=0, host=CHEATER,
                                            reason=self.vote(v, c), evidence_hash=_h("ev", v))  # fmt: skip
                    msgs.append(vote)
        if step.phase == Phase.AWAITING_RESULT and CHEATER not in step.result_votes:
            poisoned = _h("poisoned")
            msgs.append(MsgSubmitOuterResult(creator=CHEATER, run_id=1, outer_step=0, model_hash=poisoned))
        return msgs

    def run(self) -> dict[str, Any]:
        stakes = dict.fromkeys(self.keys, GNK)
        self.block([MsgCreateRun(creator=AUTHORITY, config=self.config)])
        self.block([MsgJoinRun(creator=CHEATER, run_id=1, role=Role.HOST, endpoint="http://h",
                               stake=self.config.stake.min_host_stake)]
                   + [MsgJoinRun(creator=k, run_id=1, role=Role.VERIFIER, endpoint="http://v", stake=s)
                      for k, s in stakes.items()])  # fmt: skip
        run = self.state.runs[1]
        while run.steps[0].phase != Phase.DONE:
            self.block([])
            if self.height > 200:
                raise RuntimeError("the outer step did not end")
        c = run.steps[0].contributions[CHEATER]
        if not c.verifiers:
            raise RuntimeError("no verifier was drawn: the keys' stake missed the challenge's pool")
        slashed = sum(GNK - run.participants[k].stake for k in self.accomplices if k in run.participants)
        honest = [k for k in self.keys if k not in self.accomplices]
        return {
            "passed": run.global_model_hash == _h("poisoned"),
            "audited": c.audited,
            "rejected": c.outcome == Outcome.REJECTED,
            "unverified": c.outcome == Outcome.UNVERIFIED,
            "honest_slashed": sum(run.participants[k].stake < GNK for k in honest),
            "profit": c.reward - c.slashed - slashed,
        }


def cell(
    v: int, p_bps: int, a: int, accomplices: int, trials: int, n_keys: int = N_KEYS,
    sampling: Sampling = Sampling.SEGMENTS,
) -> dict[str, Any]:  # fmt: skip
    config = bench_config(v, p_bps, a, sampling)
    d = Defense(v, p_bps, a, DEFAULT_STAKE.host_slash_bps, DEFAULT_STAKE.fraud_host_slash_bps,
                DEFAULT_STAKE.fraud_verifier_slash_bps)  # fmt: skip
    reward, bond = config.stake.reward_per_outer_step, config.stake.min_host_stake
    keys = ALL_KEYS[:n_keys]
    gang = set(keys[:accomplices])
    passed = audited = rejected = unverified = honest_slashed = 0
    profit = 0
    for t in range(trials):
        tag = f"{v}:{p_bps}:{a}:{accomplices}" + ("" if n_keys == N_KEYS else f"/{n_keys}")
        tag += "" if sampling is Sampling.SEGMENTS else f":{sampling}"
        out = Trial(config, gang, f"{tag}:{t}", keys).run()
        passed += out["passed"]
        audited += out["audited"]
        rejected += out["rejected"]
        unverified += out["unverified"]
        honest_slashed += out["honest_slashed"]
        profit += out["profit"]
    q = accomplices / n_keys
    if sampling is Sampling.WINDOWS:  # a one-block fake of the last block (specs §6)
        return delta_window_row(config, d, accomplices, n_keys, trials, passed, audited, rejected,
                                unverified, honest_slashed, profit)  # fmt: skip
    p_exact = pass_probability_keys(accomplices, n_keys - accomplices, d)
    sd = math.sqrt(max(p_exact * (1 - p_exact), 1e-12) / trials)
    return {
        "v": v, "p": p_bps / 10_000, "a": a, "share": q, "accomplice_keys": accomplices, "keys": n_keys,
        "trials": trials,
        "passed": passed / trials, "pass_exact": p_exact, "pass_bound_many_keys": pass_probability(q, d),
        "within_3_sd": abs(passed / trials - p_exact) <= 3 * sd + 1e-12,
        "profit_per_step_R": profit / trials / reward,
        "profit_exact_R": expected_profit_keys(accomplices, n_keys - accomplices, d, reward, bond, GNK)
        / reward,
        "profit_many_keys_R": expected_profit(q, d, reward, bond, GNK) / reward,
        "audited": audited / trials,
    }  # fmt: skip


def delta_window_row(
    config: RunConfig, d: Defense, accomplices: int, n_keys: int, trials: int, passed: int, audited: int,
    rejected: int, unverified: int, honest_slashed: int, profit: int,
) -> dict[str, Any]:  # fmt: skip
    """A fake-Δ cell under windows: the fake meets only the check that ends at θ_H, so it is a
    one-block fake of the last block (`fake_blocks`, 2 in tolerance mode with a lone last segment),
    next to the exact `window_odds_keys` and the planner's many-keys `window_cheat`."""
    from gonka_diloco.plan import window_cheat

    w = config.window_len
    blocks = window_blocks(config.n_segments, w)
    fake = sum(config.window_reaches_end(b * w) for b in range(blocks))
    odds = window_odds_keys(accomplices, n_keys - accomplices, blocks, fake, d)
    reward, bond = config.stake.reward_per_outer_step, config.stake.min_host_stake
    q = accomplices / n_keys
    sd = math.sqrt(max(odds.passed * (1 - odds.passed), 1e-12) / trials)
    return {
        "v": d.v, "p": d.p, "a": d.audit_verifiers, "share": q, "accomplice_keys": accomplices,
        "keys": n_keys, "trials": trials, "fake_blocks": fake, "blocks": blocks,
        "passed": passed / trials, "pass_exact": odds.passed,
        "pass_bound_many_keys": window_cheat(blocks, fake, d.v, d.audit_verifiers, d.p, q).success,
        "within_3_sd": abs(passed / trials - odds.passed) <= 3 * sd + 1e-12,
        "rejected": rejected / trials, "rejected_exact": odds.rejected,
        "unverified": unverified / trials, "unverified_exact": odds.unverified,
        "honest_slashed": honest_slashed / trials, "honest_slashed_exact": odds.honest_slashed,
        "profit_per_step_R": profit / trials / reward,
        "profit_exact_R": window_expected_profit_keys(accomplices, n_keys - accomplices, blocks, fake, d,
                                                      reward, bond) / reward,
        "audited": audited / trials,
    }  # fmt: skip


# ---------------------------------------------------------------- sampling windows (issue 34)

WINDOW_FAKES: list[tuple[str, dict[str, Any]]] = [("lazy", {"fraction": 0.5}), ("one_fake", {"count": 1})]
"""The host adversaries of issue 34 that fake segments: `gonka_diloco.adversaries.hosts.LazyHost`."""
WINDOW_KEYS = [(N_KEYS, [round(q * N_KEYS) for q in SHARES]), (100, [0, 10, 20, 30, 40, 49, 50])]
"""(keys, accomplice counts): 10 keys as the fake-Δ table, and 100 to approach the many-keys limit."""


def window_faked(config: RunConfig, name: str, params: dict[str, Any], seed: int) -> set[int]:
    """The segments the adversary fakes: whole blocks, chosen by its own seed (so independent of the
    chain's draw). Imported here: the adversary library pulls in torch."""
    from gonka_diloco.adversaries.hosts import LazyHost

    return LazyHost(seed=seed, **params).faked(config, CHEATER, 0)


def window_cell(
    name: str, params: dict[str, Any], v: int, p_bps: int, a: int, accomplices: int, trials: int,
    n_keys: int = N_KEYS,
) -> dict[str, Any]:  # fmt: skip
    """One windows cell: seeded trials next to `window_odds_keys` (exact) and `window_cheat`."""
    from gonka_diloco.plan import window_cheat

    config = bench_config(v, p_bps, a, Sampling.WINDOWS)
    n, w = config.n_segments, config.window_len
    blocks = -(-n // w)
    d = Defense(v, p_bps, a, DEFAULT_STAKE.host_slash_bps, DEFAULT_STAKE.fraud_host_slash_bps,
                DEFAULT_STAKE.fraud_verifier_slash_bps)  # fmt: skip
    reward, bond = config.stake.reward_per_outer_step, config.stake.min_host_stake
    keys = ALL_KEYS[:n_keys]
    gang = set(keys[:accomplices])
    totals = dict.fromkeys(("passed", "audited", "rejected", "unverified", "honest_slashed", "profit"), 0)
    fake_blocks = set()
    for t in range(trials):
        faked = window_faked(config, name, params, t)
        fake_blocks.add(len({s // w for s in faked}))
        out = Trial(config, gang, f"w:{name}:{v}:{p_bps}:{a}:{accomplices}/{n_keys}:{t}", keys, faked).run()
        for k in totals:
            totals[k] += out[k]
    (fake,) = fake_blocks  # the adversary always packs the same count into whole blocks
    odds = window_odds_keys(accomplices, n_keys - accomplices, blocks, fake, d)
    q = accomplices / n_keys
    sd = math.sqrt(max(odds.passed * (1 - odds.passed), 1e-12) / trials)
    m = {k: x / trials for k, x in totals.items()}
    label = name + "".join(f" {k}={x}" for k, x in params.items())
    return {
        "adversary": label, "faked_segments": len(faked), "fake_blocks": fake, "blocks": blocks,
        "n_segments": n, "w": w, "v": v, "p": p_bps / 10_000, "a": a, "share": q,
        "accomplice_keys": accomplices, "keys": n_keys,
        "trials": trials, "passed": m["passed"], "pass_exact": odds.passed,
        "pass_planner": window_cheat(blocks, fake, v, a, p_bps / 10_000, q).success,
        "within_3_sd": abs(m["passed"] - odds.passed) <= 3 * sd + 1e-12,
        "rejected": m["rejected"], "rejected_exact": odds.rejected, "unverified": m["unverified"],
        "unverified_exact": odds.unverified, "honest_slashed": m["honest_slashed"],
        "honest_slashed_exact": odds.honest_slashed, "audited": m["audited"],
        "profit_per_step_R": m["profit"] / reward,
        "profit_exact_R": window_expected_profit_keys(accomplices, n_keys - accomplices, blocks, fake, d,
                                                      reward, bond) / reward,
    }  # fmt: skip


def main_windows(quick: bool = False) -> dict[str, Any]:
    """`--windows`: the fake-Δ table under windows, then the faked-segment cells."""
    trials = 200 if quick else 2000
    t0 = time.perf_counter()
    v, p, a = defaults()
    rows = [cell(cv, cp, ca, round(q * N_KEYS), trials, sampling=Sampling.WINDOWS)
            for cv, cp, ca in configs() for q in SHARES]  # fmt: skip
    rows += [cell(v, p, a, k, trials, n, Sampling.WINDOWS) for k, n in EXTRA]
    cells = [window_cell(name, params, v, p, a, k, trials if n == N_KEYS else trials // 2, n)
             for name, params in WINDOW_FAKES for n, gangs in WINDOW_KEYS for k in gangs]  # fmt: skip
    cfg = bench_config(v, p, a, Sampling.WINDOWS)
    result = {
        "quick": quick, "keys": N_KEYS, "trials_per_cell": trials, "sampling": "windows",
        "fake_delta_rule": "ends_at_theta_h",  # only the check ending at θ_H checks Δ (specs §6)
        "H": cfg.inner_steps, "k": cfg.segment_len, "w": cfg.window_len, "n_segments": cfg.n_segments,
        "blocks": window_blocks(cfg.n_segments, cfg.window_len), "rows": rows, "windows": cells,
        "fake_delta_within_3_sd": all(r["within_3_sd"] for r in rows),
        "windows_within_3_sd": all(r["within_3_sd"] for r in cells),
        "seconds": round(time.perf_counter() - t0, 1),
    }  # fmt: skip
    print(f"collusion under sampling windows: H = {result['H']}, k = {result['k']}, w = {result['w']} "
          f"(B = {result['blocks']} blocks), {trials} trials per cell (100 keys: {trials // 2})")  # fmt: skip
    print("a fake Δ (only the check that ends at θ_H checks Δ: a one-block fake of the last block): exact "
          "= window_odds_keys(A, H, B, 1), planner = window_cheat(B, 1, …)")  # fmt: skip
    print(f"{'v':>2} {'p':>4} {'a':>2} {'keys':>4} {'share':>6} {'fake passed':>12} {'exact':>8} "
          f"{'planner':>10} {'rejected':>9} {'exact':>8} {'profit/R':>9} {'exact':>8}")  # fmt: skip
    for r in rows:
        print(f"{r['v']:>2} {r['p']:>4.2f} {r['a']:>2} {r['keys']:>4} {r['share']:>6.0%} "
              f"{r['passed']:>12.2%} {r['pass_exact']:>8.2%} {r['pass_bound_many_keys']:>10.2%} "
              f"{r['rejected']:>9.2%} {r['rejected_exact']:>8.2%} "
              f"{r['profit_per_step_R']:>9.3f} {r['profit_exact_R']:>8.3f}")  # fmt: skip
    print(f"faked segments, v = {v}, p = {p / 10_000:g}, a = {a}: passed (exact, planner), host rejected "
          "(exact), honest verdicts slashed per step (exact), profit/R (exact)")  # fmt: skip
    for r in cells:
        print(f"{r['adversary']:<20} F={r['fake_blocks']:>2} {r['keys']:>4} {r['share']:>5.0%}  "
              f"{r['passed']:>7.2%} ({r['pass_exact']:>7.2%}, {r['pass_planner']:>7.2%})  "
              f"{r['rejected']:>7.2%} ({r['rejected_exact']:>7.2%})  "
              f"{r['honest_slashed']:>6.3f} ({r['honest_slashed_exact']:>6.3f})  "
              f"{r['profit_per_step_R']:>+7.3f} ({r['profit_exact_R']:>+7.3f})")  # fmt: skip
    out = RESULTS.with_name("collusion_windows.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"every cell within 3 sd of its exact formula: fake Δ {result['fake_delta_within_3_sd']}, "
          f"windows {result['windows_within_3_sd']}; wrote {out} ({result['seconds']} s)")  # fmt: skip
    return result


def defaults() -> tuple[int, int, int]:
    """(v, p in bps, a): the RunConfig defaults."""
    v, p, a = (DEFAULTS[f].default for f in ("verifiers_per_contribution", "audit_bps", "audit_verifiers"))
    return v, p, a


def configs() -> list[tuple[int, int, int]]:
    return [(1, 0, 1), (1, 5000, 1), (2, 5000, 1), PREVIOUS, defaults()]


# The cheapest (v, p, a) meeting both goals for each v ≤ 6 (p the smallest in 1% steps), the
# no-audit v = 7, and the defaults: how their verification work and deterrence compare.
ALTERNATIVES = [(6, 7200, 1), (5, 9100, 2), (4, 9700, 3), (7, 0, 1), (4, 10_000, 3)]


def max_reward_ratio(d: Defense) -> float:
    """The largest reward / host bond at which faking still loses money for every q < 1/2 (bisection;
    accomplice keys bonded at 1 GNK): how far the stake parameters may drift before collusion pays."""
    bond = DEFAULT_STAKE.min_host_stake
    lo, hi = 0.0, 1000.0
    for _ in range(50):
        mid = (lo + hi) / 2
        loses = all(expected_profit(q / 1000, d, round(mid * bond), bond, GNK) < 0 for q in range(1, 500))
        lo, hi = (mid, hi) if loses else (lo, mid)
    return lo


def alternatives() -> list[dict[str, Any]]:
    """Per setting: replays per contribution, the worst pass probability over every minority (bound,
    exact), the chance that a coalition's ACCEPT at q → 1/2 is then audited and overturned, and
    `max_reward_ratio` (formulas only: each is checked against trials in the table above)."""
    out = []
    for v, p, a in ALTERNATIVES:
        d = Defense(v, p, a, DEFAULT_STAKE.host_slash_bps, DEFAULT_STAKE.fraud_host_slash_bps,
                    DEFAULT_STAKE.fraud_verifier_slash_bps)  # fmt: skip
        w = every_minority(d, DEFAULT_STAKE.reward_per_outer_step, DEFAULT_STAKE.min_host_stake, GNK)
        out.append({
            "v": v, "p": p / 10_000, "a": a, "replays_per_contribution": round(v + p / 10_000 * a, 2),
            "pass_bound_sup": w["pass_bound_sup"], "pass_exact_max": w["pass_exact_max"],
            "accept_overturned_at_half": d.p * (1 - 0.5**a), "max_reward_per_host_bond": max_reward_ratio(d),
        })  # fmt: skip
    return out


def summary(v: int, p: int, a: int, rows: list[dict[str, Any]]) -> dict[str, Any]:
    d = Defense(v, p, a, DEFAULT_STAKE.host_slash_bps, DEFAULT_STAKE.fraud_host_slash_bps,
                DEFAULT_STAKE.fraud_verifier_slash_bps)  # fmt: skip
    mine = [r for r in rows if (r["v"], r["p"], r["a"]) == (v, p / 10_000, a)]
    worst = every_minority(d, DEFAULT_STAKE.reward_per_outer_step, DEFAULT_STAKE.min_host_stake, GNK)
    return {
        "v": v, "p": p / 10_000, "a": a, "max_share_fake_below_1pct": max_safe_share(d),
        "fake_below_1pct_at_shares": [r["share"] for r in mine if r["pass_exact"] <= 0.01],
        "profit_negative_at_all_shares": all(r["profit_exact_R"] < 0 for r in mine),
        "every_minority": worst,
        "fake_below_1pct_every_minority": max(worst["pass_bound_sup"], worst["pass_exact_max"]) <= 0.01,
        "profit_negative_every_minority": max(worst["profit_bound_max_R"], worst["profit_exact_max_R"]) < 0,
        "replays_per_contribution": v + p / 10_000 * a,
    }  # fmt: skip


def main(quick: bool = False) -> dict[str, Any]:
    trials = 200 if quick else 2000
    t0 = time.perf_counter()
    rows = [cell(v, p, a, round(q * N_KEYS), trials) for v, p, a in configs() for q in SHARES]
    v, p, a = defaults()
    rows += [cell(v, p, a, k, trials, n) for k, n in EXTRA]
    result = {
        "quick": quick, "keys": N_KEYS, "trials_per_cell": trials, "rows": rows,
        "defaults": {**summary(v, p, a, rows), "min_host_stake": DEFAULT_STAKE.min_host_stake,
                     "reward_per_outer_step": DEFAULT_STAKE.reward_per_outer_step,
                     "fraud_host_slash_bps": DEFAULT_STAKE.fraud_host_slash_bps,
                     "fraud_verifier_slash_bps": DEFAULT_STAKE.fraud_verifier_slash_bps},
        "previous_defaults": summary(*PREVIOUS, rows),
        "alternatives": alternatives(),
        "seconds": round(time.perf_counter() - t0, 1),
    }  # fmt: skip
    print(f"collusion: {N_KEYS} equal-stake verifier keys, {trials} trials per cell, smart coalition")
    head = f"{'v':>2} {'p':>4} {'a':>2} {'keys':>4} {'share':>6} {'fake passed':>12} {'exact':>8} " \
           f"{'q^v bound':>10} {'profit/R':>9} {'exact':>8}"  # fmt: skip
    print(head)
    for r in rows:
        print(f"{r['v']:>2} {r['p']:>4.2f} {r['a']:>2} {r['keys']:>4} {r['share']:>6.0%} "
              f"{r['passed']:>12.2%} {r['pass_exact']:>8.2%} {r['pass_bound_many_keys']:>10.2%} "
              f"{r['profit_per_step_R']:>9.3f} {r['profit_exact_R']:>8.3f}")  # fmt: skip
    for name in ("previous_defaults", "defaults"):
        dd = result[name]
        w = dd["every_minority"]
        met = dd["fake_below_1pct_every_minority"] and dd["profit_negative_every_minority"]
        worst_profit = max(w["profit_bound_max_R"], w["profit_exact_max_R"])
        print(f"{name} v={dd['v']} p={dd['p']} a={dd['a']} ({dd['replays_per_contribution']:g} replays per "
              f"contribution): fake ≤ 1% up to q = {dd['max_share_fake_below_1pct']:.1%} (bound); over every "
              f"minority fake ≤ {w['pass_bound_sup']:.2%} (bound) / {w['pass_exact_max']:.2%} (exact, "
              f"≤ {w['max_keys']} keys), profit ≤ {worst_profit:.3f} R: both goals met = {met}")  # fmt: skip
    print("alternatives (formulas): v p a, replays, worst pass bound / exact, "
          "P(accept overturned | q → 1/2), max reward / host bond")  # fmt: skip
    for x in result["alternatives"]:
        print(f"  {x['v']} {x['p']:.2f} {x['a']}  {x['replays_per_contribution']:>5}  "
              f"{x['pass_bound_sup']:.2%} / {x['pass_exact_max']:.2%}  "
              f"{x['accept_overturned_at_half']:.1%}  {x['max_reward_per_host_bond']:.1f}")  # fmt: skip
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {RESULTS} ({result['seconds']} s)")
    return result


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="200 trials per cell instead of 2000")
    ap.add_argument(
        "--windows", action="store_true", help="sampling windows (issue 34): collusion_windows.json"
    )
    args = ap.parse_args()
    main_windows(quick=args.quick) if args.windows else main(quick=args.quick)
