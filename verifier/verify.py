"""The checks a verifier runs on one contribution: pure functions over what it fetched.

Everything here is deterministic given (job, blob source, replay context), so two honest
verifiers reach the same verdict and the same evidence hash. Fetching is behind `BlobSource`:
the node plugs in HTTP with retries, tests plug in a dict. The source raises `MissingData`
(unreachable, absent after the deadline) or `MalformedBlob` (too large, undecodable, wrong hash);
every other failure mode of the host's data is turned into a reason code here, never a crash.

Memory: segments are checked one at a time and the replayed end is read from the live model
without a copy, so besides its model a verification holds at most two training states (the start
and, in tolerance mode or on a mismatch, the claimed end); the node sizes its pool from that.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import Tensor, nn

from protocol import codecs
from protocol.config import ReplayMode, RunConfig, canonical_json
from protocol.envclass import ReplayDecision, replay_decision
from protocol.merkle import verify_pair
from protocol.messages import EnvFingerprint, Reason
from protocol.tensors import StateKind, tensor_hash
from trainer.data import Corpus
from trainer.device import host_view
from trainer.step import (
    LossFn,
    State,
    StateError,
    load_training_state,
    make_optimizer,
    optimizer_hash,
    optimizer_state,
    train_segment,
    training_hash,
    training_state,
)

PARAM = "param/"


class MissingData(Exception):
    """A revealed blob could not be fetched (unreachable host, 404 after the reveal deadline)."""


class MalformedBlob(Exception):
    """A fetched blob is too large, does not decode, or does not hash to what was asked for."""


class CannotVerify(Exception):
    """This verifier cannot judge the contribution (e.g. its environment differs in bitwise mode).

    Not the host's fault: the node abstains instead of rejecting honest work.
    """


class BlobSource(Protocol):
    """Where revealed data comes from. Implementations verify hashes and bound sizes."""

    def state(self, leaf_hash: str) -> State:
        """The training state whose `training_hash` is `leaf_hash`."""
        ...

    def delta(self, delta_hash: str) -> bytes:
        """The Δ blob (`codecs.to_blob(payload)`) whose payload hashes to `delta_hash`."""
        ...


@dataclass(frozen=True)
class OpeningData:
    """One revealed segment; `proof` is None when only the chain (which checked it) had it."""

    segment: int
    start_leaf: str
    end_leaf: str
    proof: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Job:
    """Everything public about one assigned contribution, read from the chain."""

    run_id: int
    outer_step: int
    host: str
    cfg: RunConfig
    trajectory_root: str
    leaf_count: int
    delta_hash: str
    final_optimizer_hash: str
    tokens: int
    env: EnvFingerprint
    sampled: tuple[int, ...]
    openings: tuple[OpeningData, ...]
    prev_optimizer_hash: str | None  # None: the host's first accepted outer step, start fresh


@dataclass
class ReplayContext:
    """What replay needs besides the job: the model, its loss, the corpus and G_n's params."""

    model: nn.Module
    loss_fn: LossFn
    data: Corpus
    global_params: Mapping[str, Tensor]  # G_n, keyed by the model's parameter names
    on_replay_steps: Callable[[int], None] = field(default=lambda n: None)


@dataclass(frozen=True)
class Outcome:
    """A verdict before it is signed: reason, human detail, and the hash that binds our replay."""

    reason: Reason
    detail: str
    evidence_hash: str
    replayed_leaves: tuple[str, ...] = ()
    replay_steps: int = 0
    replay_seconds: float = 0.0

    @property
    def accept(self) -> bool:
        return self.reason is Reason.ACCEPT


class _Reject(Exception):
    def __init__(self, reason: Reason, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


def evidence_hash(job: Job, reason: Reason, replayed: Sequence[str], detail: str) -> str:
    """sha256 over what we computed: binds the verdict to our own replay output, not the host's claims."""
    body = {
        "run_id": job.run_id,
        "outer_step": job.outer_step,
        "host": job.host,
        "trajectory_root": job.trajectory_root,
        "delta_hash": job.delta_hash,
        "reason": int(reason),
        "replayed": list(replayed),
        "detail": detail,
    }
    return hashlib.sha256(b"gonka-diloco/evidence/v1\x00" + canonical_json(body)).hexdigest()


# ---------------------------------------------------------------- individual checks


def check_proofs(job: Job) -> None:
    """Openings are exactly the challenged segments, and each pair proof binds to the root."""
    n = job.cfg.n_segments
    if job.leaf_count != n + 1:
        raise _Reject(Reason.BAD_PROOF, f"leaf_count {job.leaf_count} != H/k + 1 = {n + 1}")
    if not job.openings:
        raise _Reject(Reason.MISSING_DATA, "nothing was revealed")
    got = sorted(o.segment for o in job.openings)
    if got != sorted(job.sampled):
        raise _Reject(Reason.BAD_PROOF, f"opened segments {got} != challenged {sorted(job.sampled)}")
    try:
        root = bytes.fromhex(job.trajectory_root)
        for o in job.openings:
            if o.proof is None:
                continue
            left, right = bytes.fromhex(o.start_leaf), bytes.fromhex(o.end_leaf)
            proof = [bytes.fromhex(p) for p in o.proof]
            if not verify_pair(left, right, o.segment, job.leaf_count, proof, root):
                raise _Reject(Reason.BAD_PROOF, f"segment {o.segment}: pair proof does not match the root")
    except ValueError as e:
        raise _Reject(Reason.BAD_PROOF, f"proof is not hex: {e}") from e


def check_claims(job: Job) -> None:
    """Cheap checks on the commitment itself, before any data is fetched."""
    cfg = job.cfg
    if job.tokens != cfg.tokens_per_outer_step:
        want = cfg.tokens_per_outer_step
        raise _Reject(Reason.BAD_TOKENS, f"tokens {job.tokens} != H*batch*seq_len = {want}")
    slices = job.env.micro_batches
    if cfg.batch_size % slices:  # a DDP host's slices must split the PRF batch evenly
        raise _Reject(Reason.BAD_ENVIRONMENT, f"batch {cfg.batch_size} does not split into {slices} slices")
    bitwise = cfg.replay_mode is ReplayMode.BITWISE  # tolerance mode exists for other environments
    if bitwise and (job.env.threads != cfg.threads or not job.env.deterministic):
        raise _Reject(
            Reason.BAD_ENVIRONMENT,
            f"committed env threads={job.env.threads} deterministic={job.env.deterministic}, "
            f"run needs threads={cfg.threads} deterministic=True",
        )


def check_verifier_env(job: Job, mine: EnvFingerprint) -> ReplayDecision:
    """The replay-class rule (specs/protocol.md §6.1): bitwise mode needs this verifier's class to
    be the host's; tolerance mode serves every class. `CannotVerify` when this verifier must abstain."""
    decision = replay_decision(job.cfg.replay_mode, job.env, mine)
    if decision is ReplayDecision.ABSTAIN:
        raise CannotVerify(
            f"{job.cfg.replay_mode.value} replay of a {job.env.device} host (class "
            f"{job.env.replay_class[:12]}, torch {job.env.torch_version} x{job.env.threads}) needs its "
            f"class; this verifier is {mine.device} (class {mine.replay_class[:12]}, "
            f"torch {mine.torch_version} x{mine.threads})"
        )
    return decision


def fresh_optimizer_state(model: nn.Module, job: Job) -> State:
    """Exactly what a host starts from on its first outer step: `make_optimizer`'s zeros, step 0."""
    opt = make_optimizer(model, job.cfg.inner)
    return optimizer_state(training_state(model, opt, copy=True))


def check_start(job: Job, ctx: ReplayContext, start: State) -> None:
    """Leaf 0 must be G_n's params with the host's previous committed optimizer state (or fresh)."""
    names = [n for n, _ in ctx.model.named_parameters()]
    for name in names:
        got = start.get(PARAM + name)
        want = ctx.global_params.get(name)
        if got is None or want is None or got.shape != want.shape or got.dtype != want.dtype:
            raise _Reject(Reason.WRONG_START, f"start param {name} does not fit G_n")
        if not torch.equal(got, want):
            raise _Reject(Reason.WRONG_START, f"start param {name} differs from G_n")
    fresh = tensor_hash(fresh_optimizer_state(ctx.model, job), StateKind.OPTIMIZER)
    want_opt = job.prev_optimizer_hash or fresh
    got_opt = optimizer_hash(start)
    if got_opt != want_opt:
        kind = "fresh" if job.prev_optimizer_hash is None else "previously committed"
        detail = f"start optimizer {got_opt[:12]} is not the {kind} state {want_opt[:12]}"
        raise _Reject(Reason.WRONG_START, detail)


def param_distance(replay: State, claim: State, start: State) -> float:
    """‖θ_replay − θ_claim‖ / ‖θ_claim − θ_start‖ over parameters, in float64."""
    num = 0.0
    den = 0.0
    for k, c in claim.items():
        if not k.startswith(PARAM):
            continue
        c64 = c.double()
        num += float((replay[k].double() - c64).square().sum())
        den += float((c64 - start[k].double()).square().sum())
    if not math.isfinite(num) or not math.isfinite(den):
        return math.inf
    if den == 0.0:
        return 0.0 if num == 0.0 else math.inf
    return math.sqrt(num) / math.sqrt(den)


def replay_segment(job: Job, ctx: ReplayContext, start: State, segment: int) -> State:
    """The host's own step function from `start`, over the PRF batches of `segment`.

    Returns the state in host memory: on CPU the live state of `ctx.model` (no copy), which changes
    with the next replay; on a GPU a host copy.
    """
    k = job.cfg.segment_len
    opt = make_optimizer(ctx.model, job.cfg.inner)
    load_training_state(ctx.model, opt, start)
    train_segment(
        ctx.model, opt, job.cfg, ctx.data, job.host, job.outer_step, segment * k, k, job.env.micro_batches,
        loss_fn=ctx.loss_fn,
    )
    ctx.on_replay_steps(k)
    return host_view(training_state(ctx.model, opt))


def _checked_state(source: BlobSource, leaf: str) -> State:
    state = source.state(leaf)
    if training_hash(state) != leaf:
        raise MalformedBlob(f"state {leaf[:12]} does not hash to its address")
    return state


def check_delta(job: Job, ctx: ReplayContext, final: State, source: BlobSource) -> None:
    """Committed Δ hash == hash of encode(θ_global − θ_H); the served blob is exactly that payload."""
    cfg = job.cfg
    delta: dict[str, Tensor] = {}
    for name, want in ctx.global_params.items():
        theta = final.get(PARAM + name)
        if theta is None or theta.shape != want.shape:
            raise _Reject(Reason.DELTA_MISMATCH, f"final state lacks param {name}")
        d = want - theta
        if not bool(torch.isfinite(d).all()):
            raise _Reject(Reason.DELTA_MISMATCH, f"Δ of {name} is not finite")
        delta[name] = d
    payload = codecs.encode(delta, cfg.codec, cfg.codec_block_size)
    mine = codecs.delta_hash(payload)
    if mine != job.delta_hash:
        raise _Reject(Reason.DELTA_MISMATCH, f"committed Δ {job.delta_hash[:12]} != θ_global−θ_H {mine[:12]}")
    layout = {n: tuple(t.shape) for n, t in delta.items()}
    blob = source.delta(job.delta_hash)
    try:
        served = codecs.from_blob(
            blob, layout, max_payload_bytes=len(payload), codec=cfg.codec, block_size=cfg.codec_block_size
        )
        codecs.decode(served, layout)  # what every host will do with it: must not fail
    except codecs.CodecError as e:
        raise MalformedBlob(f"Δ blob: {e}") from e
    if codecs.delta_hash(served) != job.delta_hash:
        raise MalformedBlob("served Δ payload does not hash to the committed Δ")


# ---------------------------------------------------------------- the whole verification


def verify(job: Job, source: BlobSource, ctx: ReplayContext) -> Outcome:
    """Run every check in order; the first failure decides the reason. Never raises on host data.

    Order: proofs and claims (free) → per sampled segment: start state, replay, compare → Δ.
    Whether this verifier may judge at all (its own environment) is `check_verifier_env`'s call.
    """
    replayed: list[str] = []
    steps = 0
    seconds = 0.0
    try:
        check_proofs(job)
        check_claims(job)
        final: State | None = None
        last = job.cfg.n_segments - 1
        for o in sorted(job.openings, key=lambda o: o.segment):
            start = _checked_state(source, o.start_leaf)
            if o.segment == 0:
                check_start(job, ctx, start)
            t0 = time.perf_counter()
            try:
                end = replay_segment(job, ctx, start, o.segment)
            except StateError as e:
                raise MalformedBlob(f"segment {o.segment} start state does not load: {e}") from e
            seconds += time.perf_counter() - t0
            steps += job.cfg.segment_len
            leaf = training_hash(end)
            replayed.append(leaf)
            claim = None
            if job.cfg.replay_mode is ReplayMode.TOLERANCE or leaf != o.end_leaf:
                claim = _checked_state(source, o.end_leaf)
            if leaf != o.end_leaf:
                dist = param_distance(end, claim, start) if claim is not None else math.inf
                tolerated = job.cfg.replay_mode is ReplayMode.TOLERANCE and dist < job.cfg.tolerance
                if not tolerated:
                    raise _Reject(
                        Reason.REPLAY_MISMATCH,
                        f"segment {o.segment}: replay {leaf[:12]} != committed {o.end_leaf[:12]}, "
                        f"distance {dist:.3e}",
                    )
            if o.segment == last:
                final = claim if claim is not None else end
            del start, end, claim
        if final is None:  # check_proofs guarantees the last segment is opened; defensive
            raise _Reject(Reason.BAD_PROOF, "the last segment was not opened")
        if optimizer_hash(final) != job.final_optimizer_hash:
            raise _Reject(Reason.DELTA_MISMATCH, "final optimizer hash differs from the committed one")
        check_delta(job, ctx, final, source)
        reason, detail = Reason.ACCEPT, ""
    except _Reject as r:
        reason, detail = r.reason, r.detail
    except MissingData as e:
        reason, detail = Reason.MISSING_DATA, str(e)
    except MalformedBlob as e:
        reason, detail = Reason.MALFORMED_BLOB, str(e)
    detail = detail[:256]
    evidence = evidence_hash(job, reason, replayed, detail)
    return Outcome(reason, detail, evidence, tuple(replayed), steps, seconds)
