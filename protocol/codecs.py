"""Pseudo-gradient codecs: one canonical quantized payload per Δ.

The payload's hash is what a host commits (`delta_hash`, a chunked content hash), and the payload
itself is what nodes serve: chunk by chunk, each chunk checked on arrival, from any holder. zstd
saves 2.5% of an int8 payload (bench.codecs), too little to give up byte ranges of the committed
bytes for, so `to_blob`/`from_blob` (zstd around the body; the header is checked against the
layout before decompressing and the decompressed size bounded) are kept for offline use only.

Payload (integers little-endian)::

    magic b"GDPG" | version u8 = 1 | codec u8 | 2 zero bytes | block_size u32 | count u32
    count x ( name_len u16 | name (UTF-8) | ndim u8 | dims u64 x ndim )   names strictly sorted
    body_len u64
    body: per tensor, in name order
      fp32: n x float32                   bf16: n x bfloat16 (round to nearest even)
      int8: ceil(n/B) x float32 scale, then n x int8 in [-127, 127]
      int4: ceil(n/B) x float32 scale, then ceil(n/2) bytes, element 2i in the low nibble,
            2i+1 in the high nibble, two's complement in [-7, 7], a padding nibble is 0
      sparse (codec 5; the 2 bytes after the codec hold k as u16, block_size is the chunk C):
            ceil(n/C) x float32 scale, then K x b-bit chunk-local indices, then K x 2-bit codes,
            each a little-endian bit stream zero-padded to a byte (b = bitlen(C - 1), K below)

Blockwise absmax: a tensor (flattened, C order) is cut into blocks of B elements, the last one
possibly short; scale = float32(absmax / Q) with Q = 127 (int8) or 7 (int4); q = clamp(round(x /
scale)) with round half to even (torch.round), element-wise float32 division; a block whose
scale is 0 (all zero, or absmax so small the division underflows) stores q = 0. Decoding gives
q * scale in float32. For fp32/bf16 the stored block size is 0: it does not affect the bytes.

Sparse (specs §4.1): a tensor (flattened) is cut into chunks of C elements, the last one possibly
short (length L, keeping k_L = ceil(k·L/C) entries; full chunks keep k). In each chunk the k
entries of largest |x| are kept, ties broken by the lower index: the order is the total order of
the integer key (float32 bits of |x|) · 2^b + (C − 1 − index), so the selection is a pure function
of the values. Kept indices are written in increasing order. The chunk's scale s is the mean of
the kept magnitudes: acc = +0, acc = acc + |x_j| over the kept entries in index order (float32,
one rounding each), s = acc / k_chunk (float32 division). Each kept entry is 2 bits: bit 0 = 1 if
|x_j| ≥ s (and s > 0), bit 1 = 1 if x_j < 0 (and s > 0); it decodes to ±(s × LEVELS[bit 0]) with
LEVELS = (SPARSE_LO, SPARSE_HI), one float32 multiplication. A chunk with s = 0 stores codes 0
and decodes to +0. Unkept entries decode to +0.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np
import torch
import zstandard

from protocol import chunks
from protocol.chunks import DEFAULT_CHUNK_BYTES
from protocol.config import Codec
from protocol.tensors import ByteReader

Layout = Mapping[str, tuple[int, ...]]

MAGIC = b"GDPG"
VERSION = 1
MIN_BLOCK, MAX_BLOCK = 8, 1 << 20
MAX_TENSORS = 1 << 16
MAX_NAME_BYTES = 1024
MAX_NDIM = 16
ZSTD_LEVEL = 3
DELTA_DOMAIN = b"gonka-diloco/delta/v1\x00"

_CODE = {Codec.FP32: 1, Codec.BF16: 2, Codec.INT8: 3, Codec.INT4: 4, Codec.SPARSE: 5}
_CODEC_OF = {v: k for k, v in _CODE.items()}
_QMAX = {Codec.INT8: 127, Codec.INT4: 7}
_PREAMBLE = struct.Struct("<4sBBHII")

SPARSE_MAX_CHUNK = 1 << 16
"""Largest sparse chunk C: indices fit 16 bits and k (≤ C) the header's u16."""
SPARSE_MAX_TOPK = (1 << 16) - 1
SPARSE_DENSITY_DIVISOR = 64
"""`codec_topk = 0` keeps k = max(1, ⌊C/64⌋) per chunk: 1.5625%, SparseLoCo's 64 of 4096."""
SPARSE_LO, SPARSE_HI = 0.96875, 1.03125
"""The two magnitudes of a kept entry, 31/32 and 33/32 of its chunk's mean kept magnitude s (exact
in float32). Chosen by measurement (`bench.codecs`, RESULTS §4): the kept entries are a chunk's
top 1.6%, and on the error-feedback accumulators of a real run their magnitudes sit within a few
percent of their mean, so levels close to s, split at s, err less than sign × s (1 bit), than wider
pairs or than levels over the chunk's absmax."""
_PACK_PIECE = 1 << 20
"""Entries packed or unpacked per numpy call (a multiple of 8, so a piece ends on a byte)."""
_SELECT_ELEMENTS = 1 << 22
"""Elements ranked at once: top-k keys are int64, so this bounds the temporary memory."""
_U16 = struct.Struct("<H")
_U8 = struct.Struct("<B")
_U64 = struct.Struct("<Q")


class CodecError(ValueError):
    """Anything wrong with a Δ to encode, a payload, or a blob. The only error this module raises."""


@dataclass(frozen=True)
class PayloadHeader:
    codec: Codec
    block_size: int
    shapes: dict[str, tuple[int, ...]]
    body_len: int
    header_len: int
    topk: int = 0
    """Sparse: entries kept per chunk of `block_size` (0 for the other codecs)."""

    def spans(self) -> dict[str, tuple[int, int]]:
        """name -> [start, end) of its body inside the payload: any tensor is read alone."""
        out, pos = {}, self.header_len
        for name, shape in self.shapes.items():
            size = _tensor_body_len(self.codec, self.block_size or 1, _numel(shape), self.topk)
            out[name] = (pos, pos + size)
            pos += size
        return out


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def default_topk(chunk: int) -> int:
    """k when a run leaves `codec_topk` at 0: ⌊C/64⌋ entries per chunk, at least one."""
    return max(1, chunk // SPARSE_DENSITY_DIVISOR)


def index_bits(chunk: int) -> int:
    """Bits of one chunk-local index: bitlen(C − 1), at least 1."""
    return max(1, (chunk - 1).bit_length())


def sparse_counts(n: int, chunk: int, topk: int) -> tuple[int, int, int]:
    """(full chunks, entries kept in the short last chunk (0 if there is none), total kept K)."""
    full, tail = divmod(n, chunk)
    k_tail = -(-topk * tail // chunk) if tail else 0
    return full, k_tail, full * topk + k_tail


def _sparse_body_len(n: int, chunk: int, topk: int) -> int:
    full, k_tail, kept = sparse_counts(n, chunk, topk)
    chunks = full + (1 if k_tail else 0)
    return 4 * chunks + -(-kept * index_bits(chunk) // 8) + -(-kept // 4)


def _tensor_body_len(codec: Codec, block_size: int, n: int, topk: int = 0) -> int:
    if codec is Codec.FP32:
        return 4 * n
    if codec is Codec.BF16:
        return 2 * n
    if codec is Codec.SPARSE:
        return _sparse_body_len(n, block_size, topk)
    scales = 4 * (-(-n // block_size))
    return scales + (n if codec is Codec.INT8 else (n + 1) // 2)


def body_len(codec: Codec, block_size: int, layout: Layout, topk: int | None = None) -> int:
    """Exact body size a layout implies: how a receiver bounds a blob before reading it."""
    c = _codec(codec)
    k = _stored_topk(c, block_size, topk)
    return sum(_tensor_body_len(c, block_size, _numel(s), k) for s in layout.values())


def _codec(codec: Codec | str) -> Codec:
    try:
        return Codec(codec)
    except ValueError as e:
        raise CodecError(f"unknown codec {codec!r}") from e


def _stored_block(codec: Codec, block_size: int) -> int:
    if not isinstance(block_size, int) or not MIN_BLOCK <= block_size <= MAX_BLOCK:
        raise CodecError(f"block size {block_size!r} outside [{MIN_BLOCK}, {MAX_BLOCK}]")
    if codec is Codec.SPARSE and block_size > SPARSE_MAX_CHUNK:
        raise CodecError(f"sparse chunk {block_size} exceeds {SPARSE_MAX_CHUNK}")
    return block_size if codec in _QMAX or codec is Codec.SPARSE else 0


def _stored_topk(codec: Codec, block_size: int, topk: int | None) -> int:
    """k as the header stores it: 0 for dense codecs; for sparse 1 ≤ k ≤ min(C, 65535)
    (None or 0 = `default_topk(C)`)."""
    if codec is not Codec.SPARSE:
        if topk:
            raise CodecError(f"codec {codec.value} takes no topk (got {topk!r})")
        return 0
    if topk is None or topk == 0:
        return default_topk(block_size)
    top = min(block_size, SPARSE_MAX_TOPK)
    if not isinstance(topk, int) or isinstance(topk, bool) or not 1 <= topk <= top:
        raise CodecError(f"topk {topk!r} outside [1, {top}] for chunk {block_size}")
    return topk


def _name_bytes(name: object) -> bytes:
    if not isinstance(name, str) or not name:
        raise CodecError(f"tensor names must be non-empty str, got {name!r}")
    try:
        raw = name.encode("utf-8")
    except UnicodeEncodeError as e:
        raise CodecError(f"tensor name {name!r} is not valid UTF-8") from e
    if len(raw) > MAX_NAME_BYTES:
        raise CodecError(f"tensor name longer than {MAX_NAME_BYTES} bytes")
    return raw


def _header(
    codec: Codec, block: int, entries: list[tuple[bytes, tuple[int, ...]]], blen: int, topk: int = 0
) -> bytes:
    parts = [_PREAMBLE.pack(MAGIC, VERSION, _CODE[codec], topk, block, len(entries))]
    for raw, shape in entries:
        if len(shape) > MAX_NDIM:
            raise CodecError(f"{raw.decode()!r}: more than {MAX_NDIM} dimensions")
        parts += [_U16.pack(len(raw)), raw, _U8.pack(len(shape)), *(_U64.pack(d) for d in shape)]
    parts.append(_U64.pack(blen))
    return b"".join(parts)


def _blocks(x: torch.Tensor, block: int) -> torch.Tensor:
    """Flattened x, zero-padded to whole blocks, as (n_blocks, block)."""
    n = x.numel()
    nb = -(-n // block)
    padded = torch.zeros(nb * block, dtype=torch.float32)
    padded[:n] = x.reshape(-1)
    return padded.view(nb, block)


def _quantize(x: torch.Tensor, codec: Codec, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    qmax = _QMAX[codec]
    b = _blocks(x, block)
    scales = b.abs().amax(dim=1) / qmax if b.numel() else torch.zeros(0)
    safe = torch.where(scales > 0, scales, torch.ones_like(scales))
    q = torch.round(b / safe[:, None]).clamp_(-qmax, qmax)
    q = torch.where((scales > 0)[:, None], q, torch.zeros_like(q))
    return scales, q.reshape(-1)[: x.numel()].to(torch.int8)


def _le(arr: np.ndarray, dtype: str) -> bytes:
    return arr.astype(np.dtype(dtype), copy=False).tobytes()


def _encode_tensor(x: torch.Tensor, codec: Codec, block: int, topk: int = 0) -> bytes:
    if codec is Codec.SPARSE:
        return sparse_encode(x, block, topk)[0]
    if codec is Codec.FP32:
        return _le(x.reshape(-1).numpy(), "<f4")
    if codec is Codec.BF16:
        y = x.reshape(-1).to(torch.bfloat16)
        if not torch.isfinite(y).all():
            raise CodecError("value overflows bfloat16")
        return _le(y.view(torch.int16).numpy(), "<i2")
    scales, q = _quantize(x, codec, block)
    head = _le(scales.numpy(), "<f4")
    if codec is Codec.INT8:
        return head + q.numpy().tobytes()
    nib = (q.to(torch.int16) & 0x0F).to(torch.uint8)
    if nib.numel() % 2:
        nib = torch.cat([nib, torch.zeros(1, dtype=torch.uint8)])
    packed = nib[0::2] | (nib[1::2] << 4)
    return head + packed.numpy().tobytes()


# ---------------------------------------------------------------- sparse: chunk-wise top-k, 2 bits


@dataclass(frozen=True)
class SparseEntries:
    """One tensor's kept entries: flat positions (increasing) and their decoded float32 values.

    What aggregation adds into the running sum and what error feedback subtracts from its
    accumulator: a sparse Δ is never made dense on the way."""

    positions: torch.Tensor
    values: torch.Tensor


def _rank_rows(rows: torch.Tensor, k: int) -> torch.Tensor:
    """Chunk-local indices of the k largest |x| of each row, ties to the lower index, increasing.

    The key (float32 bits of |x|) · 2^b + (C − 1 − index) is unique within a row, so the top-k
    *set* is unique and any correct top-k returns it; sorting the indices fixes their order."""
    width = rows.shape[1]
    bits = index_bits(width) if width > 1 else 1
    keys = rows.abs().view(torch.int32).to(torch.int64) << bits
    keys |= torch.arange(width - 1, -1, -1, dtype=torch.int64)
    top = torch.topk(keys, k, dim=1, sorted=False).indices
    return torch.sort(top, dim=1).values


def _chunk_scales(mags: torch.Tensor) -> torch.Tensor:
    """s = (((+0 + m_0) + m_1) + …) / k per row: sequential float32 adds in index order, one IEEE
    division by a same-shape tensor (a scalar divisor may become a reciprocal multiply)."""
    rows, k = mags.shape
    cols = mags.t().contiguous()
    acc = torch.zeros(rows, dtype=torch.float32)
    for j in range(k):
        acc = torch.add(acc, cols[j])
    return torch.div(acc, torch.full_like(acc, float(k)))


_LEVELS = (torch.tensor(SPARSE_LO, dtype=torch.float32), torch.tensor(SPARSE_HI, dtype=torch.float32))


def _levels(scales: torch.Tensor, hi: torch.Tensor, neg: torch.Tensor) -> torch.Tensor:
    """±(s × LEVELS[hi]) per kept entry (rows of one chunk each)."""
    lo_v, hi_v = torch.mul(scales, _LEVELS[0]), torch.mul(scales, _LEVELS[1])
    level = torch.where(hi, hi_v[:, None], lo_v[:, None])
    return torch.where(neg, torch.neg(level), level)


def _select_rows(x: torch.Tensor, chunk: int, k: int, first: int, rows: int) -> tuple[torch.Tensor, ...]:
    """Rank, scale and quantize `rows` chunks of x from chunk `first` (all of width `chunk`, or
    the one short last chunk): (local indices, codes, decoded values, scales)."""
    start = first * chunk
    block = x[start : start + rows * chunk].view(rows, -1)
    local = _rank_rows(block, k)
    vals = block.gather(1, local)
    mags = vals.abs()
    scales = _chunk_scales(mags)
    if not bool(torch.isfinite(torch.mul(scales, _LEVELS[1])).all()):  # covers an infinite s too
        raise CodecError("value too large for the sparse codec (chunk scale overflows float32)")
    live = (scales > 0)[:, None]
    hi = (mags >= scales[:, None]) & live
    neg = (vals < 0) & live
    codes = (neg.to(torch.uint8) << 1) | hi.to(torch.uint8)
    return local, codes, _levels(scales, hi, neg), scales


def _pack_bits(values: np.ndarray, bits: int) -> bytes:
    """Unsigned integers, `bits` each, as one little-endian bit stream (LSB first), zero-padded."""
    out = []
    shifts = np.arange(bits, dtype=np.uint32)
    for i in range(0, values.size, _PACK_PIECE):
        v = values[i : i + _PACK_PIECE].astype(np.uint32)
        mat = ((v[:, None] >> shifts) & 1).astype(np.uint8)
        out.append(np.packbits(mat.reshape(-1), bitorder="little").tobytes())
    return b"".join(out)


def _unpack_bits(view: memoryview, count: int, bits: int, what: str) -> np.ndarray:
    """Inverse of `_pack_bits`; padding bits after the last value must be zero."""
    raw = np.frombuffer(view, dtype=np.uint8, count=-(-count * bits // 8))
    shifts = np.arange(bits, dtype=np.uint32)
    out = np.empty(count, dtype=np.uint32)
    per = _PACK_PIECE * bits // 8
    for i in range(0, count, _PACK_PIECE):
        n = min(_PACK_PIECE, count - i)
        flat = np.unpackbits(raw[i // _PACK_PIECE * per : i // _PACK_PIECE * per + per], bitorder="little")
        if flat[n * bits :].any():
            raise CodecError(f"nonzero padding bits after the {what}")
        out[i : i + n] = (flat[: n * bits].reshape(n, bits).astype(np.uint32) << shifts).sum(axis=1)
    return out


def sparse_encode(x: torch.Tensor, chunk: int, topk: int) -> tuple[bytes, SparseEntries]:
    """The sparse body of one flattened float32 tensor and the entries it decodes to (for error
    feedback: e_next = x − decoded, at the kept positions only)."""
    flat = x.reshape(-1)
    n = flat.numel()
    full, k_tail, kept = sparse_counts(n, chunk, topk)
    per = max(1, _SELECT_ELEMENTS // chunk)
    local_parts, code_parts, value_parts, scale_parts, pos_parts = [], [], [], [], []
    groups = [(first, min(per, full - first), topk) for first in range(0, full, per)]
    if k_tail:
        groups.append((full, 1, k_tail))
    for first, rows, k in groups:
        local, codes, values, scales = _select_rows(flat, chunk, k, first, rows)
        base = torch.arange(first, first + rows, dtype=torch.int64) * chunk
        pos_parts.append((local + base[:, None]).reshape(-1))
        local_parts.append(local.reshape(-1))
        code_parts.append(codes.reshape(-1))
        value_parts.append(values.reshape(-1))
        scale_parts.append(scales)

    def cat(parts: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        return torch.cat(parts) if parts else torch.zeros(0, dtype=dtype)

    scales_all, local_all = cat(scale_parts, torch.float32), cat(local_parts, torch.int64)
    body = (
        _le(scales_all.numpy(), "<f4")
        + _pack_bits(local_all.numpy(), index_bits(chunk))
        + _pack_bits(cat(code_parts, torch.uint8).numpy(), 2)
    )
    assert len(body) == _sparse_body_len(n, chunk, topk) and local_all.numel() == kept
    return body, SparseEntries(cat(pos_parts, torch.int64), cat(value_parts, torch.float32))


def sparse_decode(view: memoryview, n: int, chunk: int, topk: int, name: str) -> SparseEntries:
    """A tensor's kept entries from its sparse body, after checking every rule `sparse_encode`
    obeys that the bytes could break (finite non-negative scales, indices strictly increasing
    inside their chunk, zero padding, codes 0 where the scale is 0)."""
    full, k_tail, kept = sparse_counts(n, chunk, topk)
    chunks = full + (1 if k_tail else 0)
    b = index_bits(chunk)
    scales = _f32(view[: 4 * chunks], chunks)
    if not bool(torch.isfinite(scales).all()):
        raise CodecError(f"{name!r}: NaN or Inf scale")
    if bool(torch.signbit(scales).any()):
        raise CodecError(f"{name!r}: negative scale")
    ib = -(-kept * b // 8)
    try:
        local = _unpack_bits(view[4 * chunks : 4 * chunks + ib], kept, b, "indices")
        codes = _unpack_bits(view[4 * chunks + ib :], kept, 2, "codes")
    except CodecError as e:
        raise CodecError(f"{name!r}: {e}") from e
    widths = np.full(chunks, chunk, dtype=np.int64)
    counts = np.full(chunks, topk, dtype=np.int64)
    if k_tail:
        widths[-1], counts[-1] = n - full * chunk, k_tail
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]) if chunks else np.zeros(0, dtype=np.int64)
    loc = local.astype(np.int64)
    if kept:
        rising = np.diff(loc) > 0
        rising[starts[1:] - 1] = True  # a new chunk may start anywhere
        if not rising.all():
            raise CodecError(f"{name!r}: indices not strictly increasing within a chunk")
        last = loc[np.cumsum(counts) - 1]
        if (last >= widths).any():
            raise CodecError(f"{name!r}: index outside its chunk")
    row = np.repeat(np.arange(chunks, dtype=np.int64), counts)
    sc = scales.numpy()[row]
    if ((sc == 0) & (codes != 0)).any():
        raise CodecError(f"{name!r}: nonzero codes in a chunk whose scale is 0")
    s_rep = torch.from_numpy(np.ascontiguousarray(sc))[:, None]
    c = torch.from_numpy(codes.astype(np.uint8))[:, None]
    values = _levels(s_rep.reshape(-1), (c & 1).bool(), (c >> 1).bool()).reshape(-1)
    if not bool(torch.isfinite(values).all()):
        raise CodecError(f"{name!r}: NaN or Inf value")
    return SparseEntries(torch.from_numpy(row * chunk + loc), values)


def _encodable(name: str, t: object) -> torch.Tensor:
    if not isinstance(t, torch.Tensor) or not t.dtype.is_floating_point:
        raise CodecError(f"{name!r}: expected a floating-point tensor")
    x = t.detach().to("cpu", torch.float32).contiguous()
    if not torch.isfinite(x).all():
        raise CodecError(f"{name!r}: NaN or Inf in the pseudo-gradient")
    return x


def encode(
    tensors: Mapping[str, torch.Tensor], codec: Codec | str, block_size: int, topk: int | None = None
) -> bytes:
    """The canonical payload for Δ: same tensors, codec and block size (and, sparse, k) → same
    bytes, everywhere. The sparse codec here is C(x) alone; a host sends C(β·e + Δ) through its
    error-feedback accumulator (`protocol.errorfeedback.ef_step`)."""
    if not isinstance(tensors, Mapping) or not tensors:
        raise CodecError("expected a non-empty mapping of name -> tensor")
    if len(tensors) > MAX_TENSORS:
        raise CodecError(f"more than {MAX_TENSORS} tensors")
    for name in tensors:
        _name_bytes(name)
    layout = {}
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise CodecError(f"{name!r}: expected a floating-point tensor")
        layout[name] = tuple(t.shape)
    ordered = ((n, tensors[n]) for n in sorted(tensors, key=lambda n: n.encode()))
    return b"".join(encode_pieces(ordered, layout, codec, block_size, topk))


def encode_pieces(
    items: Iterable[tuple[str, torch.Tensor]],
    layout: Layout,
    codec: Codec | str,
    block_size: int,
    topk: int | None = None,
) -> list[bytes]:
    """`encode` as its pieces (header, then one body per tensor), from tensors given one at a time
    in name order: a Δ is encoded with the memory of one fp32 tensor plus the payload (the host
    computes θ_global − θ_H tensor by tensor, the verifier likewise). Same bytes as `encode`."""
    c = _codec(codec)
    block = _stored_block(c, block_size)
    k = _stored_topk(c, block_size, topk)
    entries = layout_entries(layout)
    bodies: list[bytes] = []
    for _, x in checked_items(items, entries):
        bodies.append(_encode_tensor(x, c, block or 1, k))
        del x
    return [_header(c, block, entries, sum(len(b) for b in bodies), k), *bodies]


def layout_entries(layout: Layout) -> list[tuple[bytes, tuple[int, ...]]]:
    """(UTF-8 name, shape) in payload order, after the checks every encoder applies."""
    if not layout:
        raise CodecError("expected a non-empty mapping of name -> tensor")
    if len(layout) > MAX_TENSORS:
        raise CodecError(f"more than {MAX_TENSORS} tensors")
    return sorted((_name_bytes(n), tuple(int(d) for d in s)) for n, s in layout.items())


def checked_items(
    items: Iterable[tuple[str, torch.Tensor]], entries: list[tuple[bytes, tuple[int, ...]]]
) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors of `items` as finite CPU float32, checked to come in payload order with the
    layout's shapes, one at a time."""
    it = iter(items)
    for raw, shape in entries:
        name = raw.decode()
        got = next(it, None)
        if got is None or got[0] != name:
            raise CodecError(f"tensors must come in name order; expected {name!r}, got {got and got[0]!r}")
        x = _encodable(name, got[1])
        if tuple(x.shape) != shape:
            raise CodecError(f"{name!r}: shape {tuple(x.shape)}, layout expects {shape}")
        del got
        yield name, x
    if next(it, None) is not None:
        raise CodecError("more tensors than the layout names")


def payload_header(codec: Codec | str, block_size: int, layout: Layout, topk: int | None = None) -> bytes:
    """The exact header of any payload with this layout (it does not depend on the values)."""
    c = _codec(codec)
    block = _stored_block(c, block_size)
    k = _stored_topk(c, block_size, topk)
    return _header(c, block, layout_entries(layout), body_len(c, block or 1, layout, k), k)


def delta_hash(payload: bytes, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> str:
    """The chunked content hash (`protocol.chunks`) of the canonical payload under `DELTA_DOMAIN`:
    what `MsgCommitPseudoGradient` carries. The payload itself is what nodes serve, so any chunk
    of it is checkable on arrival and it can come from any holder."""
    return delta_hash_and_digests(payload, chunk_bytes)[0]


def delta_hash_and_digests(payload: bytes, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> tuple[str, list[bytes]]:
    if not isinstance(payload, bytes | bytearray | memoryview):
        raise CodecError(f"payload must be bytes, got {type(payload).__name__}")
    if not len(payload):
        raise CodecError("empty payload")
    return chunks.hash_stream(DELTA_DOMAIN, [payload], chunk_bytes)


def payload_len(codec: Codec | str, block_size: int, layout: Layout, topk: int | None = None) -> int:
    """Exact length of the canonical payload of a Δ with this layout: the receiver's bound."""
    c = _codec(codec)
    block = _stored_block(c, block_size)
    k = _stored_topk(c, block_size, topk)
    entries = sorted((_name_bytes(n), tuple(s)) for n, s in layout.items())
    return len(_header(c, block, entries, 0, k)) + body_len(c, block or 1, layout, k)


def iter_decode(payload: bytes | memoryview, layout: Layout) -> Iterator[tuple[str, torch.Tensor]]:
    """`decode` one tensor at a time (name order), so a memory-mapped payload of any size is decoded
    with the memory of its largest tensor."""
    h = read_header(payload)
    _check_layout(h, layout)
    if len(payload) != h.header_len + h.body_len:
        raise CodecError(f"payload is {len(payload)} bytes, header implies {h.header_len + h.body_len}")
    view = memoryview(payload).cast("B")
    for name, (start, end) in h.spans().items():
        yield name, _decode_tensor(view[start:end], h, name, h.shapes[name])


def iter_sparse(payload: bytes | memoryview, layout: Layout) -> Iterator[tuple[str, SparseEntries]]:
    """A sparse payload's kept entries, one tensor at a time (name order), never densified: what
    aggregation adds straight into its running sum (`protocol.outer.SparseAccumulator`)."""
    h = checked_header(payload, layout)
    if h.codec is not Codec.SPARSE:
        raise CodecError(f"expected a sparse payload, got {h.codec.value}")
    view = memoryview(payload).cast("B")
    for name, (start, end) in h.spans().items():
        yield name, sparse_decode(view[start:end], _numel(h.shapes[name]), h.block_size, h.topk, name)


def checked_header(payload: bytes | memoryview, layout: Layout) -> PayloadHeader:
    """The header, checked against the layout and the payload's exact length."""
    h = read_header(payload)
    _check_layout(h, layout)
    if len(payload) != h.header_len + h.body_len:
        raise CodecError(f"payload is {len(payload)} bytes, header implies {h.header_len + h.body_len}")
    return h


def read_header(data: bytes | bytearray | memoryview) -> PayloadHeader:
    """Parse and sanity-check a payload's (or blob's) header; the body is not touched."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise CodecError(f"expected bytes, got {type(data).__name__}")
    r = ByteReader(data, CodecError)
    magic, version, code, topk, block, count = r.unpack(_PREAMBLE, "preamble")
    if magic != MAGIC:
        raise CodecError(f"bad magic {bytes(magic)!r}")
    if version != VERSION:
        raise CodecError(f"unsupported version {version}")
    if code not in _CODEC_OF:
        raise CodecError(f"unknown codec code {code}")
    codec = _CODEC_OF[code]
    if codec is Codec.SPARSE:
        if not MIN_BLOCK <= block <= SPARSE_MAX_CHUNK:
            raise CodecError(f"sparse chunk {block} outside [{MIN_BLOCK}, {SPARSE_MAX_CHUNK}]")
        if not 1 <= topk <= block:
            raise CodecError(f"sparse topk {topk} outside [1, {block}]")
    elif topk != 0:
        raise CodecError("reserved header bytes are not zero")
    if codec in _QMAX and not MIN_BLOCK <= block <= MAX_BLOCK:
        raise CodecError(f"block size {block} outside [{MIN_BLOCK}, {MAX_BLOCK}]")
    if codec not in _QMAX and codec is not Codec.SPARSE and block != 0:
        raise CodecError(f"{codec.value} payload must store block size 0, not {block}")
    if count == 0 or count > MAX_TENSORS:
        raise CodecError(f"tensor count {count} outside [1, {MAX_TENSORS}]")
    shapes: dict[str, tuple[int, ...]] = {}
    prev = b""
    for i in range(count):
        (name_len,) = r.unpack(_U16, f"name length of tensor {i}")
        if not 0 < name_len <= MAX_NAME_BYTES:
            raise CodecError(f"name length {name_len} of tensor {i} outside [1, {MAX_NAME_BYTES}]")
        raw = bytes(r.take(name_len, f"name of tensor {i}"))
        if raw <= prev:
            raise CodecError(f"tensor names not strictly sorted at index {i}")
        prev = raw
        try:
            name = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise CodecError(f"tensor name at index {i} is not valid UTF-8") from e
        (ndim,) = r.unpack(_U8, f"ndim of {name!r}")
        if ndim > MAX_NDIM:
            raise CodecError(f"{name!r}: {ndim} dimensions exceeds {MAX_NDIM}")
        shapes[name] = tuple(r.unpack(_U64, f"shape of {name!r}")[0] for _ in range(ndim))
    (blen,) = r.unpack(_U64, "body length")
    expected = body_len(codec, block or 1, shapes, topk)
    if blen != expected:
        raise CodecError(f"body length {blen} does not match the {expected} bytes the shapes imply")
    return PayloadHeader(codec, block, shapes, blen, r.pos, topk)


def _check_layout(h: PayloadHeader, layout: Layout) -> None:
    want = {str(k): tuple(int(d) for d in v) for k, v in layout.items()}
    if set(h.shapes) != set(want):
        missing, extra = sorted(set(want) - set(h.shapes)), sorted(set(h.shapes) - set(want))
        raise CodecError(f"tensor names differ from the layout: missing {missing[:5]}, extra {extra[:5]}")
    for name, shape in h.shapes.items():
        if shape != want[name]:
            raise CodecError(f"{name!r}: shape {shape}, layout expects {want[name]}")


def _check_expected(
    h: PayloadHeader, codec: Codec | str | None, block_size: int | None, topk: int | None = None
) -> None:
    if codec is not None and h.codec is not _codec(codec):
        raise CodecError(f"codec {h.codec.value}, expected {_codec(codec).value}")
    blocked = h.codec in _QMAX or h.codec is Codec.SPARSE
    if block_size is not None and blocked and h.block_size != block_size:
        raise CodecError(f"block size {h.block_size}, expected {block_size}")
    if topk is not None and h.codec is Codec.SPARSE and h.topk != _stored_topk(h.codec, h.block_size, topk):
        raise CodecError(f"topk {h.topk}, expected {_stored_topk(h.codec, h.block_size, topk)}")


def to_blob(payload: bytes) -> bytes:
    """Transport form: the payload's header as is, then its body as one zstd frame."""
    h = read_header(payload)
    if len(payload) != h.header_len + h.body_len:
        raise CodecError("payload length does not match its header")
    body = memoryview(payload)[h.header_len :]
    return bytes(payload[: h.header_len]) + zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress(body)


def from_blob(
    blob: bytes,
    layout: Layout,
    *,
    max_payload_bytes: int,
    codec: Codec | str | None = None,
    block_size: int | None = None,
    topk: int | None = None,
) -> bytes:
    """Undo `to_blob`, refusing before decompression anything the layout does not predict.

    The decompressed body may be exactly the size the layout implies and no larger: a zstd
    bomb is cut off after that many bytes (plus one) are produced.
    """
    h = read_header(blob)
    _check_layout(h, layout)
    _check_expected(h, codec, block_size, topk)
    if h.header_len + h.body_len > max_payload_bytes:
        raise CodecError(f"payload of {h.header_len + h.body_len} bytes exceeds {max_payload_bytes}")
    frame = memoryview(blob)[h.header_len :]
    try:
        declared = zstandard.frame_content_size(frame)
    except zstandard.ZstdError as e:
        raise CodecError(f"body is not a zstd frame: {e}") from e
    if declared != -1 and declared != h.body_len:
        raise CodecError(f"zstd frame declares {declared} bytes, header says {h.body_len}")
    body = bytearray()
    try:
        with zstandard.ZstdDecompressor().stream_reader(frame) as reader:
            while len(body) <= h.body_len:
                chunk = reader.read(min(h.body_len + 1 - len(body), 1 << 24))
                if not chunk:
                    break
                body += chunk
    except zstandard.ZstdError as e:
        raise CodecError(f"corrupt zstd body: {e}") from e
    if len(body) != h.body_len:
        raise CodecError(f"body decompresses to {'more than' if len(body) > h.body_len else ''} "
                         f"{len(body)} bytes, header says {h.body_len}")
    return bytes(blob[: h.header_len]) + bytes(body)


def _f32(view: memoryview, n: int) -> torch.Tensor:
    return torch.from_numpy(np.frombuffer(view, dtype="<f4", count=n).astype(np.float32))


def _dequantize(view: memoryview, codec: Codec, block: int, name: str, n: int) -> torch.Tensor:
    """q * scale per block, after checking every rule `encode` obeys that a value could break."""
    nb = -(-n // block)
    scales = _f32(view[: 4 * nb], nb)
    if not torch.isfinite(scales).all():
        raise CodecError(f"{name!r}: NaN or Inf scale")
    if torch.signbit(scales).any():
        raise CodecError(f"{name!r}: negative scale")
    data = view[4 * nb :]
    qmax = _QMAX[codec]
    if codec is Codec.INT8:
        q = torch.from_numpy(np.frombuffer(data, dtype=np.int8, count=n).copy())
    else:
        packed = torch.from_numpy(np.frombuffer(data, dtype=np.uint8).copy())
        nib = torch.stack([packed & 0x0F, packed >> 4], dim=1).reshape(-1)
        if n % 2 and nib[-1] != 0:
            raise CodecError(f"{name!r}: nonzero int4 padding nibble")
        nib = nib[:n].to(torch.int8)
        q = torch.where(nib >= 8, nib - 16, nib)
    if q.numel() and int(q.min()) < -qmax:
        raise CodecError(f"{name!r}: quantized value below -{qmax}")
    padded = torch.zeros(nb * block, dtype=torch.float32)
    padded[:n] = q.float()
    blocks = padded.view(nb, block)
    if bool((blocks[scales == 0] != 0).any()):
        raise CodecError(f"{name!r}: nonzero values in a block whose scale is 0")
    return (blocks * scales[:, None]).reshape(-1)[:n]


def _decode_tensor(view: memoryview, h: PayloadHeader, name: str, shape: tuple[int, ...]) -> torch.Tensor:
    n = _numel(shape)
    if h.codec is Codec.FP32:
        x = _f32(view, n)
    elif h.codec is Codec.BF16:
        x = torch.from_numpy(np.frombuffer(view, dtype="<i2", count=n).astype(np.int16))
        x = x.view(torch.bfloat16).float()
    elif h.codec is Codec.SPARSE:
        entries = sparse_decode(view, n, h.block_size, h.topk, name)
        x = torch.zeros(n, dtype=torch.float32)
        x[entries.positions] = entries.values
    else:
        x = _dequantize(view, h.codec, h.block_size, name, n)
    if not torch.isfinite(x).all():
        raise CodecError(f"{name!r}: NaN or Inf value")
    return x.reshape(shape)


def decode(payload: bytes, layout: Layout) -> dict[str, torch.Tensor]:
    """Float32 tensors from a canonical payload, which must match `layout` exactly."""
    return dict(iter_decode(payload, layout))
