"""Collusion benchmark: does a fake Δ reach the model when the cheater's accomplices hold a share
q of the verifier stake, and does faking pay? Seeded trials on the chain's state machine next to
the exact formula (`protocol.collusion`).

Each trial is a fresh chain: one cheating host, N = 10 verifier keys of equal stake of which
A = q·N are accomplices, one outer step of the real module (stake-weighted draws, audit lottery
from a post-verdict seed, disputes decided by verifier stake, fraud slashes, rewards only for Δs
that reach the model). The coalition plays its best strategy: an accomplice ACCEPTs only when
every verifier drawn in its stage (initial, audit) is an accomplice, and REJECTs otherwise or on a
dispute panel (no accomplice ever contradicts a dispute it cannot win); honest verifiers REJECT
the fake. The cheater's profit per outer step = reward received − its slash − its accomplices'
slashes, in units of the reward R.

    .venv/bin/python -m bench.collusion [--quick]

Prints the table and writes bench/results/collusion.json. A measurement, not a test.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import time
from pathlib import Path
from typing import Any

from cosmpy.crypto.address import Address

from chain.genesis import Genesis, genesis_state
from chain.module import BlockContext, TxContext, begin_block, end_block, process_msg
from chain.params import Phase, Review
from chain.state import ChainState, Contribution
from protocol import merkle
from protocol.collusion import (
    Defense,
    expected_profit,
    expected_profit_keys,
    max_safe_share,
    pass_probability,
    pass_probability_keys,
)
from protocol.config import Codec, ModelSpec, Phases, RunConfig, Stake
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

RESULTS = Path(__file__).parent / "results" / "collusion.json"
GNK = 10**9
N_KEYS = 10
SHARES = [i / N_KEYS for i in range(6)]  # 0 %, 10 %, …, 50 % of the verifier stake
DEFAULTS = RunConfig.model_fields
DEFAULT_STAKE = Stake()


def _addr(name: str) -> str:
    return str(Address(hashlib.sha256(name.encode()).digest()[:20], prefix="gonka"))


def _h(*parts: object) -> str:
    return hashlib.sha256(":".join(map(str, parts)).encode()).hexdigest()


AUTHORITY = _addr("collusion authority")
CHEATER = _addr("collusion cheater")
KEYS = [_addr(f"collusion verifier {i}") for i in range(N_KEYS)]
ENV = EnvFingerprint(torch_version="2.13.0", threads=1)


def bench_config(v: int, audit_bps: int, audit_verifiers: int) -> RunConfig:
    """The run defaults' stake and slashing, short phases (they do not change any probability)."""
    return RunConfig(
        model=ModelSpec(factory="trainer.model:tiny"), dataset_manifest_hash=_h("data"),
        initial_model_hash=_h("g0"), inner_steps=4, segment_len=2, sampled_segments=1,
        verifiers_per_contribution=v, audit_bps=audit_bps, audit_verifiers=audit_verifiers,
        batch_size=2, seq_len=8, codec=Codec.INT8, max_outer_steps=1,
        phases=Phases(join_blocks=1, train_blocks=1, reveal_blocks=1, verify_blocks=1, escalation_blocks=1,
                      max_escalations=0, audit_blocks=1, confirm_blocks=1, result_blocks=1, result_rounds=1,
                      epoch_length=10**6),
        stake=DEFAULT_STAKE,
    )  # fmt: skip


class Trial:
    """One outer step of one cheater against N keys, A of them accomplices, on the module itself."""

    def __init__(self, config: RunConfig, accomplices: set[str], seed: str) -> None:
        funded = dict.fromkeys([AUTHORITY, CHEATER, *KEYS], 1000 * GNK)
        self.state: ChainState = genesis_state(
            Genesis(authority=AUTHORITY, accounts=funded, reward_pool=10**6 * GNK)
        )
        self.config, self.accomplices, self.seed = config, accomplices, seed
        self.height = 0
        self.leaves = [hashlib.sha256(f"{seed}:{i}".encode()).digest() for i in range(config.n_segments + 1)]

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
        if verifier not in self.accomplices or c.review == Review.CONFIRM:
            return Reason.REPLAY_MISMATCH
        stage = c.verifier_rounds[verifier]
        same_stage = [x for x, r in c.verifier_rounds.items() if r == stage]
        return Reason.ACCEPT if all(x in self.accomplices for x in same_stage) else Reason.REPLAY_MISMATCH

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
            lv = self.leaves
            openings = [SegmentOpening(segment=j, start_leaf=lv[j].hex(), end_leaf=lv[j + 1].hex(),
                                       proof=[p.hex() for p in merkle.pair_proof(lv, j)])
                        for j in c.sampled_segments]  # fmt: skip
            msgs.append(MsgRevealContribution(creator=CHEATER, run_id=1, outer_step=0,
                                              openings=openings))  # fmt: skip
        if step.phase in (Phase.REVEAL, Phase.VERIFY, Phase.AUDIT, Phase.CONFIRM) and c.outcome is None:
            for v in sorted(c.verifier_rounds):
                if v not in c.verdicts and (c.reveal_height is not None or msgs):
                    vote = MsgSubmitVerdict(creator=v, run_id=1, outer_step=0, host=CHEATER,
                                            reason=self.vote(v, c), evidence_hash=_h("ev", v))  # fmt: skip
                    msgs.append(vote)
        if step.phase == Phase.AWAITING_RESULT and CHEATER not in step.result_votes:
            poisoned = _h("poisoned")
            msgs.append(MsgSubmitOuterResult(creator=CHEATER, run_id=1, outer_step=0, model_hash=poisoned))
        return msgs

    def run(self) -> dict[str, Any]:
        stakes = dict.fromkeys(KEYS, GNK)
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
        slashed = sum(GNK - run.participants[k].stake for k in self.accomplices if k in run.participants)
        return {
            "passed": run.global_model_hash == _h("poisoned"),
            "audited": c.audited,
            "profit": c.reward - c.slashed - slashed,
        }


def cell(v: int, p_bps: int, a: int, accomplices: int, trials: int) -> dict[str, Any]:
    config = bench_config(v, p_bps, a)
    d = Defense(v, p_bps, a, DEFAULT_STAKE.host_slash_bps, DEFAULT_STAKE.fraud_host_slash_bps,
                DEFAULT_STAKE.fraud_verifier_slash_bps)  # fmt: skip
    reward, bond = config.stake.reward_per_outer_step, config.stake.min_host_stake
    gang = set(KEYS[:accomplices])
    passed = audited = 0
    profit = 0
    for t in range(trials):
        out = Trial(config, gang, f"{v}:{p_bps}:{a}:{accomplices}:{t}").run()
        passed += out["passed"]
        audited += out["audited"]
        profit += out["profit"]
    q = accomplices / N_KEYS
    p_exact = pass_probability_keys(accomplices, N_KEYS - accomplices, d)
    sd = math.sqrt(max(p_exact * (1 - p_exact), 1e-12) / trials)
    return {
        "v": v, "p": p_bps / 10_000, "a": a, "share": q, "accomplice_keys": accomplices, "trials": trials,
        "passed": passed / trials, "pass_exact": p_exact, "pass_bound_many_keys": pass_probability(q, d),
        "within_3_sd": abs(passed / trials - p_exact) <= 3 * sd + 1e-12,
        "profit_per_step_R": profit / trials / reward,
        "profit_exact_R": expected_profit_keys(accomplices, N_KEYS - accomplices, d, reward, bond, GNK)
        / reward,
        "profit_many_keys_R": expected_profit(q, d, reward, bond, GNK) / reward,
        "audited": audited / trials,
    }  # fmt: skip


def configs() -> list[tuple[int, int, int]]:
    v, p, a = (DEFAULTS[f].default for f in ("verifiers_per_contribution", "audit_bps", "audit_verifiers"))
    return [(1, 0, 1), (1, 5000, 1), (2, 5000, 1), (v, p, a), (4, 10_000, 2)]


def main(quick: bool = False) -> dict[str, Any]:
    trials = 200 if quick else 2000
    t0 = time.perf_counter()
    rows = [cell(v, p, a, round(q * N_KEYS), trials) for v, p, a in configs() for q in SHARES]
    v, p, a = configs()[3]
    d = Defense(v, p, a)
    default_rows = [r for r in rows if (r["v"], r["p"], r["a"]) == (v, p / 10_000, a)]
    result = {
        "quick": quick, "keys": N_KEYS, "trials_per_cell": trials, "rows": rows,
        "defaults": {"v": v, "p": p / 10_000, "a": a, "min_host_stake": DEFAULT_STAKE.min_host_stake,
                     "reward_per_outer_step": DEFAULT_STAKE.reward_per_outer_step,
                     "fraud_host_slash_bps": DEFAULT_STAKE.fraud_host_slash_bps,
                     "fraud_verifier_slash_bps": DEFAULT_STAKE.fraud_verifier_slash_bps,
                     "max_share_fake_below_1pct": max_safe_share(d),
                     "fake_below_1pct_at_shares": [r["share"] for r in default_rows
                                                   if r["pass_exact"] <= 0.01],
                     "profit_negative_at_all_shares": all(r["profit_exact_R"] < 0 for r in default_rows),
                     "replays_per_contribution": v + p / 10_000 * a},
        "seconds": round(time.perf_counter() - t0, 1),
    }  # fmt: skip
    print(f"collusion: {N_KEYS} equal-stake verifier keys, {trials} trials per cell, smart coalition")
    head = f"{'v':>2} {'p':>4} {'a':>2} {'share':>6} {'fake passed':>12} {'exact':>8} {'q^v bound':>10} " \
           f"{'profit/R':>9} {'exact':>8}"  # fmt: skip
    print(head)
    for r in rows:
        print(f"{r['v']:>2} {r['p']:>4.2f} {r['a']:>2} {r['share']:>6.0%} {r['passed']:>12.2%} "
              f"{r['pass_exact']:>8.2%} {r['pass_bound_many_keys']:>10.2%} {r['profit_per_step_R']:>9.3f} "
              f"{r['profit_exact_R']:>8.3f}")  # fmt: skip
    dd = result["defaults"]
    print(f"defaults v={v} p={p / 10_000} a={a}: fake ≤ 1% of steps for accomplice shares up to "
          f"{dd['max_share_fake_below_1pct']:.1%} (many-keys bound); "
          f"profit negative at every share ≤ 50%: "
          f"{dd['profit_negative_at_all_shares']}")  # fmt: skip
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {RESULTS} ({result['seconds']} s)")
    return result


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="200 trials per cell instead of 2000")
    main(quick=ap.parse_args().quick)
