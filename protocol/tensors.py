"""Canonical byte form of a named tensor set, and its domain-separated SHA-256.

Every hash that names a state (model, optimizer, training state, pseudo-gradient, global model)
is taken over this one byte form, so two nodes agree on a hash exactly when they hold the same
names, dtypes, shapes and bits. Hashing streams the tensors' own memory into hashlib (no copies
of contiguous CPU tensors, no per-element Python), which keeps it near hashlib's raw speed.

Byte form (all integers little-endian)::

    magic b"GDTS" | version u8 = 1 | 3 zero bytes | count u32
    count x ( name_len u16 | name (UTF-8) | dtype u8 | ndim u8 | dims u64 x ndim | nbytes u64 )
    count x data (the tensor's elements, C order, little-endian)

Names are non-empty, valid UTF-8, and strictly increasing by their UTF-8 bytes (which is also
code-point order), so the form is unique. The hash is the chunked content hash of the byte form
(`protocol.chunks`: a Merkle root over fixed-size chunks, bound to domain(kind), chunk size and
length), so it can be computed in parallel and checked chunk by chunk while it streams.
"""

from __future__ import annotations

import itertools
import struct
import sys
from collections.abc import Iterator, Mapping, Sequence
from enum import StrEnum

import numpy as np
import torch

from protocol import chunks
from protocol.chunks import DEFAULT_CHUNK_BYTES

MAGIC = b"GDTS"
VERSION = 1
MAX_NAME_BYTES = 1024
MAX_NDIM = 16
DEFAULT_MAX_TENSORS = 1 << 16
DEFAULT_MAX_BYTES = 1 << 34

_PREAMBLE = struct.Struct("<4sB3sI")
_NAME_LEN = struct.Struct("<H")
_DTYPE_NDIM = struct.Struct("<BB")
_U64 = struct.Struct("<Q")


class StateKind(StrEnum):
    """What a hash names; part of the hashed domain so equal bytes of different kinds differ."""

    MODEL = "model"
    OPTIMIZER = "optimizer"
    TRAINING = "training"
    PSEUDO_GRADIENT = "pseudo_gradient"
    GLOBAL = "global"
    ERROR_FEEDBACK = "error_feedback"
    """A host's carried error-feedback accumulator e (sparse codec; `protocol.errorfeedback`)."""


class TensorFormatError(ValueError):
    """A tensor set that cannot be put in, or read from, the canonical form."""


# code -> (torch dtype, numpy little-endian dtype of the stored elements)
_DTYPES: dict[int, tuple[torch.dtype, np.dtype]] = {
    1: (torch.float32, np.dtype("<f4")),
    2: (torch.float16, np.dtype("<f2")),
    3: (torch.bfloat16, np.dtype("<u2")),  # stored as its raw 16 bits
    4: (torch.float64, np.dtype("<f8")),
    5: (torch.int64, np.dtype("<i8")),
    6: (torch.int32, np.dtype("<i4")),
    7: (torch.int16, np.dtype("<i2")),
    8: (torch.int8, np.dtype("i1")),
    9: (torch.uint8, np.dtype("u1")),
    10: (torch.bool, np.dtype("u1")),
}
_CODE_OF: dict[torch.dtype, int] = {td: code for code, (td, _) in _DTYPES.items()}


def domain(kind: StateKind) -> bytes:
    """The prefix hashed before the byte form: binds the hash to its kind and format version."""
    return b"gonka-diloco/tensors/v1\x00" + StateKind(kind).value.encode() + b"\x00"


def _name_bytes(name: object) -> bytes:
    if not isinstance(name, str):
        raise TensorFormatError(f"tensor name must be str, got {type(name).__name__}")
    if not name:
        raise TensorFormatError("empty tensor name")
    try:
        raw = name.encode("utf-8")
    except UnicodeEncodeError as e:
        raise TensorFormatError(f"tensor name {name!r} is not valid UTF-8") from e
    if len(raw) > MAX_NAME_BYTES:
        raise TensorFormatError(f"tensor name longer than {MAX_NAME_BYTES} bytes: {name[:40]!r}…")
    return raw


def _as_array(name: str, t: object) -> np.ndarray:
    """The tensor's elements as a contiguous little-endian numpy view (a copy only if needed)."""
    if not isinstance(t, torch.Tensor):
        raise TensorFormatError(f"{name!r}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in _CODE_OF:
        raise TensorFormatError(f"{name!r}: unsupported dtype {t.dtype}")
    if t.ndim > MAX_NDIM:
        raise TensorFormatError(f"{name!r}: more than {MAX_NDIM} dimensions")
    t = t.detach()
    if t.device.type != "cpu":
        t = t.to("cpu")
    t = t.resolve_conj().resolve_neg().contiguous()
    if t.dtype is torch.bfloat16:
        t = t.view(torch.uint16)
    elif t.dtype is torch.bool:
        t = t.view(torch.uint8)
    arr = t.numpy()
    if sys.byteorder != "little" and arr.dtype.itemsize > 1:  # pragma: no cover - little-endian hosts
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    return arr


def _entries(tensors: Mapping[str, torch.Tensor]) -> list[tuple[bytes, int, tuple[int, ...], np.ndarray]]:
    if not isinstance(tensors, Mapping):
        raise TensorFormatError(f"expected a mapping of name -> tensor, got {type(tensors).__name__}")
    if not tensors:
        raise TensorFormatError("empty tensor set")
    entries = []
    for name, t in tensors.items():
        raw = _name_bytes(name)
        arr = _as_array(name, t)
        entries.append((raw, _CODE_OF[t.dtype], tuple(t.shape), arr))
    entries.sort(key=lambda e: e[0])
    for a, b in itertools.pairwise(entries):
        if a[0] == b[0]:  # a custom Mapping may yield one key twice
            raise TensorFormatError(f"duplicate tensor name {a[0]!r}")
    return entries


def _header(entries: list[tuple[bytes, int, tuple[int, ...], np.ndarray]]) -> bytes:
    parts = [_PREAMBLE.pack(MAGIC, VERSION, bytes(3), len(entries))]
    for raw, code, shape, arr in entries:
        parts.append(_NAME_LEN.pack(len(raw)))
        parts.append(raw)
        parts.append(_DTYPE_NDIM.pack(code, len(shape)))
        parts.extend(_U64.pack(d) for d in shape)
        parts.append(_U64.pack(arr.nbytes))
    return b"".join(parts)


def _chunks(tensors: Mapping[str, torch.Tensor]) -> Iterator[bytes | memoryview]:
    entries = _entries(tensors)
    yield _header(entries)
    for *_, arr in entries:
        if arr.nbytes:
            yield arr.reshape(-1).data.cast("B")  # .data is memoryview(arr), and typed so


def canonical_bytes(tensors: Mapping[str, torch.Tensor]) -> bytes:
    """The canonical byte form (header then data); `decode_canonical` inverts it."""
    return b"".join(bytes(c) if isinstance(c, memoryview) else c for c in _chunks(tensors))


def canonical_pieces(tensors: Mapping[str, torch.Tensor]) -> list[bytes | memoryview]:
    """The canonical byte form as buffers: the header, then each tensor's own memory (no copy of
    contiguous CPU tensors). Writers and hashers stream these."""
    return list(_chunks(tensors))


TensorSpec = tuple[str, torch.dtype, tuple[int, ...]]
"""(name, dtype, shape): what the canonical form's header says about one tensor."""


def canonical_header(specs: Sequence[TensorSpec]) -> bytes:
    """The header bytes of a tensor set with these names, dtypes and shapes (no data needed): a
    receiver knows the exact header and size of a state from its own model before fetching it."""
    entries = []
    for name, dtype, shape in specs:
        if dtype not in _CODE_OF:
            raise TensorFormatError(f"{name!r}: unsupported dtype {dtype}")
        numel = 1
        for d in shape:
            numel *= int(d)
        nbytes = numel * _DTYPES[_CODE_OF[dtype]][1].itemsize
        entries.append((_name_bytes(name), _CODE_OF[dtype], tuple(int(d) for d in shape), nbytes))
    entries.sort(key=lambda e: e[0])
    parts = [_PREAMBLE.pack(MAGIC, VERSION, bytes(3), len(entries))]
    for raw, code, shape, nbytes in entries:
        parts += [_NAME_LEN.pack(len(raw)), raw, _DTYPE_NDIM.pack(code, len(shape))]
        parts += [_U64.pack(d) for d in shape]
        parts.append(_U64.pack(nbytes))
    return b"".join(parts)


def canonical_size(specs: Sequence[TensorSpec]) -> int:
    """Exact length of the canonical form of a tensor set with these specs."""
    total = len(canonical_header(specs))
    for _, dtype, shape in specs:
        numel = 1
        for d in shape:
            numel *= int(d)
        total += numel * _DTYPES[_CODE_OF[dtype]][1].itemsize
    return total


def specs_of(tensors: Mapping[str, torch.Tensor]) -> list[TensorSpec]:
    return sorted((n, t.dtype, tuple(t.shape)) for n, t in tensors.items())


def data_offsets(specs: Sequence[TensorSpec]) -> dict[str, tuple[int, int]]:
    """name -> [start, end) of its data inside the canonical form."""
    pos = len(canonical_header(specs))
    out = {}
    for name, dtype, shape in sorted(specs, key=lambda s: s[0].encode()):
        numel = 1
        for d in shape:
            numel *= int(d)
        n = numel * _DTYPES[_CODE_OF[dtype]][1].itemsize
        out[name] = (pos, pos + n)
        pos += n
    return out


def tensor_hash(
    tensors: Mapping[str, torch.Tensor], kind: StateKind, chunk_bytes: int = DEFAULT_CHUNK_BYTES
) -> str:
    """The chunked content hash (`protocol.chunks`) of the canonical form, domain-separated by kind.
    Chunks are hashed in parallel straight from the tensors' memory."""
    return chunks.hash_stream(domain(kind), _chunks(tensors), chunk_bytes)[0]


def tensor_hash_and_digests(
    tensors: Mapping[str, torch.Tensor], kind: StateKind, chunk_bytes: int = DEFAULT_CHUNK_BYTES
) -> tuple[str, list[bytes]]:
    """`tensor_hash` and the chunk digests it was built from (what a holder serves as the manifest)."""
    return chunks.hash_stream(domain(kind), _chunks(tensors), chunk_bytes)


def tensor_digest(
    tensors: Mapping[str, torch.Tensor], kind: StateKind, chunk_bytes: int = DEFAULT_CHUNK_BYTES
) -> bytes:
    """`tensor_hash` as 32 raw bytes: the data of a trajectory Merkle leaf."""
    return bytes.fromhex(tensor_hash(tensors, kind, chunk_bytes))


def hash_canonical(data: bytes, kind: StateKind, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> str:
    """Hash of an already-encoded byte form; equals `tensor_hash` of what it decodes to."""
    return chunks.hash_stream(domain(kind), [data], chunk_bytes)[0]


class ByteReader:
    """Bounds-checked cursor: every read past the end is the decoder's own `error`, never an IndexError."""

    def __init__(self, data: bytes | bytearray | memoryview, error: type[ValueError]) -> None:
        self.view = memoryview(data).cast("B")
        self.pos = 0
        self.error = error

    def take(self, n: int, what: str) -> memoryview:
        if n < 0 or self.pos + n > len(self.view):
            raise self.error(f"truncated: {what} needs {n} bytes at offset {self.pos}")
        out = self.view[self.pos : self.pos + n]
        self.pos += n
        return out

    def unpack(self, st: struct.Struct, what: str) -> tuple[int, ...]:
        return st.unpack(self.take(st.size, what))


def decode_canonical(
    data: bytes | bytearray | memoryview,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_tensors: int = DEFAULT_MAX_TENSORS,
) -> dict[str, torch.Tensor]:
    """Parse the canonical form back into tensors, rejecting anything `canonical_bytes` never emits.

    Used to receive states from other nodes, so sizes are checked against the limits and the
    actual length before any tensor memory is allocated.
    """
    if not isinstance(data, bytes | bytearray | memoryview):
        raise TensorFormatError(f"expected bytes, got {type(data).__name__}")
    if len(data) > max_bytes:
        raise TensorFormatError(f"{len(data)} bytes exceeds the limit of {max_bytes}")
    r = ByteReader(data, TensorFormatError)
    magic, version, reserved, count = r.unpack(_PREAMBLE, "preamble")
    if magic != MAGIC:
        raise TensorFormatError(f"bad magic {bytes(magic)!r}")
    if version != VERSION:
        raise TensorFormatError(f"unsupported version {version}")
    if reserved != bytes(3):
        raise TensorFormatError("reserved preamble bytes are not zero")
    if count == 0:
        raise TensorFormatError("empty tensor set")
    if count > max_tensors:
        raise TensorFormatError(f"{count} tensors exceeds the limit of {max_tensors}")
    specs: list[tuple[str, int, tuple[int, ...], int]] = []
    prev: bytes | None = None
    total = 0
    for i in range(count):
        (name_len,) = r.unpack(_NAME_LEN, f"name length of tensor {i}")
        if name_len == 0:
            raise TensorFormatError(f"empty tensor name at index {i}")
        if name_len > MAX_NAME_BYTES:
            raise TensorFormatError(f"tensor name longer than {MAX_NAME_BYTES} bytes at index {i}")
        raw = bytes(r.take(name_len, f"name of tensor {i}"))
        try:
            name = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise TensorFormatError(f"tensor name at index {i} is not valid UTF-8") from e
        if prev is not None and raw == prev:
            raise TensorFormatError(f"duplicate tensor name {name!r}")
        if prev is not None and raw < prev:
            raise TensorFormatError(f"tensor names not sorted: {name!r} after {prev.decode()!r}")
        prev = raw
        code, ndim = r.unpack(_DTYPE_NDIM, f"dtype of {name!r}")
        if code not in _DTYPES:
            raise TensorFormatError(f"{name!r}: unknown dtype code {code}")
        if ndim > MAX_NDIM:
            raise TensorFormatError(f"{name!r}: {ndim} dimensions exceeds {MAX_NDIM}")
        shape = tuple(r.unpack(_U64, f"shape of {name!r}")[0] for _ in range(ndim))
        (nbytes,) = r.unpack(_U64, f"size of {name!r}")
        numel = 1
        for d in shape:
            numel *= d
        expected = numel * _DTYPES[code][1].itemsize
        if nbytes != expected:
            raise TensorFormatError(f"{name!r}: {nbytes} data bytes, shape {shape} needs {expected}")
        total += nbytes
        if total > len(data):
            raise TensorFormatError(f"declared data ({total} bytes so far) exceeds the input size")
        specs.append((name, code, shape, nbytes))
    have = len(data) - r.pos
    if have < total:
        raise TensorFormatError(f"truncated: data section is {have} bytes, header declares {total}")
    if have > total:
        raise TensorFormatError(f"{have - total} trailing bytes after the data section")
    out: dict[str, torch.Tensor] = {}
    for name, code, shape, nbytes in specs:
        tdtype, npdtype = _DTYPES[code]
        arr = np.frombuffer(r.take(nbytes, f"data of {name!r}"), dtype=npdtype).copy()
        if tdtype is torch.bool and arr.size and arr.max() > 1:
            raise TensorFormatError(f"{name!r}: bool tensor holds a byte other than 0 or 1")
        arr = arr.astype(arr.dtype.newbyteorder("="), copy=False)
        t = torch.from_numpy(arr)
        if tdtype is torch.bfloat16:
            t = t.view(torch.int16).view(torch.bfloat16)
        elif tdtype is torch.bool:
            t = t.view(torch.bool)
        out[name] = t.reshape(shape)
    return out
