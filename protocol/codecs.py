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

Blockwise absmax: a tensor (flattened, C order) is cut into blocks of B elements, the last one
possibly short; scale = float32(absmax / Q) with Q = 127 (int8) or 7 (int4); q = clamp(round(x /
scale)) with round half to even (torch.round), element-wise float32 division; a block whose
scale is 0 (all zero, or absmax so small the division underflows) stores q = 0. Decoding gives
q * scale in float32. For fp32/bf16 the stored block size is 0: it does not affect the bytes.
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

_CODE = {Codec.FP32: 1, Codec.BF16: 2, Codec.INT8: 3, Codec.INT4: 4}
_CODEC_OF = {v: k for k, v in _CODE.items()}
_QMAX = {Codec.INT8: 127, Codec.INT4: 7}
_PREAMBLE = struct.Struct("<4sBB2sII")
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


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _tensor_body_len(codec: Codec, block_size: int, n: int) -> int:
    if codec is Codec.FP32:
        return 4 * n
    if codec is Codec.BF16:
        return 2 * n
    scales = 4 * (-(-n // block_size))
    return scales + (n if codec is Codec.INT8 else (n + 1) // 2)


def body_len(codec: Codec, block_size: int, layout: Layout) -> int:
    """Exact body size a layout implies: how a receiver bounds a blob before reading it."""
    return sum(_tensor_body_len(codec, block_size, _numel(s)) for s in layout.values())


def _codec(codec: Codec | str) -> Codec:
    try:
        return Codec(codec)
    except ValueError as e:
        raise CodecError(f"unknown codec {codec!r}") from e


def _stored_block(codec: Codec, block_size: int) -> int:
    if not isinstance(block_size, int) or not MIN_BLOCK <= block_size <= MAX_BLOCK:
        raise CodecError(f"block size {block_size!r} outside [{MIN_BLOCK}, {MAX_BLOCK}]")
    return block_size if codec in _QMAX else 0


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


def _header(codec: Codec, block: int, entries: list[tuple[bytes, tuple[int, ...]]], blen: int) -> bytes:
    parts = [_PREAMBLE.pack(MAGIC, VERSION, _CODE[codec], bytes(2), block, len(entries))]
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


def _encode_tensor(x: torch.Tensor, codec: Codec, block: int) -> bytes:
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


def _encodable(name: str, t: object) -> torch.Tensor:
    if not isinstance(t, torch.Tensor) or not t.dtype.is_floating_point:
        raise CodecError(f"{name!r}: expected a floating-point tensor")
    x = t.detach().to("cpu", torch.float32).contiguous()
    if not torch.isfinite(x).all():
        raise CodecError(f"{name!r}: NaN or Inf in the pseudo-gradient")
    return x


def encode(tensors: Mapping[str, torch.Tensor], codec: Codec | str, block_size: int) -> bytes:
    """The canonical payload for Δ: same tensors, codec and block size → same bytes, everywhere."""
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
    return b"".join(encode_pieces(ordered, layout, codec, block_size))


def encode_pieces(
    items: Iterable[tuple[str, torch.Tensor]], layout: Layout, codec: Codec | str, block_size: int
) -> list[bytes]:
    """`encode` as its pieces (header, then one body per tensor), from tensors given one at a time
    in name order: a Δ is encoded with the memory of one fp32 tensor plus the payload (the host
    computes θ_global − θ_H tensor by tensor, the verifier likewise). Same bytes as `encode`."""
    c = _codec(codec)
    block = _stored_block(c, block_size)
    if not layout:
        raise CodecError("expected a non-empty mapping of name -> tensor")
    if len(layout) > MAX_TENSORS:
        raise CodecError(f"more than {MAX_TENSORS} tensors")
    entries = sorted((_name_bytes(n), tuple(int(d) for d in s)) for n, s in layout.items())
    bodies: list[bytes] = []
    it = iter(items)
    for raw, shape in entries:
        name = raw.decode()
        got = next(it, None)
        if got is None or got[0] != name:
            raise CodecError(f"tensors must come in name order; expected {name!r}, got {got and got[0]!r}")
        x = _encodable(name, got[1])
        if tuple(x.shape) != shape:
            raise CodecError(f"{name!r}: shape {tuple(x.shape)}, layout expects {shape}")
        bodies.append(_encode_tensor(x, c, block or 1))
        del x, got
    if next(it, None) is not None:
        raise CodecError("more tensors than the layout names")
    return [_header(c, block, entries, sum(len(b) for b in bodies)), *bodies]


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


def payload_len(codec: Codec | str, block_size: int, layout: Layout) -> int:
    """Exact length of the canonical payload of a Δ with this layout: the receiver's bound."""
    c = _codec(codec)
    block = _stored_block(c, block_size)
    entries = sorted((_name_bytes(n), tuple(s)) for n, s in layout.items())
    return len(_header(c, block, entries, 0)) + body_len(c, block or 1, layout)


def iter_decode(payload: bytes | memoryview, layout: Layout) -> Iterator[tuple[str, torch.Tensor]]:
    """`decode` one tensor at a time (name order), so a memory-mapped payload of any size is decoded
    with the memory of its largest tensor."""
    h = read_header(payload)
    _check_layout(h, layout)
    if len(payload) != h.header_len + h.body_len:
        raise CodecError(f"payload is {len(payload)} bytes, header implies {h.header_len + h.body_len}")
    view = memoryview(payload).cast("B")
    pos = h.header_len
    for name, shape in h.shapes.items():
        size = _tensor_body_len(h.codec, h.block_size or 1, _numel(shape))
        yield name, _decode_tensor(view[pos : pos + size], h, name, shape)
        pos += size


def read_header(data: bytes | bytearray | memoryview) -> PayloadHeader:
    """Parse and sanity-check a payload's (or blob's) header; the body is not touched."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise CodecError(f"expected bytes, got {type(data).__name__}")
    r = ByteReader(data, CodecError)
    magic, version, code, reserved, block, count = r.unpack(_PREAMBLE, "preamble")
    if magic != MAGIC:
        raise CodecError(f"bad magic {bytes(magic)!r}")
    if version != VERSION:
        raise CodecError(f"unsupported version {version}")
    if code not in _CODEC_OF:
        raise CodecError(f"unknown codec code {code}")
    codec = _CODEC_OF[code]
    if reserved != bytes(2):
        raise CodecError("reserved header bytes are not zero")
    if codec in _QMAX and not MIN_BLOCK <= block <= MAX_BLOCK:
        raise CodecError(f"block size {block} outside [{MIN_BLOCK}, {MAX_BLOCK}]")
    if codec not in _QMAX and block != 0:
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
    expected = body_len(codec, block or 1, shapes)
    if blen != expected:
        raise CodecError(f"body length {blen} does not match the {expected} bytes the shapes imply")
    return PayloadHeader(codec, block, shapes, blen, r.pos)


def _check_layout(h: PayloadHeader, layout: Layout) -> None:
    want = {str(k): tuple(int(d) for d in v) for k, v in layout.items()}
    if set(h.shapes) != set(want):
        missing, extra = sorted(set(want) - set(h.shapes)), sorted(set(h.shapes) - set(want))
        raise CodecError(f"tensor names differ from the layout: missing {missing[:5]}, extra {extra[:5]}")
    for name, shape in h.shapes.items():
        if shape != want[name]:
            raise CodecError(f"{name!r}: shape {shape}, layout expects {want[name]}")


def _check_expected(h: PayloadHeader, codec: Codec | str | None, block_size: int | None) -> None:
    if codec is not None and h.codec is not _codec(codec):
        raise CodecError(f"codec {h.codec.value}, expected {_codec(codec).value}")
    if block_size is not None and h.codec in _QMAX and h.block_size != block_size:
        raise CodecError(f"block size {h.block_size}, expected {block_size}")


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
) -> bytes:
    """Undo `to_blob`, refusing before decompression anything the layout does not predict.

    The decompressed body may be exactly the size the layout implies and no larger: a zstd
    bomb is cut off after that many bytes (plus one) are produced.
    """
    h = read_header(blob)
    _check_layout(h, layout)
    _check_expected(h, codec, block_size)
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
    else:
        x = _dequantize(view, h.codec, h.block_size, name, n)
    if not torch.isfinite(x).all():
        raise CodecError(f"{name!r}: NaN or Inf value")
    return x.reshape(shape)


def decode(payload: bytes, layout: Layout) -> dict[str, torch.Tensor]:
    """Float32 tensors from a canonical payload, which must match `layout` exactly."""
    return dict(iter_decode(payload, layout))
