"""The Δ checks (specs §4, §4.1): the committed payload is exactly the run's encoding of
θ_start − θ_H, where θ_H is the end state the verifier judged (bitwise mode: its own replay;
tolerance mode: the checked claimed end); with codec sparse it is C(β·e + Δ) and the committed
e_next is a − C(a), rebuilt from the e the chain names. Δ is computed tensor by tensor: no fp32 Δ
of the whole model is ever held.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import torch
from torch import Tensor

from nodekit.store import StoreError
from protocol import codecs
from protocol.codecs import CodecError
from protocol.errorfeedback import EFConfig, EFError, ef_header, ef_tensors
from protocol.messages import Reason
from replay.step import State
from verifier.job import BlobSource, CannotVerify, Job, MalformedBlob, MemoryEF, Rejected, ReplayContext
from verifier.tolerance import PARAM


def layout_of(params: Mapping[str, Tensor]) -> dict[str, tuple[int, ...]]:
    """Shapes by name without reading tensors a `StoredTensors` G_n would load from disk."""
    shapes = getattr(params, "shapes", None)
    return dict(shapes) if shapes is not None else {n: tuple(t.shape) for n, t in params.items()}


def check_delta(job: Job, ctx: ReplayContext, final: State, source: BlobSource | None) -> bytes:
    """Committed Δ hash == hash of encode(θ_global − θ_H); the served payload is exactly that one.

    With `source` None (bitwise mode: `final` is our own replay, bit for bit the host's θ_H) the Δ
    is not downloaded at all. Returns the payload we derived."""
    cfg = job.cfg
    layout = layout_of(ctx.global_params)
    delta = _deltas(ctx, final, layout)
    payload = b"".join(codecs.encode_pieces(delta, layout, cfg.codec, cfg.codec_block_size))
    mine = codecs.delta_hash(payload, cfg.state_chunk_bytes)
    if mine != job.delta_hash:
        detail = f"committed Δ {job.delta_hash[:12]} != θ_global−θ_H {mine[:12]}"
        raise Rejected(Reason.DELTA_MISMATCH, detail)
    return _served_matches(job, layout, payload, source)


def _deltas(
    ctx: ReplayContext, final: State, layout: Mapping[str, tuple[int, ...]]
) -> Iterator[tuple[str, Tensor]]:
    """Δ = θ_start − θ_H tensor by tensor, in name order: no fp32 Δ of the whole model."""
    for name in sorted(layout):
        want = ctx.global_params[name]
        theta = final.get(PARAM + name)
        if theta is None or theta.shape != want.shape:
            raise Rejected(Reason.DELTA_MISMATCH, f"final state lacks param {name}")
        d = want - theta
        if not bool(torch.isfinite(d).all()):
            raise Rejected(Reason.DELTA_MISMATCH, f"Δ of {name} is not finite")
        yield name, d


def check_ef_delta(job: Job, ctx: ReplayContext, final: State, source: BlobSource, served: bool) -> bytes:
    """Codec sparse (specs §4.1): the committed Δ is C(β·e + θ_start − θ_H) and the committed e_next
    is a − decode(C(a)), both rebuilt from `final` (bitwise: our replay; tolerance: the checked
    claimed end, whose θ_H the host encoded) and the e the chain names (fetched by hash; none:
    zeros). Either hash differing is DELTA_MISMATCH. With `served` (tolerance mode) the downloaded
    payload must also be the one we derived. Returns the payload; e_next is in `ctx.ef_sink`."""
    cfg, efc = job.cfg, EFConfig.of(job.cfg)
    layout = layout_of(ctx.global_params)
    e: Mapping[str, Tensor] | None = None
    if job.start_ef_hash is not None:
        fetch = getattr(source, "error_feedback", None)
        if fetch is None:
            raise CannotVerify("this blob source cannot fetch an error-feedback accumulator")
        e = fetch(job.start_ef_hash)  # every chunk checked against the hash the chain names
    if not job.final_ef_hash:
        raise Rejected(Reason.DELTA_MISMATCH, "a sparse commit without the hash of its e_next")
    sink = ctx.ef_sink(layout) if ctx.ef_sink is not None else MemoryEF(layout, cfg.state_chunk_bytes)
    bodies = []
    try:
        for t in ef_tensors(_deltas(ctx, final, layout), e, layout, efc):
            bodies.append(t.body)
            sink.write(t.name, t.e_next)
            del t
    except EFError as err:
        sink.abort()
        raise MalformedBlob(f"start accumulator {job.start_ef_hash or 'zeros'}: {err}") from err
    except CodecError as err:
        sink.abort()
        raise Rejected(Reason.DELTA_MISMATCH, f"β·e + Δ cannot be encoded: {err}") from err
    except StoreError as err:  # our own copy of the accumulator broke on disk: not the host's fault
        sink.abort()
        raise CannotVerify(f"start accumulator unreadable here: {err}") from err
    except BaseException:
        sink.abort()
        raise
    payload = ef_header(layout, efc) + b"".join(bodies)
    mine = codecs.delta_hash(payload, cfg.state_chunk_bytes)
    if mine != job.delta_hash:
        sink.abort()
        raise Rejected(
            Reason.DELTA_MISMATCH, f"committed Δ {job.delta_hash[:12]} != C(β·e + θ_start − θ_H) {mine[:12]}"
        )
    got = sink.finish()
    if got != job.final_ef_hash:
        raise Rejected(Reason.DELTA_MISMATCH, f"committed e {job.final_ef_hash[:12]} != a − C(a) {got[:12]}")
    return _served_matches(job, layout, payload, source if served else None)


def _served_matches(
    job: Job, layout: Mapping[str, tuple[int, ...]], payload: bytes, source: BlobSource | None
) -> bytes:
    """Tolerance mode: the payload the host serves must decode and be exactly the one we derived."""
    if source is None:
        return payload
    served = source.delta(job.delta_hash)  # the source checked every chunk against the hash
    try:
        codecs.decode(served, layout)  # what every host will do with it: must not fail
    except codecs.CodecError as e:
        raise MalformedBlob(f"Δ payload: {e}") from e
    if served != payload:
        raise MalformedBlob("served Δ payload differs from the committed Δ")
    return payload
