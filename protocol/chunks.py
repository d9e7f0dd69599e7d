"""Chunked content hashes: a Merkle root over fixed-size chunks of an object's canonical bytes.

A 30B-parameter training state is 360 GB. One SHA-256 stream over it takes minutes on one core
and can only be checked once the last byte has arrived. Cutting the byte stream into chunks of
`chunk_bytes` (a run parameter) and committing to the RFC 6962 Merkle root of the chunks gives:

- parallel hashing (each chunk on its own thread: hashlib releases the GIL), also across the
  ranks of a sharded host, which exchange only chunk digests and the bytes of at most two
  chunks that straddle their shard edges (`shard_digests` / `combine_shards`);
- transfers that verify every chunk as it arrives, resume at any chunk and pull different
  chunks from different holders (`verify_manifest` checks the chunk digest list once);
- a proof that one chunk belongs to the object (`chunk_proof` / `verify_chunk`).

Definition (all integers little-endian u64)::

    chunk i       = bytes [i·c, min((i+1)·c, L)) of the canonical bytes, i = 0..n−1, n = ceil(L/c)
    digest i      = SHA-256(0x00 ‖ chunk i)                     (an RFC 6962 leaf hash)
    MTH           = RFC 6962 Merkle tree hash over the n digests
    content hash  = SHA-256("gonka-diloco/chunked/v1" ‖ 0x00 ‖ domain ‖ c ‖ L ‖ MTH)

`domain` names what the bytes are (`protocol.tensors.domain(kind)` for tensor sets, `DELTA_DOMAIN`
for Δ payloads). c and L are inside the hash, so the tree's size is bound and a proof for chunk
i needs only (L, the audit path). L ≥ 1 for every object the protocol hashes.
"""

from __future__ import annotations

import bisect
import hashlib
import os
import struct
import threading
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from protocol import merkle

DEFAULT_CHUNK_BYTES = 64 << 20
"""64 MiB: 5.6k chunks for a 30B state (a 180 kB digest list), ~30 ms of SHA-256 per chunk."""
MIN_CHUNK_BYTES = 256
MAX_CHUNK_BYTES = 1 << 31
PREFIX = b"gonka-diloco/chunked/v1\x00"
DELTA_DOMAIN = b"gonka-diloco/delta/v1\x00"
DIGEST = 32
_U64 = struct.Struct("<Q")
_PARALLEL_MIN_BYTES = 4 << 20  # below this, threads cost more than they save

Piece = bytes | bytearray | memoryview


class ChunkError(ValueError):
    """Bad chunk parameters (size out of range, empty object, index outside the object)."""


def check_chunk_bytes(chunk_bytes: int) -> int:
    if not isinstance(chunk_bytes, int) or not MIN_CHUNK_BYTES <= chunk_bytes <= MAX_CHUNK_BYTES:
        want = f"{MIN_CHUNK_BYTES}..{MAX_CHUNK_BYTES}"
        raise ChunkError(f"chunk size must be {want} bytes, got {chunk_bytes!r}")
    return chunk_bytes


def n_chunks(total_len: int, chunk_bytes: int) -> int:
    if total_len < 1:
        raise ChunkError("an object has at least one byte")
    return -(-total_len // check_chunk_bytes(chunk_bytes))


def chunk_span(index: int, total_len: int, chunk_bytes: int) -> tuple[int, int]:
    """[start, end) of chunk `index`."""
    if not 0 <= index < n_chunks(total_len, chunk_bytes):
        raise ChunkError(f"chunk {index} outside an object of {total_len} bytes")
    start = index * chunk_bytes
    return start, min(start + chunk_bytes, total_len)


def chunk_digest(data: Piece | Iterable[Piece]) -> bytes:
    """SHA-256(0x00 ‖ chunk): the RFC 6962 leaf hash of one chunk (pieces hashed in order, no join)."""
    h = hashlib.sha256(b"\x00")
    if isinstance(data, bytes | bytearray | memoryview):
        h.update(data)
    else:
        for p in data:
            h.update(p)
    return h.digest()


def mth(digests: Sequence[bytes]) -> bytes:
    """RFC 6962 tree hash over already-hashed leaves."""
    if not digests:
        raise ChunkError("no chunk digests")
    return merkle.root_of_hashes(digests)


def root_hash(domain: bytes, chunk_bytes: int, total_len: int, tree_hash: bytes) -> str:
    """The content hash (hex) from the tree hash: binds the domain, c and L."""
    n_chunks(total_len, chunk_bytes)
    h = hashlib.sha256(PREFIX)
    h.update(domain)
    h.update(_U64.pack(chunk_bytes))
    h.update(_U64.pack(total_len))
    h.update(tree_hash)
    return h.hexdigest()


def content_hash(domain: bytes, chunk_bytes: int, total_len: int, digests: Sequence[bytes]) -> str:
    if len(digests) != n_chunks(total_len, chunk_bytes):
        raise ChunkError(f"{len(digests)} digests for {n_chunks(total_len, chunk_bytes)} chunks")
    return root_hash(domain, chunk_bytes, total_len, mth(digests))


# ---------------------------------------------------------------- hashing a byte stream in parallel

_pool_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None


def hash_pool() -> ThreadPoolExecutor:
    """One process-wide pool, one thread per core: hashlib releases the GIL on large updates."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=os.cpu_count() or 1, thread_name_prefix="chunk-hash")
        return _pool


class Stream:
    """An object's canonical bytes as an ordered list of buffers (tensor memory, no joined copy)."""

    def __init__(self, pieces: Iterable[Piece]) -> None:
        self.pieces = [memoryview(p).cast("B") for p in pieces]
        self.pieces = [p for p in self.pieces if len(p)]
        self.starts: list[int] = []
        pos = 0
        for p in self.pieces:
            self.starts.append(pos)
            pos += len(p)
        self.total = pos

    def read(self, start: int, end: int) -> list[memoryview]:
        """The buffers covering [start, end), as views."""
        out = []
        i = max(0, bisect.bisect_right(self.starts, start) - 1)
        while start < end and i < len(self.pieces):
            p, s = self.pieces[i], self.starts[i]
            lo, hi = start - s, min(len(p), end - s)
            if hi > lo:
                out.append(p[lo:hi])
                start = s + hi
            i += 1
        return out

    def digests(self, chunk_bytes: int, *, parallel: bool = True) -> list[bytes]:
        """Every chunk's digest, chunks hashed on the pool's threads."""
        n = n_chunks(self.total, chunk_bytes)
        spans = [chunk_span(i, self.total, chunk_bytes) for i in range(n)]
        if not parallel or n == 1 or self.total < _PARALLEL_MIN_BYTES:
            return [chunk_digest(self.read(a, b)) for a, b in spans]
        return list(hash_pool().map(lambda ab: chunk_digest(self.read(*ab)), spans))


def hash_stream(
    domain: bytes, pieces: Iterable[Piece], chunk_bytes: int, *, parallel: bool = True
) -> tuple[str, list[bytes]]:
    """(content hash, chunk digests) of the concatenation of `pieces`."""
    stream = Stream(pieces)
    digests = stream.digests(chunk_bytes, parallel=parallel)
    return content_hash(domain, chunk_bytes, stream.total, digests), digests


# ---------------------------------------------------------------- single chunks and digest lists


def chunk_proof(digests: Sequence[bytes], index: int) -> list[bytes]:
    """The audit path of chunk `index` (RFC 6962 PATH over the chunk digests)."""
    return merkle.inclusion_proof_of_hashes(digests, index)


def verify_chunk(
    expected_hash: str,
    domain: bytes,
    chunk_bytes: int,
    total_len: int,
    index: int,
    chunk: bytes,
    proof: Sequence[bytes],
) -> bool:
    """Whether `chunk` is chunk `index` of the object with content hash `expected_hash` (L given)."""
    try:
        start, end = chunk_span(index, total_len, chunk_bytes)
    except ChunkError:
        return False
    if len(chunk) != end - start:
        return False
    size = n_chunks(total_len, chunk_bytes)
    root = merkle.root_from_path(chunk_digest(chunk), index, size, proof)
    return root is not None and root_hash(domain, chunk_bytes, total_len, root) == expected_hash


def verify_manifest(
    expected_hash: str, domain: bytes, chunk_bytes: int, total_len: int, digests: Sequence[bytes]
) -> bool:
    """Whether a served list of chunk digests is the object's: then each chunk is checked alone."""
    try:
        if len(digests) != n_chunks(total_len, chunk_bytes) or any(len(d) != DIGEST for d in digests):
            return False
        return content_hash(domain, chunk_bytes, total_len, digests) == expected_hash
    except ChunkError:
        return False


# ---------------------------------------------------------------- sharded holders (ranks)


@dataclass
class ShardDigests:
    """What one rank holding bytes [start, end) of the canonical stream sends: the digests of the
    chunks that lie wholly inside its range, and the bytes of the (at most two) chunks it holds
    only part of. Nothing else travels; with shard edges on multiples of c, no bytes travel."""

    start: int
    end: int
    digests: dict[int, bytes] = field(default_factory=dict)
    edges: dict[int, list[tuple[int, bytes]]] = field(default_factory=dict)  # chunk -> [(offset, bytes)]


_SHARD_MAGIC = b"GDSD"
_U32 = struct.Struct("<I")


def encode_shards(shards: Sequence[ShardDigests]) -> bytes:
    """What one rank sends its combiner (own format, never pickle), little-endian::

    "GDSD" | count u32 | count × ( start u64 | end u64 | n u32 | n × (chunk u64 | digest[32])
                                   | m u32 | m × (chunk u64 | offset u64 | len u64 | bytes) )
    """
    out = [_SHARD_MAGIC, _U32.pack(len(shards))]
    for s in shards:
        out += [_U64.pack(s.start), _U64.pack(s.end), _U32.pack(len(s.digests))]
        for i, d in sorted(s.digests.items()):
            out += [_U64.pack(i), d]
        parts = [(i, off, data) for i, ps in sorted(s.edges.items()) for off, data in ps]
        out.append(_U32.pack(len(parts)))
        for i, off, data in parts:
            out += [_U64.pack(i), _U64.pack(off), _U64.pack(len(data)), bytes(data)]
    return b"".join(out)


def decode_shards(data: bytes, total_len: int, chunk_bytes: int) -> list[ShardDigests]:
    """`encode_shards` inverted, every field checked against an object of `total_len` bytes:
    ranges inside it, digests only of chunks wholly inside their range, edge bytes inside their
    chunk and their range. Anything else is a `ChunkError`."""
    n = n_chunks(total_len, chunk_bytes)
    view = memoryview(data)
    pos = 0

    def take(k: int) -> memoryview:
        nonlocal pos
        if k < 0 or pos + k > len(view):
            raise ChunkError("shard digests truncated")
        pos += k
        return view[pos - k : pos]

    def u64() -> int:
        return int(_U64.unpack(take(8))[0])

    def u32() -> int:
        return int(_U32.unpack(take(4))[0])

    if bytes(take(4)) != _SHARD_MAGIC:
        raise ChunkError("not a shard digest list")
    out = []
    for _ in range(u32()):
        start, end = u64(), u64()
        if not 0 <= start <= end <= total_len:
            raise ChunkError(f"shard [{start}, {end}) outside an object of {total_len} bytes")
        s = ShardDigests(start, end)
        for _ in range(u32()):
            i = u64()
            if i >= n or not (start <= i * chunk_bytes and min((i + 1) * chunk_bytes, total_len) <= end):
                raise ChunkError(f"digest of chunk {i}, which shard [{start}, {end}) does not hold whole")
            s.digests[i] = bytes(take(DIGEST))
        for _ in range(u32()):
            i, off, k = u64(), u64(), u64()
            a, b = chunk_span(i, total_len, chunk_bytes) if i < n else (0, -1)
            if not (a <= off and off + k <= b and start <= off and off + k <= end and k > 0):
                raise ChunkError(f"edge bytes [{off}, {off + k}) outside chunk {i} or shard [{start}, {end})")
            s.edges.setdefault(i, []).append((off, bytes(take(k))))
        out.append(s)
    if pos != len(view):
        raise ChunkError("trailing bytes after the shard digests")
    return out


def shard_digests(start: int, pieces: Iterable[Piece], total_len: int, chunk_bytes: int) -> ShardDigests:
    """A rank's share of the hashing work for bytes [start, start + len(pieces)) of the stream."""
    stream = Stream(pieces)
    end = start + stream.total
    if not 0 <= start <= end <= total_len:
        raise ChunkError(f"shard [{start}, {end}) outside an object of {total_len} bytes")
    out = ShardDigests(start, end)
    if stream.total == 0:
        return out
    first, last = start // chunk_bytes, (end - 1) // chunk_bytes
    whole = []
    for i in range(first, last + 1):
        a, b = chunk_span(i, total_len, chunk_bytes)
        if start <= a and b <= end:
            whole.append((i, a, b))
        else:
            lo, hi = max(a, start), min(b, end)
            out.edges[i] = [(lo, b"".join(bytes(v) for v in stream.read(lo - start, hi - start)))]
    view = Stream([])
    view.pieces, view.starts, view.total = stream.pieces, [s + start for s in stream.starts], end

    def one(item: tuple[int, int, int]) -> bytes:
        return chunk_digest(view.read(item[1], item[2]))

    digs = list(hash_pool().map(one, whole)) if len(whole) > 1 else [one(w) for w in whole]
    out.digests = {i: d for (i, _, _), d in zip(whole, digs, strict=True)}
    return out


def combine_shards(shards: Sequence[ShardDigests], total_len: int, chunk_bytes: int) -> list[bytes]:
    """Every chunk digest from the ranks' shares: edge bytes of a straddling chunk are joined in
    offset order and hashed once (by whoever combines; in practice the chunk's first holder)."""
    n = n_chunks(total_len, chunk_bytes)
    digests: dict[int, bytes] = {}
    edges: dict[int, list[tuple[int, bytes]]] = {}
    for s in shards:
        digests.update(s.digests)
        for i, parts in s.edges.items():
            edges.setdefault(i, []).extend(parts)
    for i, parts in edges.items():
        a, b = chunk_span(i, total_len, chunk_bytes)
        parts.sort()
        pos = a
        for off, data in parts:
            if off != pos:
                raise ChunkError(f"chunk {i}: shards leave a gap or overlap at byte {pos}")
            pos += len(data)
        if pos != b:
            raise ChunkError(f"chunk {i}: shards cover it only up to byte {pos} of {b}")
        digests[i] = chunk_digest([d for _, d in parts])
    missing = [i for i in range(n) if i not in digests]
    if missing:
        raise ChunkError(f"no shard holds chunks {missing[:5]}")
    return [digests[i] for i in range(n)]
