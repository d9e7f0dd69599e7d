"""How a stored object's bytes lie on disk, and reading them back verified: one plain file or a
sharded host's rank files (`_Segments`), positional reads across them, chunks read and checked
ahead on the hash pool, and `StoredTensors`, a stored tensor set read one tensor at a time.

The write side and the store itself are `nodekit.store`'s.
"""

from __future__ import annotations

import bisect
import json
import os
import threading
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from nodekit.objects import Kind
from protocol import chunks
from protocol.tensors import TensorSpec, canonical_header, canonical_size, data_offsets

if TYPE_CHECKING:
    from nodekit.store import ContentStore


class StoreError(ValueError):
    """Missing, malformed or corrupted stored data."""


SHARDS = ".shards"
"""Suffix of a sharded object's index file (its rank files are `<name>.r<rank>`)."""

MAX_SHARDS = 1 << 16
MAX_INDEX_BYTES = 64 << 20


def _object_path(found: Path) -> Path:
    """The object's own name (`<hash>.<kind>`) from what `find` returned."""
    return found.with_name(found.name.removesuffix(SHARDS)) if found.name.endswith(SHARDS) else found


def _present(obj: Path) -> bool:
    return obj.is_file() or obj.with_name(obj.name + SHARDS).is_file()


def _check_layout(obj: Path, length: int, layout: Sequence[Sequence[Sequence[int]]]) -> None:
    """The ranges of every shard file tile [0, length) exactly; each file holds exactly its bytes."""
    if not isinstance(length, int) or length < 1 or not 0 < len(layout) <= MAX_SHARDS:
        raise StoreError(f"{obj.name}: bad shard layout (length {length!r}, {len(layout)} shards)")
    spans: list[tuple[int, int]] = []
    totals = []
    for rank, ranges in enumerate(layout):
        total = 0
        for r in ranges:
            if len(r) != 2 or not all(isinstance(x, int) for x in r) or not 0 <= r[0] < r[1] <= length:
                raise StoreError(f"{obj.name}: shard {rank} range {r!r} outside [0, {length})")
            spans.append((r[0], r[1]))
            total += r[1] - r[0]
        totals.append(total)
    pos = 0
    for a, b in sorted(spans):
        if a != pos:
            raise StoreError(f"{obj.name}: shards leave a gap or overlap at byte {pos}")
        pos = b
    if pos != length:
        raise StoreError(f"{obj.name}: shards cover {pos} of {length} bytes")
    for rank, total in enumerate(totals):
        shard = obj.with_name(f"{obj.name}.r{rank}")
        size = shard.stat().st_size if shard.is_file() else (0 if total == 0 else -1)
        if size != total:
            raise StoreError(f"{obj.name}: shard file {rank} holds {size} bytes, its ranges {total}")


class _Segments:
    """Where each byte of a stored object is: one plain file, or the ranges of its shard files."""

    def __init__(self, length: int, segments: list[tuple[int, int, Path, int]]) -> None:
        self.length = length
        self.segments = segments  # (start, end, file, offset in file), by start
        self.starts = [s[0] for s in segments]

    @classmethod
    def of(cls, found: Path) -> _Segments:
        if not found.name.endswith(SHARDS):
            size = found.stat().st_size
            return cls(size, [(0, size, found, 0)])
        obj = _object_path(found)
        try:
            raw = found.read_bytes()
            if len(raw) > MAX_INDEX_BYTES:
                raise ValueError("index too large")
            index = json.loads(raw)
            length, layout = index["length"], index["shards"]
            if index.get("version") != 1 or not isinstance(layout, list):
                raise ValueError("unknown index version")
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise StoreError(f"{found.name}: unreadable shard index ({e})") from e
        _check_layout(obj, length, layout)
        segments = []
        for rank, ranges in enumerate(layout):
            offset = 0
            for a, b in ranges:
                segments.append((a, b, obj.with_name(f"{obj.name}.r{rank}"), offset))
                offset += b - a
        return cls(length, sorted(segments))

    def open(self) -> _SegmentReader:
        return _SegmentReader(self)


class _SegmentReader:
    """Reads canonical byte ranges across the files of `_Segments` (`os.pread`, one fd per file)."""

    def __init__(self, segments: _Segments) -> None:
        self.s = segments
        self.fds: dict[Path, int] = {}

    def __enter__(self) -> _SegmentReader:
        return self

    def __exit__(self, *exc: object) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()

    def read_into(self, start: int, buf: bytearray) -> int:
        """Fill `buf` with bytes [start, start + len(buf)); returns how many were there."""
        view, pos, got = memoryview(buf), start, 0
        i = max(0, bisect.bisect_right(self.s.starts, pos) - 1)
        while got < len(buf) and i < len(self.s.segments):
            a, b, path, offset = self.s.segments[i]
            if pos >= b:
                i += 1
                continue
            if pos < a:
                break
            fd = self.fds.get(path)
            if fd is None:
                fd = self.fds[path] = os.open(path, os.O_RDONLY)
            n = min(b - pos, len(buf) - got)
            data = os.pread(fd, n, offset + pos - a)
            view[got : got + len(data)] = data
            got += len(data)
            pos += len(data)
            if len(data) < n:
                break
        return got


READ_AHEAD = 2
"""Chunks read and checked ahead of the reader, on the hash pool: a node reading G_n or an
optimizer state from disk gets the other cores' SHA-256 for its chunk checks, in O(chunk) memory."""


def _on_pool() -> bool:
    return threading.current_thread().name.startswith("chunk-hash")  # protocol.chunks.hash_pool's


def read_ahead(
    fn: Callable[[int], bytearray], indices: Iterable[int], ahead: int = READ_AHEAD
) -> Generator[tuple[int, bytearray], None, None]:
    """(i, fn(i)) in order, with `fn` of the next `ahead` indices already running on the hash pool
    (at most `ahead` + 1 results held). On a hash-pool thread itself it runs inline (no pool
    thread ever waits for work queued behind it)."""
    todo = iter(indices)
    if _on_pool() or ahead < 1:
        for i in todo:
            yield i, fn(i)
        return
    pool = chunks.hash_pool()
    queue: deque[tuple[int, Future[bytearray]]] = deque()
    try:
        for i in todo:
            queue.append((i, pool.submit(fn, i)))
            if len(queue) > ahead:
                j, fut = queue.popleft()
                yield j, fut.result()
        while queue:
            j, fut = queue.popleft()
            yield j, fut.result()
    finally:  # a reader that stops early: nothing may run on after it (it may close the files)
        for _, fut in queue:
            fut.cancel()
        for _, fut in queue:
            if not fut.cancelled():
                fut.exception()


class StoredTensors(Mapping[str, Tensor]):
    """The tensors named `prefix…` of a stored canonical tensor set, read one at a time from disk.

    What a node holds of G_n for a whole outer step: the names, shapes and the file, not 8 B/param
    of tensors. `st[name]` is a fresh tensor filled from the chunks that hold it, each verified
    against the stored digests (themselves checked against the hash on open); the last verified
    chunk is kept, so reading in name order (how `items()` and every honest caller read) costs one
    pass over the file and O(chunk) memory. The header is compared with the node's own layout
    (`specs`) on open. A deleted or corrupted file is a `StoreError` on the next read.
    """

    def __init__(
        self,
        store: ContentStore,
        kind: Kind | str,
        h: str,
        specs: Sequence[TensorSpec],
        group: str | None = None,
        prefix: str = "",
    ) -> None:
        self.store, self.kind, self.hash, self.group = store, Kind(kind), h, group
        found = store._require(kind, h, group)
        self._path = _object_path(found)
        self._segments = _Segments.of(found)  # one file, or a sharded host's rank files
        self._digests = store.digests(kind, h, group)
        self._length = self._segments.length
        if canonical_size(specs) != self._length:
            raise StoreError(f"{self.kind.value} {h[:12]} does not fit this model's layout")
        offsets = data_offsets(specs)
        self._spec = {
            n[len(prefix) :]: (dtype, tuple(shape), offsets[n])
            for n, dtype, shape in sorted(specs, key=lambda s: s[0].encode())
            if n.startswith(prefix)
        }
        self._lock = threading.Lock()
        self._cached: tuple[int, bytes] | None = None
        self._ahead: dict[int, Future[bytes]] = {}  # chunks being read and checked on the hash pool
        self._n = chunks.n_chunks(self._length, store.chunk_bytes)
        header = canonical_header(specs)
        got = bytearray()
        for i in range(-(-len(header) // store.chunk_bytes)):
            got += self._chunk(i, ahead=False)
        if bytes(got[: len(header)]) != header:
            raise StoreError(f"{self.kind.value} {h[:12]}: header does not match this model's layout")

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {n: shape for n, (_, shape, _) in self._spec.items()}

    def _chunk(self, i: int, ahead: bool = True) -> bytes:
        """Chunk i, verified (the caller holds the lock or is the constructor), with the next
        `READ_AHEAD` chunks read and checked on the hash pool meanwhile (a reader in name order
        reads the file in order)."""
        if self._cached is not None and self._cached[0] == i:
            return self._cached[1]
        fut = self._ahead.pop(i, None)
        for j in [j for j in self._ahead if j < i]:  # a reader that jumped back or ahead
            self._ahead.pop(j).cancel()
        if ahead and not _on_pool():
            pool = chunks.hash_pool()
            for j in range(i + 1, min(self._n, i + 1 + READ_AHEAD)):
                if j not in self._ahead:
                    self._ahead[j] = pool.submit(self._read, j)
        data = fut.result() if fut is not None else self._read(i)
        self._cached = (i, data)
        return data

    def _read(self, i: int) -> bytes:
        """Chunk i from disk, checked against its digest."""
        a, b = chunks.chunk_span(i, self._length, self.store.chunk_bytes)
        buf = bytearray(b - a)
        try:
            with self._segments.open() as reader:
                got = reader.read_into(a, buf)
        except OSError as e:
            raise StoreError(f"{self._path.name}: {e}") from e
        if got != b - a or chunks.chunk_digest(buf) != self._digests[i]:
            raise StoreError(f"{self._path.name}: chunk {i} is corrupted on disk")
        return bytes(buf)

    def __getitem__(self, name: str) -> Tensor:
        dtype, shape, _ = self._spec[name]
        t = torch.empty(shape, dtype=dtype)
        self.read_into(name, t)
        return t

    def read_into(self, name: str, out: Tensor) -> None:
        """`self[name]` written straight into `out` (contiguous, on the CPU, of its dtype and
        shape: e.g. a model's own parameter), with no tensor of its own."""
        dtype, shape, (a, b) = self._spec[name]
        fits = out.dtype == dtype and tuple(out.shape) == shape
        if not (fits and out.is_contiguous() and out.device.type == "cpu"):
            raise StoreError(f"{name}: cannot read a {dtype}{list(shape)} into {out.dtype}{list(out.shape)}")
        if b == a:
            return
        view = out.detach().view(-1).view(torch.uint8).numpy()
        c = self.store.chunk_bytes
        with self._lock:
            for i in range(a // c, -(-b // c)):
                lo, hi = max(a, i * c), min(b, (i + 1) * c)
                data = self._chunk(i)
                view[lo - a : hi - a] = np.frombuffer(data, np.uint8, hi - lo, lo - i * c)

    def __iter__(self) -> Iterator[str]:
        return iter(self._spec)

    def __len__(self) -> int:
        return len(self._spec)

    def release(self) -> None:
        """Drop the cached chunk (O(chunk) bytes) until the next read."""
        with self._lock:
            self._cached = None
            for fut in self._ahead.values():
                fut.cancel()
            self._ahead.clear()
