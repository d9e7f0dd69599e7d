"""Error feedback for the sparse codec (SparseLoCo, Sarfi et al. 2025), as carried, verified state.

A host keeps an accumulator e (float32, the model's layout). At the end of outer step n it folds
its pseudo-gradient in, sends the compressed accumulator and keeps the rest:

    a      = β·e + Δ              (Δ = θ_start − θ_H; element-wise float32, β rounded once)
    send   = C(a)                 (the canonical sparse payload, `protocol.codecs`, specs §4.1)
    e_next = a − decode(C(a))     (only the kept positions change; the others keep a exactly)

C is a pure function of a and a is a pure function of (e, θ_start, θ_H), so a verifier that
replayed θ_H bit for bit and knows the e the chain names rebuilds the payload and e_next exactly
and compares both hashes with the commitment: a sparse Δ whose indices or values are not C(a),
or a carried e that is not a − C(a), is DELTA_MISMATCH. e is a host's carried state like its
AdamW moments: hashed as the tensor set of kind `error_feedback` (names = the model's parameter
names), committed with the Δ, named by the chain in the next start state (zeros when it names
none: a fresh host, or one whose last contribution did not enter the model).

Everything streams tensor by tensor (`ef_tensors`): the host and the verifier hold one fp32
tensor of a, e and Δ at a time beside the (small) payload.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import torch
from torch import Tensor

from protocol import chunks, codecs
from protocol.chunks import DEFAULT_CHUNK_BYTES
from protocol.codecs import CodecError, Layout
from protocol.config import Codec, RunConfig
from protocol.outer import f32_nearest
from protocol.tensors import StateKind, canonical_header, domain, tensor_hash

Tensors = Mapping[str, Tensor]
EFSource = Mapping[str, Tensor] | Callable[[str], Tensor] | None
"""The carried e: a mapping, a loader called once per name (a memory-mapped file), or None (zeros)."""

_ZERO_PIECE = 1 << 26


class EFError(ValueError):
    """An accumulator that does not fit the layout (names, shapes, dtype, NaN/Inf)."""


@dataclass(frozen=True)
class EFConfig:
    """The run's sparse codec and error-feedback decay: what a payload and e_next depend on."""

    chunk: int
    topk: int
    decay: float = 1.0

    @classmethod
    def of(cls, cfg: RunConfig) -> EFConfig:
        if cfg.codec is not Codec.SPARSE:
            raise EFError(f"error feedback needs codec 'sparse', the run uses {cfg.codec.value!r}")
        return cls(cfg.codec_block_size, cfg.sparse_topk, cfg.codec_ef_decay)

    @property
    def beta(self) -> Tensor:
        """β rounded once to float32 (exact rational of the float, ties to even), as a 0-dim tensor."""
        return torch.tensor(float(f32_nearest(Fraction(self.decay))), dtype=torch.float32)


@dataclass(frozen=True)
class EFTensor:
    """One tensor's share of an error-feedback step."""

    name: str
    body: bytes
    """Its part of the payload body (`protocol.codecs` sparse layout)."""
    e_next: Tensor
    """a − decode(C(a)) for this tensor: what the host carries."""
    sent: codecs.SparseEntries
    """The kept positions and decoded values (what every aggregator adds)."""


def ef_hash(e: Tensors, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> str:
    """The committed hash of a carried accumulator: its tensor set, kind `error_feedback`."""
    return tensor_hash(e, StateKind.ERROR_FEEDBACK, chunk_bytes)


def fresh_ef(layout: Layout) -> dict[str, Tensor]:
    """The accumulator of a host the chain names none for: zeros."""
    return {n: torch.zeros(tuple(s), dtype=torch.float32) for n, s in layout.items()}


def fresh_ef_hash(layout: Layout, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> str:
    """`ef_hash(fresh_ef(layout))` without allocating the zeros (one 64 MiB zero buffer reused)."""
    specs = [(n, torch.float32, tuple(s)) for n, s in layout.items()]
    total = sum(4 * int(np.prod(s, dtype=np.int64)) for _, _, s in specs)
    zero = memoryview(bytes(min(_ZERO_PIECE, max(1, total))))

    def pieces() -> Iterator[memoryview | bytes]:
        yield canonical_header(specs)
        left = total
        while left > 0:
            n = min(left, len(zero))
            yield zero[:n]
            left -= n

    return chunks.hash_stream(domain(StateKind.ERROR_FEEDBACK), pieces(), chunk_bytes)[0]


def _carried(e: EFSource, name: str, shape: tuple[int, ...]) -> Tensor:
    if e is None:
        return torch.zeros(shape, dtype=torch.float32)
    try:
        t = e(name) if callable(e) else e[name]
    except KeyError as exc:
        raise EFError(f"accumulator has no tensor {name!r}") from exc
    if not isinstance(t, Tensor) or t.dtype != torch.float32 or tuple(t.shape) != shape:
        raise EFError(f"accumulator {name!r} must be float32 of shape {shape}")
    if not bool(torch.isfinite(t).all()):
        raise EFError(f"accumulator {name!r} holds NaN or Inf")
    return t.detach().to("cpu").contiguous()


def check_ef(e: Tensors, layout: Layout) -> None:
    """An accumulator fetched from another node: exactly the layout's names, float32, finite."""
    if set(e) != set(layout):
        missing, extra = sorted(set(layout) - set(e)), sorted(set(e) - set(layout))
        raise EFError(f"accumulator names differ from the layout: missing {missing[:3]}, extra {extra[:3]}")
    for name, shape in layout.items():
        _carried(e, name, tuple(shape))


def ef_tensors(
    deltas: Iterable[tuple[str, Tensor]], e: EFSource, layout: Layout, cfg: EFConfig
) -> Iterator[EFTensor]:
    """The step tensor by tensor, in payload (name) order: Δ given one tensor at a time (e.g.
    θ_start[n] − θ_H[n] as the host or the verifier computes it), e read by name."""
    beta = cfg.beta
    entries = codecs.layout_entries(layout)
    for name, delta in codecs.checked_items(deltas, entries):
        a = torch.add(torch.mul(_carried(e, name, tuple(delta.shape)), beta), delta)
        if not bool(torch.isfinite(a).all()):
            raise CodecError(f"{name!r}: β·e + Δ overflows float32")
        body, sent = codecs.sparse_encode(a, cfg.chunk, cfg.topk)
        flat = a.reshape(-1)  # a is ours: e_next is a with the sent values taken off in place
        flat[sent.positions] = torch.sub(flat[sent.positions], sent.values)
        yield EFTensor(name, body, a, sent)
        del a, flat, delta


def ef_header(layout: Layout, cfg: EFConfig) -> bytes:
    """The payload's header: fixed by the layout and the codec parameters alone."""
    return codecs.payload_header(Codec.SPARSE, cfg.chunk, layout, cfg.topk)


def ef_step(e: EFSource, delta: Tensors, cfg: EFConfig) -> tuple[bytes, dict[str, Tensor]]:
    """(payload, e_next) from the carried e (None = zeros) and a whole Δ: `ef_tensors` joined."""
    if not isinstance(delta, Mapping) or not delta:
        raise CodecError("expected a non-empty mapping of name -> tensor")
    for name, t in delta.items():
        if not isinstance(t, Tensor):
            raise CodecError(f"{name!r}: expected a floating-point tensor")
    layout = {n: tuple(t.shape) for n, t in delta.items()}
    ordered = ((n, delta[n]) for n in sorted(delta, key=lambda n: n.encode()))
    bodies, e_next = [], {}
    for ef in ef_tensors(ordered, e, layout, cfg):
        bodies.append(ef.body)
        e_next[ef.name] = ef.e_next
    return ef_header(layout, cfg) + b"".join(bodies), e_next


@dataclass(frozen=True)
class EFCheck:
    """What a verifier finds: `ok` iff both the Δ payload and the carried e are the honest ones."""

    ok: bool
    detail: str
    payload: bytes
    """The canonical payload it derived (it keeps and serves it, as for the dense codecs)."""
    delta_hash: str
    ef_hash: str


def verify_ef_step(
    e: EFSource,
    deltas: Iterable[tuple[str, Tensor]],
    layout: Layout,
    cfg: EFConfig,
    *,
    delta_hash: str,
    ef_hash_committed: str,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> EFCheck:
    """Rebuild C(β·e + Δ) and e_next from the verifier's own Δ (θ_start − θ_H of its replay) and
    the e the chain names, and compare both hashes with the commitment (DELTA_MISMATCH if not)."""
    bodies, e_next = [], {}
    for t in ef_tensors(deltas, e, layout, cfg):
        bodies.append(t.body)
        e_next[t.name] = t.e_next
    payload = ef_header(layout, cfg) + b"".join(bodies)
    mine_d = codecs.delta_hash(payload, chunk_bytes)
    mine_e = ef_hash(e_next, chunk_bytes)
    if mine_d != delta_hash:
        detail = f"committed Δ {delta_hash[:12]} != C(β·e + θ_start − θ_H) {mine_d[:12]}"
    elif mine_e != ef_hash_committed:
        detail = f"committed e {ef_hash_committed[:12]} != a − C(a) {mine_e[:12]}"
    else:
        detail = ""
    return EFCheck(not detail, detail, payload, mine_d, mine_e)
