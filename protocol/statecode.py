"""Lossless transfer coding of a training state's chunks against G_n (specs §8.2).

A checker downloads whole training states; it already holds G_n, whose parameters the state's
parameters moved away from by only a few hundred inner steps. Each chunk of the canonical state
(`protocol.chunks`, c = `state_chunk_bytes`) is coded alone, so a transfer still streams, resumes
and pulls chunks from many holders, and each chunk is still checked against its digest once
decoded: the content hash names the canonical bytes, whatever coding carried them, so every
verifier reaches the same verdict.

Transform of one chunk, piece by piece in byte order (`StateLayout.pieces`, from the layout alone):

- the canonical header and any element cut by the chunk's edges: the bytes as they are;
- the elements of a tensor (itemsize w): with transform DIFF, a `param/<n>` tensor's elements
  minus G_n's `param/<n>` elements of the same index, as little-endian unsigned w-byte integers
  modulo 2^(8w) (the bit patterns, so no rounding: exact for any float); then byte planes: byte 0
  of every element, then byte 1, … (sign and exponent bytes apart from mantissa bytes).

The transformed bytes (as long as the chunk) are one zstd frame. Coded chunk, little-endian::

    magic "GDSC" | version u8 = 1 | transform u8 (1 PLANES, 2 DIFF) | reserved u16 = 0
    | index u64 | raw_len u64 | one zstd frame whose content size is raw_len

The decoder takes nothing on trust: the index and length must be the ones asked for (from the
layout), the coded size at most the zstd bound of raw_len, one frame of exactly raw_len bytes and
nothing after it; any other input is one `StateCodeError`.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Protocol

import numpy as np
import torch
import zstandard

from protocol import chunks
from protocol.inner import PARAM
from protocol.tensors import TensorSpec, canonical_header, data_offsets

MAGIC = b"GDSC"
VERSION = 1
HEADER = struct.Struct("<4sBBHQQ")
DEFAULT_LEVEL = 1
"""zstd level of the encoder (not part of the format: the decoder reads any level). Chosen by
`bench.statecode`: ≥ 267 MB/s per core both ways (a 1 Gbit/s link is 125 MB/s); level 3 was no
better on 64 MiB chunks of the 125M layout and 2–5% better, and slower, on small one-chunk states."""
_UINT: dict[int, np.dtype[Any]] = {w: np.dtype(f"<u{w}") for w in (1, 2, 4, 8)}


class Transform(IntEnum):
    """What a coded chunk's body is, before zstd."""

    PLANES = 1
    """Byte planes of every tensor's elements; no base needed."""
    DIFF = 2
    """`param/<n>` elements minus G_n's (integer, modulo 2^(8w)), then byte planes."""


class StateCodeError(ValueError):
    """A coded chunk that does not decode to the chunk asked for (bad header, size, index, frame,
    or a base that does not fit the layout)."""


@dataclass(frozen=True)
class Region:
    """Bytes [start, end) of the canonical form: the header (itemsize 1, no tensor) or one tensor's
    data (its itemsize; `base` = the G_n parameter its elements are coded against, if any)."""

    start: int
    end: int
    itemsize: int
    base: str | None = None


@dataclass(frozen=True)
class Piece:
    """Part of one chunk: chunk-relative [start, end), whole elements of `itemsize` bytes (1 for
    raw bytes), and the base tensor with the element index of its first element."""

    start: int
    end: int
    itemsize: int
    base: str | None = None
    first: int = 0


@dataclass(frozen=True)
class StateLayout:
    """Where every tensor's elements sit in a state's canonical form, and its chunking."""

    regions: tuple[Region, ...]
    total: int
    chunk_bytes: int

    @classmethod
    def of(cls, specs: Sequence[TensorSpec], chunk_bytes: int) -> StateLayout:
        header = len(canonical_header(specs))
        offsets = data_offsets(specs)
        regions = [Region(0, header, 1)]
        for name, dtype, _ in sorted(specs, key=lambda s: s[0].encode()):
            a, b = offsets[name]
            if b > a:
                base = name[len(PARAM) + 1 :] if name.startswith(f"{PARAM}/") else None
                regions.append(Region(a, b, torch.tensor([], dtype=dtype).element_size(), base))
        total = regions[-1].end
        chunks.n_chunks(total, chunk_bytes)
        return cls(tuple(regions), total, chunk_bytes)

    @property
    def n_chunks(self) -> int:
        return chunks.n_chunks(self.total, self.chunk_bytes)

    def span(self, index: int) -> tuple[int, int]:
        return chunks.chunk_span(index, self.total, self.chunk_bytes)

    def pieces(self, index: int) -> list[Piece]:
        """The chunk's pieces, in byte order, tiling it exactly."""
        a, b = self.span(index)
        out: list[Piece] = []
        for r in self.regions:
            lo, hi = max(a, r.start), min(b, r.end)
            if lo >= hi:
                continue
            w = r.itemsize
            first = -(-(lo - r.start) // w)  # the first whole element in [lo, hi)
            e0 = r.start + first * w
            n = max(0, (hi - e0) // w)
            e1 = e0 + n * w
            if n == 0:
                out.append(Piece(lo - a, hi - a, 1))
                continue
            if lo < e0:
                out.append(Piece(lo - a, e0 - a, 1))
            out.append(Piece(e0 - a, e1 - a, w, r.base, first))
            if e1 < hi:
                out.append(Piece(e1 - a, hi - a, 1))
        return out


def zstd_bound(n: int) -> int:
    """ZSTD_COMPRESSBOUND: the most a zstd frame of n content bytes takes."""
    return n + (n >> 8) + (((128 << 10) - n) >> 11 if n < (128 << 10) else 0)


def max_coded_len(layout: StateLayout, index: int) -> int:
    """The longest coded chunk `index` may be (a receiver's size limit, from the layout alone)."""
    a, b = layout.span(index)
    return HEADER.size + zstd_bound(b - a) + 64  # + the frame's own header and checksum


class BaseElements(Protocol):
    """G_n's parameters read by element range (a node reads them from its store, a chunk at a time,
    never a whole tensor): `elements(name, first, n, itemsize)` is elements [first, first + n) of
    parameter `name` as little-endian bytes, or raises `KeyError`/`ValueError` if it has none."""

    def elements(self, name: str, first: int, n: int, itemsize: int) -> np.ndarray: ...


Base = Mapping[str, torch.Tensor] | BaseElements
"""What a chunk is coded against: G_n's parameters by name, as tensors or as element ranges."""


def _base_bytes(base: Base, name: str, first: int, n: int, w: int) -> np.ndarray:
    """Elements [first, first + n) of G_n's `name` as little-endian bytes."""
    if not isinstance(base, Mapping):
        try:
            got = np.asarray(base.elements(name, first, n, w), dtype=np.uint8).reshape(-1)
        except (KeyError, ValueError) as e:
            raise StateCodeError(f"base has no elements [{first}, {first + n}) of {name!r}: {e}") from e
        if got.size != n * w:
            raise StateCodeError(f"base gave {got.size} bytes for {n} elements of {name!r}")
        return got
    t = base.get(name)
    if t is None or t.element_size() != w or first + n > t.numel():
        raise StateCodeError(f"base has no {w}-byte tensor {name!r} with {first + n} elements")
    flat = t.detach().reshape(-1)[first : first + n]
    if flat.device.type != "cpu":
        flat = flat.cpu()
    return flat.contiguous().view(torch.uint8).numpy()


def _forward(piece: np.ndarray, p: Piece, base: Base | None) -> np.ndarray:
    w = p.itemsize
    if w == 1:
        return piece
    n = (p.end - p.start) // w
    x = piece.view(_UINT[w])
    if base is not None and p.base is not None:
        x = x - _base_bytes(base, p.base, p.first, n, w).view(_UINT[w])  # wraps modulo 2^(8w)
    return np.ascontiguousarray(x.view(np.uint8).reshape(n, w).T).reshape(-1)


def _inverse(planes: np.ndarray, p: Piece, base: Base | None) -> np.ndarray:
    w = p.itemsize
    if w == 1:
        return planes
    n = (p.end - p.start) // w
    x = np.ascontiguousarray(planes.reshape(w, n).T).reshape(-1).view(_UINT[w])
    if base is not None and p.base is not None:
        x = x + _base_bytes(base, p.base, p.first, n, w).view(_UINT[w])
    return x.view(np.uint8)


def encode_chunk(
    layout: StateLayout,
    index: int,
    chunk: bytes | bytearray | memoryview,
    base: Base | None = None,
    *,
    level: int = DEFAULT_LEVEL,
) -> bytes:
    """Chunk `index` of a state (its canonical bytes), coded: DIFF against G_n's parameters `base`
    (name → tensor, as `param/<name>` of the state), or PLANES without a base."""
    a, b = layout.span(index)
    raw = np.frombuffer(chunk, dtype=np.uint8)
    if raw.size != b - a:
        raise StateCodeError(f"chunk {index} is {b - a} bytes, got {raw.size}")
    out = np.empty(b - a, dtype=np.uint8)
    for p in layout.pieces(index):
        out[p.start : p.end] = _forward(raw[p.start : p.end], p, base)
    body = zstandard.ZstdCompressor(level=level, write_content_size=True).compress(out.data)
    transform = Transform.DIFF if base is not None else Transform.PLANES
    return HEADER.pack(MAGIC, VERSION, transform, 0, index, b - a) + body


def coded_transform(data: bytes | bytearray | memoryview) -> Transform:
    """The transform a coded chunk says it used (whether it needs the base), header checked."""
    view = memoryview(data)
    if len(view) < HEADER.size:
        raise StateCodeError(f"coded chunk of {len(view)} bytes is shorter than its header")
    magic, version, transform, reserved, _, _ = HEADER.unpack(view[: HEADER.size])
    if magic != MAGIC or version != VERSION or reserved:
        raise StateCodeError(f"not a coded chunk (magic {bytes(magic)!r}, version {version})")
    try:
        return Transform(transform)
    except ValueError:
        raise StateCodeError(f"unknown transform {transform}") from None


def decode_chunk(
    layout: StateLayout,
    index: int,
    data: bytes | bytearray | memoryview,
    base: Base | None = None,
) -> bytes:
    """The canonical bytes of chunk `index` from its coding (the caller checks their digest).
    `base` (G_n's parameters) is needed exactly when the chunk was coded with DIFF."""
    view = memoryview(data)
    a, b = layout.span(index)
    if len(view) > max_coded_len(layout, index):
        raise StateCodeError(f"coded chunk {index}: {len(view)} bytes, more than any coding of {b - a}")
    transform = coded_transform(view)
    _, _, _, _, got_index, raw_len = HEADER.unpack(view[: HEADER.size])
    if got_index != index or raw_len != b - a:
        want = f"want {index} of {b - a}"
        raise StateCodeError(f"coded chunk says index {got_index} of {raw_len} bytes, {want}")
    if transform is Transform.DIFF and base is None:
        raise StateCodeError("chunk coded against a base the receiver did not name")
    body = view[HEADER.size :]
    try:
        if zstandard.frame_content_size(body) != raw_len:
            raise StateCodeError(f"zstd frame does not declare {raw_len} bytes")
        dobj = zstandard.ZstdDecompressor().decompressobj()
        out = dobj.decompress(body)
        if not dobj.eof or dobj.unused_data or len(out) != raw_len:
            raise StateCodeError("coded chunk is not exactly one zstd frame of the chunk's length")
    except zstandard.ZstdError as e:
        raise StateCodeError(f"zstd: {e}") from None
    planes = np.frombuffer(out, dtype=np.uint8)
    raw = np.empty(raw_len, dtype=np.uint8)
    use = base if transform is Transform.DIFF else None
    for p in layout.pieces(index):
        raw[p.start : p.end] = _inverse(planes[p.start : p.end], p, use)
    return raw.tobytes()


def decode_verified(
    layout: StateLayout,
    index: int,
    data: bytes | bytearray | memoryview,
    digest: bytes,
    base: Base | None = None,
) -> bytes:
    """`decode_chunk`, then the chunk's digest (`protocol.chunks`) checked: a holder that coded
    against another base, or sent another state's chunk, is caught here like any bad chunk."""
    raw = decode_chunk(layout, index, data, base)
    if chunks.chunk_digest(raw) != digest:
        raise StateCodeError(f"chunk {index} decodes to bytes that do not match its digest")
    return raw
