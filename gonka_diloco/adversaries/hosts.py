"""Dishonest hosts: every way we know to get paid without doing (or while sabotaging) the work.

Each adversary is a `trainer.behaviour.HostBehaviour` that overrides the hook its attack needs
(`make_contribution`, `commit_messages`, `should_reveal`, `serve_blob`, `finalized`,
`result_vote`, `report_unavailable`). Forging uses the host's
own building blocks (the same step, store, codec and Merkle tree), so a forged contribution is
exactly as well-formed as an honest one except where the attack lies — which is what the verifier
must find.

| name          | what it does                                                  | caught by            |
|---------------|---------------------------------------------------------------|----------------------|
| noise         | trains honestly, commits a random Δ                           | DELTA_MISMATCH (w)   |
| zero          | free rider: no training, all leaves = start, Δ = 0            | REPLAY_MISMATCH      |
| scaled        | trains honestly, commits Δ × factor (10)                      | DELTA_MISMATCH (w)   |
| sign_flip     | trains honestly, commits −Δ                                   | DELTA_MISMATCH (w)   |
| lazy          | skips a fraction f of segments, extrapolates their end states | REPLAY_MISMATCH (p)  |
|               | (windows: whole blocks, the fewest the fraction fits in)      |                      |
| one_fake      | skips exactly one segment                                     | REPLAY_MISMATCH (p)  |
| last_fake     | skips the last segment: a made-up θ_H and the Δ matching it   | REPLAY_MISMATCH (w)  |
| wrong_data    | trains on another host's PRF batches                          | REPLAY_MISMATCH      |
| stale         | no training: re-commits its Δ of an earlier outer step        | REPLAY_MISMATCH      |
| copycat       | no training: commits a peer's Δ of the previous outer step    | REPLAY_MISMATCH      |
| no_reveal     | commits, then reveals nothing (or reveals but serves nothing) | chain / MISSING_DATA |
| malformed     | serves a zstd bomb, wrong shapes, NaN Δ or garbage state      | MALFORMED_BLOB (1)   |
| equivocation  | sends a second, different commit for the same outer step      | chain (EQUIVOCATED)  |
| bad_tokens    | trains honestly, claims more tokens than H × batch × seq_len  | BAD_TOKENS           |
| forged_env    | free rider claiming a GPU class no verifier has               | abstain (unverified) |
| moment_steer  | params exact, AdamW moments rewritten at every boundary       | REPLAY_MISMATCH      |
| budget_steer  | tolerance mode: every boundary moved by a fraction of every   | REPLAY_MISMATCH (4)  |
|               | threshold, one way (exp_avg where exp_avg_sq = 0: lr·m/ε)     |                      |
| withhold      | trains honestly, serves its verifiers, then refuses its Δ     | (2)                  |
| forge_result  | withholds its Δ and votes for a G_{n+1} it made up            | (2), vote never wins |
| silent_after_accept | honest until accepted, then serves, votes, commits nothing | (2)            |
| loss_liar     | honest work and vote; the vote's validation loss × factor     | report (5)           |
| eager         | overlapped runs: starts from its base − its own unverified Δ  | DELTA_MISMATCH (3)   |
| wrong_start   | eager runs: a start other than the rule's (forged stand-in Δ, | WRONG_START /        |
|               | parent ignored, or own Δ used without a parent)               | DELTA_MISMATCH       |

(1) a bad Δ only in tolerance mode: a bitwise verifier whose check ends at θ_H derives Δ from its
own replay and serves its copy to the aggregators (an availability attack then); the others keep
the committed payload by its hash, which a bomb would not match.

(w) sampling windows: by the check whose window ends at θ_H only (specs §6), like a fake of the
last segment (a θ_H committed to match the fake Δ, which no window short of θ_H ever caught): a
one-block fake of the last block, caught in (v + p·a)/B of outer steps.

(2) honest work, accepted by its verifiers; the attack is on availability and the result vote. The
verifiers that checked it keep and serve its Δ, so hosts fetch it from them and the withholding
hurts nobody: the step's result is adopted by the honest majority, the forged vote never (a lone
vote is a minority). Only where nobody else holds the Δ (e.g. its only verifier was lazy and
never derived it) do the honest hosts report it unavailable: it is dropped (`withheld`) and
slashed, and the result is asked again over the rest.

(3) its Δ is measured from where it started, not from the base: a bitwise verifier derives
G_base − θ_H and finds another hash; WRONG_START when segment 0 is opened. Measuring Δ from the base
instead makes it a one-segment fake (segment 0's start), caught when segment 0 is sampled: the
lazy host's bound, (s − 1)/(n − 1) per step.

(4) by the update-space check of tolerance mode (specs §6); the group norms alone accept it. With
`target="update"` it stays within every per-segment check and, spending 0.9 of the run's
thresholds over summed segments too (specs §6.4), within every check: accepted, what it can
steer then is `bench.steering`'s figure (RESULTS.md); `cumulative=False` spends the per-segment
budgets at every boundary, which the cumulative check rejects; `cancel=True` moves every boundary
by one δ and θ_H by −(s−1)·δ, so that every challenge's sum with the always-opened last segment
cancels (issue 36), which summing the drawn segments apart rejects; `lone=True` spends θ_H's whole
per-segment budget, as a lone last window (n mod w = 1) alone would allow, which the window before
it rejects: in tolerance mode it replays on into the lone last segment and sums the run.

(5) the loss a vote carries decides nothing on chain; `gonka-diloco report` takes the median over
the votes for the adopted model and names every voter whose value differs from it (honest hosts
of one replay class agree exactly), so a minority of liars neither moves the reported loss nor
goes unnamed.

`forged_env` is contained rather than caught in bitwise mode (no verifier of its claimed class,
so no verdict: `unverified`, never in the model, never paid); in tolerance mode: REPLAY_MISMATCH.

`stale` and `copycat` fake a consistent trajectory (θ_H = G_n − Δ_copied, boundaries
interpolated), so the Δ check alone would pass: replay of the always-opened last segment fails.
"""

from __future__ import annotations

import dataclasses
import hashlib
import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import zstandard
from torch import Tensor

from gonka_diloco.adversaries.sparse import EF_FORGERS
from gonka_diloco.adversaries.steer import (
    CANCELS,
    TARGETS,
    WHERE,
    cancel_move,
    cancel_plan,
    make_genuine,
    moved_params,
    steer_boundary,
)
from nodekit.errorfeedback import start_ef
from nodekit.statestore import clone_state
from protocol import codecs
from protocol.config import Moments, ReplayMode, RunConfig
from protocol.messages import EnvFingerprint, MsgCommitPseudoGradient
from protocol.moments import as_fp32, as_int8
from protocol.prf import window, window_blocks
from replay.step import State, TrainJob, load_training_state, train_segment, training_hash, training_state
from trainer.behaviour import HostBehaviour, OuterContext
from trainer.commit import TrainedStep, run_committed

PARAM = "param/"


def start_state(ctx: OuterContext) -> State:
    """The step's start params (G_n; an eager run's start) with the host's carried optimizer state:
    where every honest trajectory starts."""
    start = ctx.start
    with torch.no_grad():
        for n, p in ctx.model.named_parameters():
            p.copy_(start[n])
    return clone_state(training_state(ctx.model, ctx.inner_optimizer))


def assemble(ctx: OuterContext, states: list[State], losses: list[float] | None = None) -> TrainedStep:
    """A contribution from hand-made boundary states, each saved so it can be served like real ones."""
    if len(states) != ctx.cfg.n_segments + 1:
        raise ValueError(f"need {ctx.cfg.n_segments + 1} boundary states, got {len(states)}")
    leaves = []
    for st in states:
        h = training_hash(st, ctx.cfg.state_chunk_bytes)
        ctx.store.put_hashed(st, ctx.outer_step, h)
        leaves.append(h)
    return ctx.assemble(leaves, states[-1], losses or [])


def _advance_step(st: State, k: int) -> State:
    out = dict(st)
    out["step"] = st["step"] + float(k)
    return out


def interpolated(ctx: OuterContext, target_params: Mapping[str, Tensor]) -> list[State]:
    """Boundaries on the straight line from the start to `target_params`, step counter advanced."""
    start = start_state(ctx)
    n = ctx.cfg.n_segments
    out = [start]
    for j in range(1, n + 1):
        st = _advance_step(start, j * ctx.cfg.segment_len)
        for name, target in target_params.items():
            a = start[PARAM + name]
            st[PARAM + name] = a + (target - a) * (j / n)
        out.append(st)
    return out


def _seeded_gen(*parts: object) -> torch.Generator:
    seed = int.from_bytes(hashlib.sha256(":".join(map(str, parts)).encode()).digest()[:8], "big") >> 1
    return torch.Generator().manual_seed(seed)


class HostAdversary(HostBehaviour):
    """An honest host unless a subclass overrides a hook; `expected` is what a verifier must answer."""

    name = "honest"
    expected: tuple[str, ...] = ("ACCEPT",)  # Reason names a verifier answers (tests, bench)
    chain_outcome = "accepted"  # chain.params.Outcome once finalized
    honest_work = False
    """True: the contribution is honest work, so verifiers rightly accept it; the attack is on
    what comes after (serving, the result vote). The devnet report judges these by the result."""
    trains_ahead = False

    def __init__(self, **params: Any) -> None:
        super().__init__()  # params are explicit keyword arguments of each subclass instead
        if params:
            raise TypeError(f"{self.name} takes no parameters, got {sorted(params)}")


def _stored(state: State, cfg: RunConfig) -> State:
    """A state whose moments an adversary rewrote as floats (`as_fp32`), in the run's moment format
    again: int8 codes where the run keeps int8 moments (a bitwise run's default), else as it is."""
    return as_int8(state) if cfg.inner.moments is Moments.INT8 else state


class NoiseDelta(HostAdversary):
    """Trains honestly, commits random noise as its Δ."""

    name = "noise"
    expected = ("DELTA_MISMATCH",)
    chain_outcome = "rejected"

    def __init__(self, scale: float = 1e-3, seed: int = 0) -> None:
        super().__init__()
        self.scale, self.seed = float(scale), seed

    def make_contribution(self, ctx: OuterContext) -> TrainedStep:
        c = ctx.train()
        g = _seeded_gen("noise", self.seed, ctx.address, ctx.outer_step)
        noise = {n: torch.randn(t.shape, generator=g) * self.scale for n, t in sorted(c.delta.items())}
        return ctx.with_delta(c, noise)


class ZeroDelta(HostAdversary):
    """Free rider: trains nothing, claims it stayed at G_n (Δ = 0, consistent with its leaves)."""

    name = "zero"
    expected = ("REPLAY_MISMATCH",)
    chain_outcome = "rejected"

    def make_contribution(self, ctx: OuterContext) -> TrainedStep:
        return assemble(ctx, [start_state(ctx)] * (ctx.cfg.n_segments + 1))


class ScaledDelta(HostAdversary):
    """Trains honestly, commits Δ × factor (pushes the global model harder than its share)."""

    name = "scaled"
    expected = ("DELTA_MISMATCH",)
    chain_outcome = "rejected"

    def __init__(self, factor: float = 10.0) -> None:
        super().__init__()
        self.factor = float(factor)

    def make_contribution(self, ctx: OuterContext) -> TrainedStep:
        c = ctx.train()
        return ctx.with_delta(c, {n: t * self.factor for n, t in c.delta.items()})


class SignFlipDelta(HostAdversary):
    """Trains honestly, commits −Δ (undoes everyone else's progress). `steps`: only in these outer
    steps (honest in the others); None = every step."""

    name = "sign_flip"
    expected = ("DELTA_MISMATCH",)
    chain_outcome = "rejected"

    def __init__(self, steps: Sequence[int] | None = None) -> None:
        super().__init__()
        self.steps = None if steps is None else {int(n) for n in steps}

    def make_contribution(self, ctx: OuterContext) -> TrainedStep:
        c = ctx.train()
        if self.steps is not None and ctx.outer_step not in self.steps:
            return c
        return ctx.with_delta(c, {n: -t for n, t in c.delta.items()})


class LazyHost(HostAdversary):
    """Skips a fraction f of its segments and extrapolates their end states from the last real one.

    Its made-up moments are kept within what a genuine AdamW state can look like (|m̂| ≤ C(t)·
    (√v̂ + ε), specs §6.3; the verifier checks every start it fetches), so only replay tells.
    It fakes the segments least likely to be checked, chosen by its own seed:
    - sampling windows (specs §2.3): every block of w segments is equally likely to be a slot's
      window, so it packs m = round(f · n) faked segments into the fewest blocks, whole blocks
      first (the last one too: it is not special any more). Caught when a drawn block holds one:
      1 − C(B − F, x) / C(B, x) for F faked of B blocks and x drawn;
    - sampling segments: the last segment is always opened, so it fakes m = round(f · (n − 1)) of
      the other n − 1: 1 − C(n−1−m, s−1) / C(n−1, s−1) ≈ 1 − (1 − f)^(s−1).
    `count` fakes exactly that many segments instead of a fraction (`one_fake`: count = 1).
    """

    name = "lazy"
    expected = ("REPLAY_MISMATCH",)
    chain_outcome = "rejected"

    def __init__(self, fraction: float = 0.5, seed: int = 0, count: int | None = None) -> None:
        super().__init__()
        if not 0.0 <= float(fraction) <= 1.0:
            raise ValueError("fraction must be in [0, 1]")
        if count is not None and int(count) < 0:
            raise ValueError("count must be >= 0")
        self.fraction, self.seed = float(fraction), seed
        self.count = None if count is None else int(count)

    def faked(self, cfg: RunConfig, host: str, outer_step: int) -> set[int]:
        n = cfg.n_segments
        key = f"{self.seed}:{host}:{outer_step}"

        def keyed(j: int) -> bytes:
            return hashlib.sha256(f"{key}:{j}".encode()).digest()

        if cfg.windowed:
            m = min(n, self.count if self.count is not None else round(self.fraction * n))
            w = cfg.window_len
            blocks = sorted(range(window_blocks(n, w)), key=lambda b: (-len(window(b * w, n, w)), keyed(b)))
            return set([s for b in blocks for s in window(b * w, n, w)][:m])
        m = min(n - 1, self.count if self.count is not None else round(self.fraction * (n - 1)))
        return set(sorted(range(n - 1), key=keyed)[:m])

    def make_contribution(self, ctx: OuterContext) -> TrainedStep:
        cfg, k = ctx.cfg, ctx.cfg.segment_len
        fake = self.faked(cfg, ctx.address, ctx.outer_step)
        job = TrainJob(cfg, ctx.data, ctx.address, ctx.outer_step, loss_fn=ctx.loss_fn)
        prev = cur = start_state(ctx)
        states = [cur]
        losses: list[float] = []
        for j in range(cfg.n_segments):
            if j in fake:  # θ_{j+1} = θ_j + (θ_j − θ_{j−1}): the last real progress, repeated
                now, before = as_fp32(cur), as_fp32(prev)  # int8 moments: extrapolated as floats
                nxt = _advance_step(now, k)
                for name, t in now.items():
                    if name != "step":  # second moments stay non-negative, or AdamW's sqrt gives NaN
                        x = t + (t - before[name])
                        nxt[name] = x.clamp_min(0) if name.startswith("exp_avg_sq/") else x
                nxt = make_genuine(nxt, cfg.inner)  # moments AdamW can produce (specs §6.3)
                nxt = _stored(nxt, cfg)
                load_training_state(ctx.model, ctx.inner_optimizer, nxt)
            else:
                losses += train_segment(job, ctx.model, ctx.inner_optimizer, j * k, k)
                nxt = clone_state(training_state(ctx.model, ctx.inner_optimizer))
            prev, cur = cur, nxt
            states.append(cur)
        return assemble(ctx, states, losses)


class OneSegmentFake(LazyHost):
    """Fakes exactly one segment (extrapolated, genuine-looking moments, like `lazy`): the cheapest
    fake there is. Caught only in the outer steps whose draw covers it: (v + p·a)/B with windows
    (every block equally likely), (s − 1)/(n − 1) with segment sampling (never the last)."""

    name = "one_fake"

    def __init__(self, seed: int = 0) -> None:
        super().__init__(seed=seed, count=1)


class LastSegmentFake(LazyHost):
    """Fakes the last segment alone: an end state θ_H it made up (extrapolated, like `lazy`) and the
    Δ that matches it — a fake Δ with a θ_H to match. No check whose window ends short of θ_H can
    tell, whether or not it fetches θ_H; only a replay of segment n − 1 does (specs §6), so under
    windows it is caught in (v + p·a)/B of outer steps, like a fake Δ; with segment sampling by
    every check (the last segment is always opened)."""

    name = "last_fake"

    def __init__(self) -> None:
        super().__init__(count=1)

    def faked(self, cfg: RunConfig, host: str, outer_step: int) -> set[int]:
        return {cfg.n_segments - 1}


class WrongData(HostAdversary):
    """Trains for real, but on batches the PRF did not assign (another address's shard and draws)."""

    name = "wrong_data"
    expected = ("REPLAY_MISMATCH",)
    chain_outcome = "rejected"

    def __init__(self, other_host: str = "gonka1wrongdata") -> None:
        super().__init__()
        self.other_host = other_host

    def make_contribution(self, ctx: OuterContext) -> TrainedStep:
        return ctx.train(host=self.other_host)


def _copy_payload(ctx: OuterContext, payload: bytes) -> TrainedStep:
    """Claim θ_H = G_n − Δ_copied with interpolated boundaries, and commit the copied payload."""
    copied = codecs.decode(payload, ctx.global_model.layout)
    target = {n: ctx.global_model.params[n] - copied[n] for n in ctx.global_model.params}
    c = assemble(ctx, interpolated(ctx, target))
    return ctx.with_payload(c, payload, copied)


class StaleDelta(HostAdversary):
    """Re-submits its own Δ of an earlier outer step, on a trajectory faked to be consistent with it."""

    name = "stale"
    expected = ("REPLAY_MISMATCH",)
    chain_outcome = "rejected"

    def __init__(self) -> None:
        super().__init__()
        self.history: dict[int, bytes] = {}

    def make_contribution(self, ctx: OuterContext) -> TrainedStep:
        earlier = [n for n in self.history if n < ctx.outer_step]
        if not earlier:  # nothing to re-submit yet: works honestly once
            c = ctx.train()
            self.history[ctx.outer_step] = c.payload
            return c
        return _copy_payload(ctx, self.history[max(earlier)])


class Copycat(HostAdversary):
    """Submits a peer's accepted Δ of the previous outer step (those blobs are public)."""

    name = "copycat"
    expected = ("REPLAY_MISMATCH",)
    chain_outcome = "rejected"

    def make_contribution(self, ctx: OuterContext) -> TrainedStep:
        offline: Mapping[str, bytes] = ctx.extra.get("peer_payloads", {})  # benches without a network
        peers = sorted(h for h in offline if h != ctx.address)
        if peers:
            return _copy_payload(ctx, offline[peers[0]])
        entries = sorted((e for e in ctx.previous_accepted if e.host != ctx.address), key=lambda e: e.host)
        if not entries:
            return ctx.train()
        return _copy_payload(ctx, ctx.fetch_delta(entries[0]))


class NoReveal(HostAdversary):
    """Commits, then `mode="chain"` never reveals; `mode="serve"` reveals but serves nothing."""

    name = "no_reveal"
    expected = ("MISSING_DATA",)
    chain_outcome = "missing_reveal"

    def __init__(self, mode: str = "chain") -> None:
        super().__init__()
        if mode not in ("chain", "serve"):
            raise ValueError("mode must be 'chain' or 'serve'")
        self.mode = mode
        if mode == "serve":
            self.chain_outcome = "rejected"

    def should_reveal(self, contribution: TrainedStep, ctx: OuterContext) -> bool:
        return self.mode != "chain"

    def serve_blob(self, kind: str, blob_hash: str, data: bytes) -> bytes | None:
        return None if kind in ("state", "delta") else data


MALFORMED_KINDS = ("zstd_bomb", "wrong_shapes", "nan", "garbage_state")
GARBAGE_SAFETENSORS = b"\x08\x00\x00\x00\x00\x00\x00\x00" + b'{"a":1}'


class LateReveal(HostAdversary):
    """Honest work, revealed late: its reveal lands `blocks` blocks after the reveal deadline (a
    loaded machine, a jittery link; or a cheater stalling its verifiers). Inside the grace
    (`reveal_closes`, half the verify window) it is judged like any reveal: accepted, paid, not
    slashed. Past it the chain refuses the reveal, and the commitment ends `missing_reveal`,
    slashed: what a host that hides its openings after seeing its challenge gets."""

    name = "late_reveal"
    honest_work = True

    def __init__(self, blocks: int = 1) -> None:
        super().__init__()
        if blocks < 1:
            raise ValueError(f"blocks must be >= 1 (0 is on time), got {blocks}")
        self.blocks = blocks

    def should_reveal(self, contribution: TrainedStep, ctx: OuterContext) -> bool:
        target = ctx.chain.outer_step(ctx.run_id, ctx.outer_step)["reveal_deadline"] + self.blocks
        height = ctx.chain.height()
        while height + 1 < target:  # the reveal tx lands in the block after the one we saw
            height = ctx.chain.wait_for_block(height, timeout=600).height
        return True


class MalformedBlob(HostAdversary):
    """Commits honestly, then serves a Δ (zstd bomb, wrong shapes, NaN) or state that must not decode."""

    name = "malformed"
    expected: tuple[str, ...] = ("MALFORMED_BLOB",)
    chain_outcome = "rejected"

    def __init__(self, kind: str = "zstd_bomb") -> None:
        super().__init__()
        if kind not in MALFORMED_KINDS:
            raise ValueError(f"kind must be one of {MALFORMED_KINDS}")
        self.kind = kind
        if kind != "garbage_state":  # a bitwise verifier derives Δ from its replay and never downloads
            self.expected = ("ACCEPT", "MALFORMED_BLOB")  # it (and serves its own copy); tolerance does
            self.chain_outcome = "accepted"

    def serve_blob(self, kind: str, blob_hash: str, data: bytes) -> bytes | None:
        if self.kind == "garbage_state":
            return GARBAGE_SAFETENSORS if kind == "state" else data
        if kind != "delta":
            return data
        return malformed_delta_blob(data, self.kind)  # nodes serve the committed payload itself


def malformed_delta_blob(payload: bytes, kind: str) -> bytes:
    """A hostile Δ blob built from the real payload, so only the attacked property is wrong."""
    h = codecs.read_header(payload)
    head = payload[: h.header_len]
    if kind == "zstd_bomb":  # the real header, then frames that inflate to 128 MiB of zeros
        frame = zstandard.ZstdCompressor(level=19, write_content_size=False).compress(b"\x00" * (16 << 20))
        return head + frame * 8
    if kind == "wrong_shapes":  # a well-formed payload for a model that is not this one
        return codecs.to_blob(codecs.encode({"bogus": torch.zeros(3, 5)}, h.codec, h.block_size or 8))
    if kind == "nan":  # the real payload with its first float (a value or a block scale) set to NaN
        body = bytearray(payload[h.header_len :])
        body[:4] = struct.pack("<f", float("nan")) if h.codec.value != "bf16" else b"\xc0\x7f\xc0\x7f"
        return codecs.to_blob(head + bytes(body))
    raise ValueError(f"unknown malformed kind {kind!r}")


class Equivocation(HostAdversary):
    """Sends a second, different commit (half its Δ) for the same outer step."""

    name = "equivocation"
    expected = ("ACCEPT",)  # each commit alone is honest work: the chain, not replay, catches this
    chain_outcome = "equivocated"
    keeps_delta = True  # halves its Δ in commit_messages

    def commit_messages(self, contribution: TrainedStep, ctx: OuterContext) -> list[MsgCommitPseudoGradient]:
        other = ctx.with_delta(contribution, {n: t * 0.5 for n, t in contribution.delta.items()})
        return [contribution.to_msg(ctx.address, ctx.run_id), other.to_msg(ctx.address, ctx.run_id)]


class BadTokens(HostAdversary):
    """Trains honestly, claims more tokens than H × batch × seq_len (a larger reward share)."""

    name = "bad_tokens"
    expected = ("BAD_TOKENS",)
    chain_outcome = "rejected"

    def __init__(self, factor: int = 4) -> None:
        super().__init__()
        self.factor = int(factor)

    def make_contribution(self, ctx: OuterContext) -> TrainedStep:
        c = ctx.train()
        return dataclasses.replace(c, tokens=c.tokens * self.factor)


class ForgedEnvironment(HostAdversary):
    """Free rider (no training, every leaf = the start) that claims a machine no verifier has.

    Its hope: in bitwise mode only a verifier of the claimed replay class may judge, so if there is
    none, nobody can reject it. Every verifier of another class abstains, so it gets no verdict and
    the chain finalizes it `unverified`: never in the model, never paid (it just wasted its bond's
    time). In tolerance mode every class replays it and the faked trajectory fails the comparison.
    It cannot claim a verifier's class without claiming that machine, whose replay it then fails.
    """

    name = "forged_env"
    expected = ("REPLAY_MISMATCH",)  # from any verifier that does judge it (tolerance mode, same class)
    chain_outcome = "unverified"  # bitwise mode with no verifier of the claimed class

    def __init__(self, gpu_name: str = "NVIDIA Imaginary X1", compute_capability: str = "99.0") -> None:
        super().__init__()
        self.gpu_name, self.compute_capability = gpu_name, compute_capability

    def make_contribution(self, ctx: OuterContext) -> TrainedStep:
        c = assemble(ctx, [start_state(ctx)] * (ctx.cfg.n_segments + 1))
        facts = c.env.model_dump(exclude={"replay_class"})
        facts.update(device="cuda", gpu_name=self.gpu_name, compute_capability=self.compute_capability,
                     sm_count=1, cuda_version="99.0")  # fmt: skip
        return dataclasses.replace(c, env=EnvFingerprint(**facts))  # its class follows from the claim


class MomentSteer(HostAdversary):
    """Trains each segment for real but rewrites the AdamW moments at every boundary, params exact.

    exp_avg becomes a fixed direction of its own choosing (seeded, with each tensor's norm kept)
    and exp_avg_sq is multiplied by `sq_scale`; the next segment trains from that state, so the
    host steers the model while every claimed segment end has exactly the parameters an honest
    replay from the claimed start gives. Caught by the moment comparison of tolerance mode (and
    by the hash in bitwise mode); a parameters-only comparison accepts it.
    """

    name = "moment_steer"
    expected = ("REPLAY_MISMATCH",)
    chain_outcome = "rejected"

    def __init__(self, sq_scale: float = 0.25, seed: int = 0) -> None:
        super().__init__()
        if not float(sq_scale) > 0:
            raise ValueError("sq_scale must be positive")
        self.sq_scale, self.seed = float(sq_scale), seed

    def steer(self, st: State, ctx: OuterContext) -> State:
        floats = as_fp32(st)  # int8 moments (a bitwise run's default): rewritten as floats
        out = dict(floats)
        g = _seeded_gen("moment_steer", self.seed, ctx.address)  # the same target every step
        for name in sorted(floats):
            if name.startswith("exp_avg/"):
                m = floats[name]
                direction = torch.randn(m.shape, generator=g)
                out[name] = direction * (m.norm() / direction.norm().clamp_min(1e-30))
            elif name.startswith("exp_avg_sq/"):
                out[name] = floats[name] * self.sq_scale
        out = make_genuine(out, ctx.cfg.inner)  # moments AdamW could produce: replay must tell
        return _stored(out, ctx.cfg)

    def make_contribution(self, ctx: OuterContext) -> TrainedStep:
        cfg, k = ctx.cfg, ctx.cfg.segment_len
        job = TrainJob(cfg, ctx.data, ctx.address, ctx.outer_step, loss_fn=ctx.loss_fn)
        cur = start_state(ctx)
        states, losses = [cur], []
        for j in range(cfg.n_segments):
            load_training_state(ctx.model, ctx.inner_optimizer, cur)
            losses += train_segment(job, ctx.model, ctx.inner_optimizer, j * k, k)
            cur = self.steer(clone_state(training_state(ctx.model, ctx.inner_optimizer)), ctx)
            states.append(cur)
        load_training_state(ctx.model, ctx.inner_optimizer, cur)  # what it carries to the next step
        return assemble(ctx, states, losses)


class BudgetSteer(HostAdversary):
    """Steers the model within tolerance mode's thresholds: trains every segment for real, then
    moves the claimed end by `fraction` of every threshold, always the same way, so the moves add up
    over segments and outer steps (`gonka_diloco.adversaries.steer`). `target="group"` spends the
    per-group norms' budgets where they are weakest (exp_avg where exp_avg_sq = 0: AdamW's steps of
    lr·m/ε), which those norms alone accept; `target="update"` is the strongest steering known within
    every check of specs §6 (accepted: its effect is measured by `bench.steering`).

    `cancel` (issue 36) instead moves the parameters by one vector δ, `fraction` of the per-segment
    parameter budget, and cancels it where a check sums (`steer.cancel_plan`): "last" (or True) at
    θ_H, by −(s−1)·δ, which summing the drawn segments apart catches (specs §6.4); "window" at the
    end of every aligned block, which leaves no move behind to steer with.
    """

    name = "budget_steer"
    expected: tuple[str, ...] = ("REPLAY_MISMATCH",)
    chain_outcome = "rejected"

    def __init__(
        self, fraction: float = 0.9, target: str = "group", where: str = "free", seed: int = 0,
        params: bool = True, cumulative: bool = True, cancel: bool | str = False, lone: bool = False,
    ) -> None:  # fmt: skip
        super().__init__()
        # True: θ_H's boundary spends its whole per-segment budget, as if only a lone last window
        # (n mod w = 1) replayed it; in tolerance mode the window before takes it on (specs §6.4)
        self.lone = bool(lone)
        self.steer_params = bool(params)  # False: the moments' budgets alone, parameters exact
        # False: ignores the thresholds over summed segments (specs §6.4), spends the per-segment
        # budgets at every boundary (the strongest steering before them; rejected where a run sets them)
        self.cumulative = bool(cumulative)
        if not 0.0 <= float(fraction) < 1.0:
            raise ValueError("fraction must be in [0, 1)")
        if target not in TARGETS or where not in WHERE:
            raise ValueError(f"target must be one of {TARGETS}, where one of {WHERE}")
        self.cancel = "last" if cancel is True else (cancel or "")
        if self.cancel and self.cancel not in CANCELS:
            raise ValueError(f"cancel must be true or one of {CANCELS}")
        self.fraction, self.target, self.where, self.seed = float(fraction), target, where, seed
        if self.cancel == "window":  # cancelled in every window: accepted there, rejected by a challenge
            self.expected = ("REPLAY_MISMATCH", "ACCEPT")
        elif self.cancel:
            pass
        elif self.lone:  # the last boundary past the summed budgets: rejected by a window short of it
            self.expected = ("REPLAY_MISMATCH", "ACCEPT")
        elif target == "update" and self.cumulative:  # within every check: accepted, bounded (bench.steering)
            self.expected, self.chain_outcome = ("ACCEPT",), "accepted"
        elif target == "update":  # accepted only by a run without the cumulative thresholds
            self.expected = ("REPLAY_MISMATCH", "ACCEPT")

    def make_contribution(self, ctx: OuterContext) -> TrainedStep:
        if self.cancel:
            return self._cancelled(ctx)
        cfg, k = ctx.cfg, ctx.cfg.segment_len
        job = TrainJob(cfg, ctx.data, ctx.address, ctx.outer_step, loss_fn=ctx.loss_fn)
        cur = start_state(ctx)
        states, losses = [cur], []
        for j in range(cfg.n_segments):
            load_training_state(ctx.model, ctx.inner_optimizer, cur)
            losses += train_segment(job, ctx.model, ctx.inner_optimizer, j * k, k)
            end = clone_state(training_state(ctx.model, ctx.inner_optimizer))
            summed = self.cumulative and not (j == cfg.n_segments - 1 and self.lone)
            # int8 moments (a bitwise run's default): steered as floats, stored in the run's format
            cur = _stored(steer_boundary(as_fp32(end), as_fp32(cur), cfg, self.fraction, self.target,
                                         self.where, self.seed, params=self.steer_params,
                                         cumulative=summed, segment=j), cfg)  # fmt: skip
            states.append(cur)
        load_training_state(ctx.model, ctx.inner_optimizer, cur)  # what it carries to the next step
        return assemble(ctx, states, losses)

    def _cancelled(self, ctx: OuterContext) -> TrainedStep:
        """Two passes: an honest one sizes δ to every boundary's budget, the second claims q·δ."""
        cfg, k = ctx.cfg, ctx.cfg.segment_len
        job = TrainJob(cfg, ctx.data, ctx.address, ctx.outer_step, loss_fn=ctx.loss_fn)
        plan = cancel_plan(cfg, self.cancel)
        first = start_state(ctx)
        move: Mapping[str, Tensor] | None = None
        for _ in range(2):
            cur, states, losses, ends = first, [first], [], []
            for j in range(cfg.n_segments):
                load_training_state(ctx.model, ctx.inner_optimizer, cur)
                losses += train_segment(job, ctx.model, ctx.inner_optimizer, j * k, k)
                ends.append(clone_state(training_state(ctx.model, ctx.inner_optimizer)))
                cur = ends[-1] if move is None else moved_params(ends[-1], move, plan[j])
                states.append(cur)
            if move is not None:
                break
            floats = [as_fp32(x) for x in ends], [as_fp32(x) for x in states[:-1]]  # int8 moments as floats
            move = cancel_move(*floats, plan, cfg, self.fraction, self.seed)
        load_training_state(ctx.model, ctx.inner_optimizer, cur)  # what it carries to the next step
        return assemble(ctx, states, losses)


class EagerStart(HostAdversary):
    """Overlapped runs: trains step n from its base minus its own step n−1 Δ, not yet verified (the
    'eager update' of Kale et al. 2025), while claiming the base: a start that finalized chain data
    does not fix, so a Δ later rejected would already be inside it. Honest until it has a Δ.

    Caught by the Δ check (its Δ is not G_base − θ_H) or, when segment 0 is opened, by the start
    check (boundary 0 is not the base plus the chain-named optimizer state)."""

    name = "eager"
    expected = ("DELTA_MISMATCH", "WRONG_START")
    chain_outcome = "rejected"

    def __init__(self) -> None:
        super().__init__()
        self.history: dict[int, bytes] = {}

    def make_contribution(self, ctx: OuterContext) -> TrainedStep:
        previous = self.history.get(ctx.outer_step - 1)
        if previous is None or ctx.optimizer is None:
            c = ctx.train()
        else:
            own = codecs.decode(previous, ctx.global_model.layout)
            eager = {n: ctx.global_model.params[n] - own[n] for n in ctx.global_model.params}
            c = run_committed(ctx.job(eager), ctx.model, ctx.inner_optimizer)
        self.history[ctx.outer_step] = c.payload
        return c


class WrongEagerStart(HostAdversary):
    """Eager runs: starts a step from a start other than the chain's rule names (specs §2.2.1).
    `mode` "forged": where the rule names its parent Δ, builds the eager start from a forged
    stand-in Δ instead (its own scaled by `factor`, a Δ that was never committed); "no_parent":
    where the rule names a parent, starts from G_{n−1} as if it had none; "own_always": where the
    rule names none (its previous contribution's parent was rejected), uses its own last Δ anyway.
    Its trajectory is consistent from the start it chose, so only the start gives it away.

    Caught by the start check (segment 0's rebuilt start does not hash to its leaf 0: WRONG_START)
    when segment 0 is opened, else by the Δ check (Δ is measured from the rule's start:
    DELTA_MISMATCH). Honest where the rule and its choice agree (step 0)."""

    name = "wrong_start"
    expected = ("WRONG_START", "DELTA_MISMATCH")
    chain_outcome = "rejected"
    MODES = ("forged", "no_parent", "own_always")

    def __init__(self, mode: str = "forged", factor: float = 2.0) -> None:
        super().__init__()
        if mode not in self.MODES:
            raise ValueError(f"mode must be one of {self.MODES}")
        self.mode, self.factor = mode, float(factor)
        self.history: dict[int, bytes] = {}

    def make_contribution(self, ctx: OuterContext) -> TrainedStep:
        from nodekit.eager import eager_start

        own = self.history.get(ctx.outer_step - 1)
        outer = ctx.cfg.outer
        if ctx.start_params is not None and self.mode == "forged" and own is not None:
            d = codecs.decode(own, ctx.global_model.layout)
            forged = codecs.encode(
                {n: t * self.factor for n, t in d.items()}, ctx.cfg.codec, ctx.cfg.codec_block_size
            )
            ctx.start_params = eager_start(ctx.global_model, forged, outer)
        elif ctx.start_params is not None and self.mode == "no_parent":
            ctx.start_params = None
        elif ctx.start_params is None and self.mode == "own_always" and own is not None:
            ctx.start_params = eager_start(ctx.global_model, own, outer)
        c = ctx.train()
        self.history[ctx.outer_step] = c.payload
        return c


class Withhold(HostAdversary):
    """Trains honestly and serves its verifiers, then refuses its Δ to everyone (still voting for
    the G_{n+1} it can compute, to be paid): from its reveal in bitwise mode (its verifiers derive
    the Δ from their replay and never ask for it), once verification is over in tolerance mode
    (they download it). So no aggregator ever gets it from its author, however fast it asks."""

    name = "withhold"
    honest_work = True

    def __init__(self) -> None:
        super().__init__()
        self.withheld: set[str] = set()

    def should_reveal(self, contribution: TrainedStep, ctx: OuterContext) -> bool:
        if ctx.cfg.replay_mode is ReplayMode.BITWISE:
            self.withheld.add(contribution.delta_hash)
        return True

    def finalized(self, contribution: TrainedStep | None, accepted: bool, ctx: OuterContext) -> None:
        if contribution is not None:
            self.withheld.add(contribution.delta_hash)

    def serve_blob(self, kind: str, blob_hash: str, data: bytes) -> bytes | None:
        return None if kind == "delta" and blob_hash in self.withheld else data


class Trickle(Withhold):
    """Trains honestly and is accepted like a withholder, but instead of refusing its Δ it serves
    it to everyone at a trickle (`bytes_per_s`, default a byte a second): it never says no, so an
    aggregator that waits for every byte never votes, and a step whose hosts wait for it closes
    unchanged while the trickler stays accepted. Fetches drop it at the rate floor instead."""

    name = "trickle"

    def __init__(self, bytes_per_s: float = 1.0) -> None:
        super().__init__()
        if not 0 < bytes_per_s < 1e12:
            raise ValueError(f"bytes_per_s must be in (0, 1e12), got {bytes_per_s}")
        self.bytes_per_s = bytes_per_s

    serve_blob = HostBehaviour.serve_blob  # every byte, streamed from disk as an honest host does

    def serve_bytes_per_s(self, kind: str, blob_hash: str) -> float | None:
        return self.bytes_per_s if kind == "delta" and blob_hash in self.withheld else None


class ForgeResult(Withhold):
    """Withholds its accepted Δ and votes for a G_{n+1} hash it made up, in every result round: if
    the honest hosts could not fetch its Δ they could not compute the real result, and its lone
    vote would be the only one (what a plurality rule adopted)."""

    name = "forge_result"

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        self.seed = seed

    def result_vote(self, model_hash: str | None, ctx: OuterContext) -> str | None:
        return hashlib.sha256(f"forged:{self.seed}:{ctx.address}:{ctx.outer_step}".encode()).hexdigest()

    def report_unavailable(self, hosts: Sequence[str], ctx: OuterContext) -> list[str]:
        return []


class LossLiar(HostAdversary):
    """Honest work and an honest vote, but the validation loss sent with the vote is its own
    evaluation times `factor` (0.5: claims the model is twice as good), to bend the run's loss as
    reports read it from chain after the nodes exited."""

    name = "loss_liar"
    honest_work = True

    def __init__(self, factor: float = 0.5) -> None:
        super().__init__()
        if not 0 <= factor < 1e6:
            raise ValueError(f"factor must be in [0, 1e6), got {factor}")
        self.factor = factor

    def result_loss(self, val_loss_ppm: int, ctx: OuterContext) -> int:
        return round(val_loss_ppm * self.factor)


class SilentAfterAccept(HostAdversary):
    """Honest until its contribution is accepted; from then on it serves nothing, votes nothing,
    reports nothing and commits nothing (a host that vanishes once it has been verified, hoping
    the step waits for it)."""

    name = "silent_after_accept"
    honest_work = True

    def __init__(self) -> None:
        super().__init__()
        self.silent = False

    def finalized(self, contribution: TrainedStep | None, accepted: bool, ctx: OuterContext) -> None:
        self.silent = self.silent or accepted

    def serve_blob(self, kind: str, blob_hash: str, data: bytes) -> bytes | None:
        return None if self.silent else data

    def result_vote(self, model_hash: str | None, ctx: OuterContext) -> str | None:
        return None if self.silent else model_hash

    def report_unavailable(self, hosts: Sequence[str], ctx: OuterContext) -> list[str]:
        return [] if self.silent else list(hosts)

    def commit_messages(self, contribution: TrainedStep, ctx: OuterContext) -> list[MsgCommitPseudoGradient]:
        return [] if self.silent else super().commit_messages(contribution, ctx)


class ForgedErrorFeedback(HostAdversary):
    """Codec sparse: trains honestly, then commits what a `forger` of `adversaries/sparse.py` makes
    of its step: a payload that decodes but is not C(β·e + Δ) (`topk_shifted`, `scaled`,
    `sign_flip`, `random_k`, `ef_dropped` once e ≠ 0) and/or a carried e that is not a − C(a)
    (`ef_hoard`). `steps`: only in these outer steps (honest in the others); None = every step."""

    name = "ef_forge"
    expected = ("DELTA_MISMATCH",)
    chain_outcome = "rejected"
    keeps_delta = True

    def __init__(self, forger: str = "ef_hoard", steps: Sequence[int] | None = None) -> None:
        super().__init__()
        if forger not in EF_FORGERS:
            raise ValueError(f"unknown forger {forger!r}; known: {', '.join(sorted(EF_FORGERS))}")
        self.forger = forger
        self.steps = None if steps is None else {int(n) for n in steps}

    def make_contribution(self, ctx: OuterContext) -> TrainedStep:
        if ctx.ef is None:
            raise ValueError("ef_forge needs a run with codec 'sparse'")
        c = ctx.train(keep_delta=True)
        if self.steps is not None and ctx.outer_step not in self.steps:
            return c
        layout = ctx.global_model.layout
        e = start_ef(ctx.ef.content, layout, ctx.ef.start_hash)
        payload, e_next = EF_FORGERS[self.forger](e, c.delta, ctx.ef.cfg)
        forged = ctx.with_payload(c, payload, dict(c.delta))
        return dataclasses.replace(forged, final_ef_hash=ctx.ef.store(e_next, layout))


HOSTS: dict[str, Callable[..., HostBehaviour]] = {
    "honest": HostBehaviour,
    "noise": NoiseDelta,
    "zero": ZeroDelta,
    "scaled": ScaledDelta,
    "sign_flip": SignFlipDelta,
    "lazy": LazyHost,
    "one_fake": OneSegmentFake,
    "last_fake": LastSegmentFake,
    "wrong_data": WrongData,
    "stale": StaleDelta,
    "copycat": Copycat,
    "no_reveal": NoReveal,
    "late_reveal": LateReveal,
    "malformed": MalformedBlob,
    "equivocation": Equivocation,
    "bad_tokens": BadTokens,
    "forged_env": ForgedEnvironment,
    "moment_steer": MomentSteer,
    "budget_steer": BudgetSteer,
    "withhold": Withhold,
    "forge_result": ForgeResult,
    "trickle": Trickle,
    "silent_after_accept": SilentAfterAccept,
    "loss_liar": LossLiar,
    "eager": EagerStart,
    "wrong_start": WrongEagerStart,
    "ef_forge": ForgedErrorFeedback,
}


def describe(cls: Any) -> str:
    """The first paragraph of a behaviour's docstring, on one line."""
    doc = (cls.__doc__ or cls.__name__).strip().split("\n\n")[0]
    return " ".join(line.strip() for line in doc.splitlines())

