"""The checks a verifier runs on one contribution: pure functions over what it fetched.

Everything here is deterministic given (job, blob source, replay context), so two honest
verifiers reach the same verdict and the same evidence hash. Fetching is behind `BlobSource`:
the node plugs in HTTP with retries, tests plug in a dict. The source raises `MissingData`
(unreachable, absent after the deadline) or `MalformedBlob` (too large, undecodable, wrong hash);
every other failure mode of the host's data is turned into a reason code here, never a crash.

Memory: segments are checked one at a time and the replayed end is read from the live model
without a copy, so besides its model a verification holds at most two training states (the start
and, in tolerance mode or on a mismatch, the claimed end), and in tolerance mode two float32
accumulators of the parameters' size (`Cumulative`); the node sizes its pool from that.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import math
import time
from collections.abc import Callable, Sequence

import torch
from torch import nn

from nodekit.eager import EagerStart
from protocol import chunks
from protocol.codecs import CodecError
from protocol.config import Codec, Moments, ReplayMode, canonical_json
from protocol.envclass import ReplayDecision, replay_decision
from protocol.merkle import verify_pair
from protocol.messages import EnvFingerprint, Reason
from protocol.moments import optimizer_specs as moment_specs
from protocol.tensors import StateKind, canonical_header, canonical_size, domain
from replay.device import host_state, host_view
from replay.step import (
    State,
    StateError,
    TrainJob,
    load_training_state,
    make_optimizer,
    optimizer_hash,
    train_segment,
    training_hash,
    training_state,
)
from verifier.delta import check_delta, check_ef_delta, layout_of
from verifier.job import (
    BlobSource,
    CannotVerify,
    Job,
    Judgement,
    MalformedBlob,
    MissingData,
    OpeningData,
    Rejected,
    ReplayContext,
)
from verifier.tolerance import PARAM, Cumulative, cumulative_mismatch, param_distance, tolerance_mismatch
from verifier.update_space import genuine_mismatch


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
        raise Rejected(Reason.BAD_PROOF, f"leaf_count {job.leaf_count} != H/k + 1 = {n + 1}")
    if not job.openings:
        raise Rejected(Reason.MISSING_DATA, "nothing was revealed")
    got = sorted(o.segment for o in job.openings)
    if got != sorted(job.sampled):
        raise Rejected(Reason.BAD_PROOF, f"opened segments {got} != challenged {sorted(job.sampled)}")
    try:
        root = bytes.fromhex(job.trajectory_root)
        for o in job.openings:
            if o.proof is None:
                continue
            left, right = bytes.fromhex(o.start_leaf), bytes.fromhex(o.end_leaf)
            proof = [bytes.fromhex(p) for p in o.proof]
            if not verify_pair(left, right, o.segment, job.leaf_count, proof, root):
                raise Rejected(Reason.BAD_PROOF, f"segment {o.segment}: pair proof does not match the root")
    except ValueError as e:
        raise Rejected(Reason.BAD_PROOF, f"proof is not hex: {e}") from e


def check_claims(job: Job) -> None:
    """Cheap checks on the commitment itself, before any data is fetched."""
    cfg = job.cfg
    if job.tokens != cfg.tokens_per_outer_step:
        want = cfg.tokens_per_outer_step
        raise Rejected(Reason.BAD_TOKENS, f"tokens {job.tokens} != H*batch*seq_len = {want}")
    slices = job.env.micro_batches
    if cfg.batch_size % slices:  # a DDP host's slices must split the PRF batch evenly
        raise Rejected(Reason.BAD_ENVIRONMENT, f"batch {cfg.batch_size} does not split into {slices} slices")
    bitwise = cfg.replay_mode is ReplayMode.BITWISE  # tolerance mode exists for other environments
    if bitwise and (job.env.threads != cfg.threads or not job.env.deterministic):
        raise Rejected(
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
    """Exactly what a host starts from on its first outer step: `make_optimizer`'s zeros, step 0,
    in host memory. Built as the zeros themselves (8 B/param), not through an optimizer and a copy
    of its whole training state (20 B/param at once: the verifier's peak at 315M params)."""
    layout = {n: tuple(p.shape) for n, p in model.named_parameters()}
    return {n: torch.zeros(shape, dtype=dt) for n, dt, shape in moment_specs(layout, job.cfg.inner.moments)}


_ZEROS = memoryview(bytes(1 << 20))


def fresh_optimizer_hash(model: nn.Module, chunk_bytes: int, moments: Moments = Moments.FP32) -> str:
    """`optimizer_hash(fresh_optimizer_state(...))` without the state: its canonical bytes are its
    header (from the model's layout) followed by zeros only (zero moments, a 0.0 step counter), so
    the zeros are streamed from one 1 MiB buffer, O(1) memory whatever the model's size."""
    specs = moment_specs({n: tuple(p.shape) for n, p in model.named_parameters()}, moments)
    header = canonical_header(specs)
    data = canonical_size(specs) - len(header)
    pieces: list[bytes | memoryview] = [header]
    pieces += [_ZEROS[: min(len(_ZEROS), data - a)] for a in range(0, data, len(_ZEROS))]
    return chunks.hash_stream(domain(StateKind.OPTIMIZER), pieces, chunk_bytes)[0]


def check_start(job: Job, ctx: ReplayContext, start: State) -> None:
    """Leaf 0 must be G_n's params with the host's previous committed optimizer state (or fresh)."""
    names = sorted(n for n, _ in ctx.model.named_parameters())  # name order: one pass over G_n
    for name in names:
        got = start.get(PARAM + name)
        want = ctx.global_params.get(name)
        if got is None or want is None or got.shape != want.shape or got.dtype != want.dtype:
            raise Rejected(Reason.WRONG_START, f"start param {name} does not fit G_n")
        if not torch.equal(got, want):
            raise Rejected(Reason.WRONG_START, f"start param {name} differs from G_n")
    c = job.cfg.state_chunk_bytes
    want_opt = job.prev_optimizer_hash or fresh_optimizer_hash(ctx.model, c, job.cfg.inner.moments)
    got_opt = optimizer_hash(start, c)
    if got_opt != want_opt:
        kind = "fresh" if job.prev_optimizer_hash is None else "previously committed"
        detail = f"start optimizer {got_opt[:12]} is not the {kind} state {want_opt[:12]}"
        raise Rejected(Reason.WRONG_START, detail)


def replay_job(job: Job, ctx: ReplayContext) -> TrainJob:
    """The host's training job for this outer step, as the verifier replays it: the host's PRF
    batches, its slice count (the committed env), the model's loss; one process, no exchange."""
    return TrainJob(job.cfg, ctx.data, job.host, job.outer_step, job.env.micro_batches, ctx.loss_fn)


def replay_segment(job: Job, ctx: ReplayContext, start: State, segment: int) -> State:
    """The host's own step function from `start`, over the PRF batches of `segment`.

    Returns the state in host memory: on CPU the live state of `ctx.model` (no copy), which changes
    with the next replay; on a GPU a host copy.
    """
    k = job.cfg.segment_len
    opt = make_optimizer(ctx.model, job.cfg.inner)
    load_training_state(ctx.model, opt, start)
    train_segment(replay_job(job, ctx), ctx.model, opt, segment * k, k)
    ctx.on_replay_steps(k)
    return host_view(training_state(ctx.model, opt))


def _checked_state(source: BlobSource, leaf: str) -> State:
    """A fetched state: the source checked every chunk against `leaf` while it streamed, so it is
    hashed once, there, and not again here."""
    return source.state(leaf)


def _takes_into(fn: Callable[..., object]) -> bool:
    try:
        return "into" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _fetch(source: BlobSource, method: str, key: str, into: State | None) -> State:
    """`source.<method>(key)`, written straight into `into` when the source can (no second copy)."""
    fn = getattr(source, method)
    return fn(key, into=into) if into is not None and _takes_into(fn) else fn(key)


def fill_live(ctx: ReplayContext, live: State, state: State) -> None:
    """Copy a start into the replay model and optimizer in place, refusing one that does not fit
    (the checks of `replay.step.load_training_state`); a no-op when it was fetched in place."""
    if set(state) != set(live):
        missing, extra = sorted(set(live) - set(state)), sorted(set(state) - set(live))
        raise StateError(f"state names do not match the model: missing {missing[:3]}, extra {extra[:3]}")
    step = state["step"]
    if step.dim() != 0 or step.dtype != torch.float32 or not bool(torch.isfinite(step)) or float(step) < 0:
        raise StateError("state 'step' must be a finite non-negative float32 scalar")
    with torch.no_grad():
        for k, t in live.items():
            src = state[k]
            if src.shape != t.shape or src.dtype != t.dtype:
                raise StateError(f"{k}: {src.dtype}{list(src.shape)} != {t.dtype}{list(t.shape)}")
            if src.data_ptr() != t.data_ptr():
                t.copy_(src)
        assert ctx.opt is not None
        for p in ctx.model.parameters():  # every parameter carries its own step counter
            ctx.opt.state[p]["step"].copy_(step)


def rebuild_start(
    job: Job, ctx: ReplayContext, source: BlobSource, leaf: str, into: State | None = None
) -> State:
    """Segment 0's start from what the verifier already has: G_n's params and the host's carried
    optimizer state (fresh zeros, or the chain's `prev_optimizer_hash`, from the source at most
    once per host), built in `into` (the live replay state) when given. Only if that does not hash
    to the committed leaf 0 is the host's claimed start fetched, to say what is wrong with it
    (WRONG_START either way)."""
    c = job.cfg.state_chunk_bytes
    opt_into = None if into is None else {k: t for k, t in into.items() if not k.startswith(PARAM)}
    if job.prev_optimizer_hash is None and opt_into is not None:  # fresh: zero the live moments
        with torch.no_grad():
            for t in opt_into.values():
                t.zero_()
        opt_state: State | None = opt_into
    elif job.prev_optimizer_hash is None:
        opt_state = fresh_optimizer_state(ctx.model, job)
    elif getattr(source, "optimizer", None) is not None:
        opt_state = _fetch(source, "optimizer", job.prev_optimizer_hash, opt_into)
    else:
        opt_state = None
    if opt_state is not None:
        if into is not None:  # G_n's params straight into the live ones, one tensor at a time
            live_params = {k: t for k, t in into.items() if k.startswith(PARAM)}
            shapes = {k[len(PARAM) :]: tuple(t.shape) for k, t in live_params.items()}
            if layout_of(ctx.global_params) != shapes:  # our own G_n: not the host's fault
                raise StateError("G_n does not fit the replay model")
            with torch.no_grad():
                for k in sorted(live_params):
                    live_params[k].copy_(ctx.global_params[k[len(PARAM) :]])
            fill_live(ctx, into, {**live_params, **opt_state})
            rebuilt = into
        else:
            rebuilt = {**{PARAM + n: t for n, t in ctx.global_params.items()}, **opt_state}
        if training_hash(rebuilt, c) == leaf:
            return rebuilt
    try:
        claimed = _fetch(source, "state", leaf, into)  # into the live state: it is rejected either way
    except MissingData:
        if opt_state is None:
            raise
        # the start is fixed by chain data alone: a leaf 0 that is not it is wrong, served or not
        # (an honest host need not serve segment 0's start, so a wrong one is rarely served)
        raise Rejected(Reason.WRONG_START, "start leaf is not the rule's start (and is not served)") from None
    check_start(job, ctx, claimed)
    if opt_state is not None:
        raise Rejected(Reason.WRONG_START, "start leaf is not G_n with the carried optimizer state")
    return claimed


def _claim_if_served(source: BlobSource, leaf: str) -> State | None:
    """A claimed end state, or None if nobody serves it (a mismatch stays a REPLAY_MISMATCH)."""
    try:
        return _checked_state(source, leaf)
    except (MissingData, MalformedBlob):
        return None


def _start_again(job: Job, ctx: ReplayContext, source: BlobSource, o: OpeningData) -> State | None:
    """A start that was written into the live state and replayed over, for the distance of a
    mismatch (bitwise mode keeps no copy): rebuilt or fetched again; None if that fails."""
    try:
        if o.segment == 0:
            return rebuild_start(job, ctx, source, o.start_leaf)
        return _checked_state(source, o.start_leaf)
    except (MissingData, MalformedBlob, Rejected):
        return None


def eager_context(job: Job, ctx: ReplayContext, source: BlobSource) -> ReplayContext:
    """For a job with a parent Δ: the context whose `global_params` are the eager start, the params
    half of Nesterov(G_{n−1}, decoded parent Δ) computed tensor by tensor when read (never held
    whole). The parent payload comes from the source by its hash (every chunk checked); one that
    hashes right and does not decode is the host's own committed Δ: no start can be built from it."""
    if job.parent_delta_hash is None:
        return ctx
    if ctx.global_momentum is None:  # our own set-up, not the host's fault
        raise ValueError("a job with a parent Δ needs G's momentum in the replay context")
    payload = source.delta(job.parent_delta_hash)
    try:
        start = EagerStart(ctx.global_params, ctx.global_momentum, payload, job.cfg.outer)
    except CodecError as e:
        raise MalformedBlob(f"parent Δ {job.parent_delta_hash[:12]}: {e}") from e
    return dataclasses.replace(ctx, global_params=start)


def check_any_delta(job: Job, ctx: ReplayContext, source: BlobSource, final: State) -> bytes:
    """The Δ check of the run's codec against θ_H (`final`'s parameters); returns the payload."""
    if job.cfg.codec is Codec.SPARSE:
        return check_ef_delta(job, ctx, final, source, served=job.cfg.replay_mode is not ReplayMode.BITWISE)
    return check_delta(job, ctx, final, None if job.cfg.replay_mode is ReplayMode.BITWISE else source)


def theta_h(job: Job, source: BlobSource) -> State:
    """θ_H for a dispute panel member's Δ check (Δ first, before it replays anything): the
    parameters of the state whose hash is the last leaf (from the chain's opening of segment
    n − 1), fetched alone where the source can, every chunk checked against that leaf."""
    last = job.cfg.n_segments - 1
    tail = next((o for o in job.openings if o.segment == last), None)
    if tail is None:  # check_proofs: the last segment is always opened
        raise Rejected(Reason.BAD_PROOF, "the last segment was not opened")
    fetch = getattr(source, "params", None)
    if fetch is None:
        return {k: t for k, t in _checked_state(source, tail.end_leaf).items() if k.startswith(PARAM)}
    params: State = fetch(tail.end_leaf)
    return params


# ---------------------------------------------------------------- the whole verification


def verify(job: Job, source: BlobSource, ctx: ReplayContext) -> Judgement:
    """Run every check in order; the first failure decides the reason. Never raises on host data.

    Order: proofs and claims (free) → per sampled segment: start state, replay, compare → Δ
    against θ_H (`Job.checks_delta`; a window short of θ_H fetches the committed Δ to keep).
    Whether this verifier may judge at all (its own environment) is `check_verifier_env`'s call.
    """
    replayed: list[str] = []
    steps = 0
    seconds = 0.0
    try:
        check_proofs(job)
        check_claims(job)
        ctx = eager_context(job, ctx, source)
        final: State | None = None
        last = job.cfg.n_segments - 1
        bitwise = job.cfg.replay_mode is ReplayMode.BITWISE
        chunk = job.cfg.state_chunk_bytes
        # Every start is written into the replay model's own tensors (fetched in place where the
        # source can): a verification holds one training state, plus a copy of the start only in
        # tolerance mode. `at`: the boundary the live state holds, bitwise equal to the host's.
        live = ctx.live(job)
        at: int | None = None
        # a dispute panel member checks Δ first (from θ_H's committed leaf), then the disputed
        # windows: its verdict answers the Δ question whatever it finds in them (specs §2.5.3)
        payload = check_any_delta(job, ctx, source, theta_h(job, source)) if job.delta_first else None
        summed = any(math.isfinite(t) for t in job.cfg.cumulative_tolerances.values())  # §6.4 set
        total = Cumulative() if job.cfg.replay_mode is ReplayMode.TOLERANCE and summed else None
        replays = set(job.replays)
        for o in sorted(job.openings, key=lambda o: o.segment):
            if o.segment not in replays:
                continue
            if at != o.segment:
                if o.segment == 0:
                    opened = rebuild_start(job, ctx, source, o.start_leaf, into=live)
                else:
                    opened = _fetch(source, "state", o.start_leaf, live)
                try:
                    fill_live(ctx, live, opened)
                except StateError as e:
                    raise MalformedBlob(f"segment {o.segment} start state does not load: {e}") from e
                del opened  # in the live tensors now: not a second state held through the replay
                if o.segment > 0:  # the host's claim for the end of segment o − 1, opened or not
                    bad = genuine_mismatch(live, job.cfg.inner)
                    if bad is not None:
                        raise Rejected(Reason.REPLAY_MISMATCH, f"segment {o.segment}: start is not a "
                                                              f"genuine AdamW state: {bad}")  # fmt: skip
            start: State | None = None if bitwise else host_state(live)  # a copy in host memory, like `claim`
            t0 = time.perf_counter()
            k = job.cfg.segment_len
            if ctx.opt is None:
                raise CannotVerify("replay context has no optimizer")
            train_segment(replay_job(job, ctx), ctx.model, ctx.opt, o.segment * k, k)
            ctx.on_replay_steps(job.cfg.segment_len)
            seconds += time.perf_counter() - t0
            steps += job.cfg.segment_len
            end = host_view(live)  # the live state itself on CPU; a host copy of a GPU replay
            leaf = training_hash(end, chunk)
            replayed.append(leaf)
            claim = None
            if job.cfg.replay_mode is ReplayMode.TOLERANCE:
                claim = _checked_state(source, o.end_leaf)
            elif leaf != o.end_leaf:  # only for the distance in the verdict's detail: in bitwise
                claim = _claim_if_served(source, o.end_leaf)  # mode hosts need not keep ends
            if leaf != o.end_leaf:
                start = start if start is not None else _start_again(job, ctx, source, o)
                known = claim is not None and start is not None
                if job.cfg.replay_mode is ReplayMode.TOLERANCE and known:
                    why = tolerance_mismatch(end, claim, start, job.cfg.tolerances, job.cfg.inner)  # type: ignore[arg-type]
                else:
                    dist = param_distance(end, claim, start) if known else math.inf  # type: ignore[arg-type]
                    why = f"param distance {dist:.3e}"
                if why is not None:
                    raise Rejected(
                        Reason.REPLAY_MISMATCH,
                        f"segment {o.segment}: replay {leaf[:12]} != committed {o.end_leaf[:12]}, {why}",
                    )
            if total is not None and claim is not None and start is not None:  # sampling segments' last
                # is in every challenge: the drawn ones are also summed without it (specs §6.4)
                forced = o.segment == last and job.window is None and not job.cfg.windowed
                total.add(end, claim, start, job.cfg.inner, forced=forced)
            at = o.segment + 1 if bitwise and leaf == o.end_leaf else None
            if o.segment == last:
                final = claim if claim is not None else end
            del start, claim
        if total is not None:  # the replayed segments together: residuals that add up (specs §6.4)
            why = cumulative_mismatch(total, job.cfg.cumulative_tolerances)
            if why is not None:
                raise Rejected(Reason.REPLAY_MISMATCH, why)
        whole = final is not None  # we replayed the last segment: its end state, moments and all
        if final is not None and optimizer_hash(final, chunk) != job.final_optimizer_hash:
            raise Rejected(Reason.REPLAY_MISMATCH, "final optimizer hash is not the last boundary's")
        if payload is None and not job.checks_delta:  # a window short of θ_H: the committed Δ, to
            payload = source.delta(job.delta_hash)  # keep and serve (specs §6), every chunk checked
        elif payload is None:  # it replayed segment n − 1: θ_H is its end
            payload = check_any_delta(job, ctx, source, final if final is not None else theta_h(job, source))
        if ctx.on_derived is not None:  # tolerance mode: the checked claim and the downloaded Δ
            ctx.on_derived(final if whole else None, payload)
        reason, detail = Reason.ACCEPT, ""
    except Rejected as r:
        reason, detail = r.reason, r.detail
    except MissingData as e:
        reason, detail = Reason.MISSING_DATA, str(e)
    except MalformedBlob as e:
        reason, detail = Reason.MALFORMED_BLOB, str(e)
    detail = detail[:256]
    evidence = evidence_hash(job, reason, replayed, detail)
    return Judgement(reason, detail, evidence, tuple(replayed), steps, seconds)
