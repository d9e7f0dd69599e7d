"""One content-addressed store: objects kept as their canonical bytes, verified chunk by chunk.

A file holds exactly the bytes its content hash commits to (`protocol.tensors` canonical form,
or a Δ payload), next to its chunk digests (`.chunks`, 32 bytes per chunk). So serving a byte
range is reading the file, and every read checks each chunk against its digest (the digest list
is checked against the hash once per open): a corrupted file is an error, never a wrong state.
Nothing is ever held whole: writes stream the tensors' own memory, reads fill tensors (or a
payload decoder) one chunk at a time. Writes are atomic (temp, fsync, rename, fsync dir).

Files live under a group (an outer step, "global", "optimizer") so a finished step goes at once.
"""

from __future__ import annotations

import bisect
import contextlib
import json
import os
import re
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from nodekit.objects import DOMAINS, HeldError, Kind, check_ref, held_bitmap, parse_held
from nodekit.storefiles import (
    MAX_SHARDS,
    SHARDS,
    StoreError,
    _check_layout,
    _object_path,
    _present,
    _Segments,
    read_ahead,
)
from protocol import chunks
from protocol.chunks import DEFAULT_CHUNK_BYTES, Piece
from protocol.tensors import (
    TensorFormatError,
    TensorSpec,
    canonical_header,
    canonical_pieces,
    canonical_size,
    data_offsets,
    decode_canonical,
    specs_of,
)

_GROUP = re.compile(r"^[a-z0-9_-]{1,40}$")
READ_BLOCK = 1 << 20


# ---------------------------------------------------------------- the groups both nodes keep

OPTIMIZER_GROUP = "optimizer"
"""Carried optimizer states (a host's own, the starts a verifier needs), across outer steps."""
EF_GROUP = "error_feedback"
"""Carried error-feedback accumulators of sparse runs (specs §4.1), kept like optimizer states."""
_DELTA_PREFIX = "delta-"


def delta_group(outer_step: int) -> str:
    """The group of the Δs of one outer step (own, or held to serve)."""
    return f"{_DELTA_PREFIX}{outer_step}"


def delta_group_step(group: str) -> int | None:
    """The outer step a Δ group holds, None for any other group (states, optimizers)."""
    rest = group.removeprefix(_DELTA_PREFIX)
    return int(rest) if rest != group and rest.isdigit() else None


def state_group_step(group: str) -> int | None:
    """The outer step a training-state group holds (its name is the step), None otherwise."""
    return int(group) if group.isdigit() else None


# ---------------------------------------------------------------- atomic files


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_pieces(path: Path, pieces: Iterable[Piece]) -> None:
    """Write-to-temp, fsync, rename, fsync the directory: a crash leaves old or new, never half."""
    staged_write(path, pieces)()


def staged_write(path: Path, pieces: Iterable[Piece]) -> Callable[[], None]:
    """`atomic_write_pieces` in two halves: the bytes are copied out of `pieces` (into the page
    cache) now; the returned call makes them durable and visible (fsync, rename, fsync the
    directory). Between the two the sources may change: a boundary's tensors are free for the
    next optimizer step as soon as this returns, while the disk catches up off the training path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=path.suffix)
    try:
        with os.fdopen(fd, "wb") as f:
            for p in pieces:
                f.write(p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise

    def finish() -> None:
        try:
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        _fsync_dir(path.parent)

    return finish


def atomic_write(path: Path, data: bytes) -> None:
    atomic_write_pieces(path, [data])


# ---------------------------------------------------------------- sinks: where streamed bytes land


class TensorSink:
    """Bytes of a canonical tensor set, written at any offset, straight into tensor memory.

    The receiver knows the exact header from its own model (`specs`), so the header bytes are
    compared, not parsed, and data bytes go to the tensor they belong to: a fetched state needs
    no buffer beyond the state itself. `tensors` may be live memory (a model's parameters).
    """

    def __init__(
        self,
        specs: Sequence[TensorSpec] | None = None,
        tensors: Mapping[str, Tensor] | None = None,
        *,
        only: Callable[[str], bool] | None = None,
    ):
        if sys.byteorder != "little":  # pragma: no cover
            raise RuntimeError("the canonical form is little-endian")
        if tensors is not None:
            self.specs = specs_of(tensors)
            self.tensors = dict(tensors)
        elif specs is not None:
            self.specs = sorted(specs, key=lambda s: s[0].encode())
            wanted = [x for x in self.specs if only is None or only(x[0])]
            self.tensors = {n: torch.empty(shape, dtype=dt) for n, dt, shape in wanted}
        else:
            raise ValueError("TensorSink needs specs or tensors")
        self.header = canonical_header(self.specs)
        self.length = canonical_size(self.specs)
        offsets = data_offsets(self.specs)
        self._regions = sorted((a, b, n) for n, (a, b) in offsets.items() if b > a and n in self.tensors)
        self._starts = [a for a, _, _ in self._regions]
        self._views = {n: self._bytes_of(self.tensors[n]) for _, _, n in self._regions}

    @classmethod
    def into(cls, tensors: Mapping[str, Tensor]) -> TensorSink:
        """A sink straight into `tensors` when they are contiguous host memory; else (a GPU
        model's tensors) into fresh host tensors of their layout, which the caller copies over."""
        if all(t.is_contiguous() and t.device.type == "cpu" for t in tensors.values()):
            return cls(tensors=tensors)
        return cls(specs_of(tensors))

    @staticmethod
    def _bytes_of(t: Tensor) -> np.ndarray:
        if not t.is_contiguous() or t.device.type != "cpu":
            raise ValueError("TensorSink writes into contiguous CPU tensors only")
        return t.detach().reshape(-1).view(torch.uint8).numpy()

    def write_at(self, offset: int, data: Piece) -> None:
        view = memoryview(data).cast("B")
        end = offset + len(view)
        if offset < 0 or end > self.length:
            raise TensorFormatError(f"bytes [{offset}, {end}) outside a state of {self.length}")
        h = len(self.header)
        if offset < h:
            n = min(h, end) - offset
            if bytes(view[:n]) != self.header[offset : offset + n]:
                raise TensorFormatError("the state's header does not match this model's layout")
            view, offset = view[n:], offset + n
        i = max(0, bisect.bisect_right(self._starts, offset) - 1)
        while len(view) and i < len(self._regions):
            a, b, name = self._regions[i]
            if offset >= b:
                i += 1
                continue
            if offset < a:  # bytes of a tensor this sink does not take (`only`)
                skip = min(a - offset, len(view))
                view, offset = view[skip:], offset + skip
                continue
            n = min(b, offset + len(view)) - offset
            self._views[name][offset - a : offset - a + n] = np.frombuffer(view[:n], dtype=np.uint8)
            view, offset = view[n:], offset + n
            i += 1


class FileSink:
    """A preallocated file written at any offset (`os.pwrite`: safe from several threads)."""

    def __init__(self, path: Path, length: int) -> None:
        self.path, self.length = path, length
        path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        if os.fstat(self.fd).st_size != length:
            os.ftruncate(self.fd, length)

    def write_at(self, offset: int, data: Piece) -> None:
        view = memoryview(data).cast("B")
        if offset < 0 or offset + len(view) > self.length:
            raise StoreError(f"bytes [{offset}, {offset + len(view)}) outside an object of {self.length}")
        while len(view):
            n = os.pwrite(self.fd, view, offset)
            view, offset = view[n:], offset + n

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class BytesSink:
    """A small object into memory (tests, adversaries' offline paths)."""

    def __init__(self, length: int) -> None:
        self.buf = bytearray(length)
        self.length = length

    def write_at(self, offset: int, data: Piece) -> None:
        view = memoryview(data).cast("B")
        if offset < 0 or offset + len(view) > self.length:
            raise StoreError(f"bytes [{offset}, {offset + len(view)}) outside an object of {self.length}")
        self.buf[offset : offset + len(view)] = view


# ---------------------------------------------------------------- the store


class ContentStore:
    """`<root>/<group>/<hash>.<kind>` + `.chunks`: every object a node holds, verified on every read."""

    def __init__(self, root: Path | str, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.chunk_bytes = chunks.check_chunk_bytes(chunk_bytes)
        self._partials: dict[Path, PartialObject] = {}  # one live object per file: writer and server share it
        self._partials_lock = threading.Lock()

    # ---- paths

    def _path(self, kind: Kind | str, h: str, group: str) -> Path:
        kind = check_ref(kind, h)
        if not _GROUP.match(str(group)):
            raise StoreError(f"bad group {group!r}")
        return self.root / str(group) / f"{h}.{kind.value}"

    def find(self, kind: Kind | str, h: str, group: str | None = None) -> Path | None:
        """The object's file, or for a sharded object its shard index (`<name>.shards`)."""
        p: Path | None
        if group is not None:
            p = self._path(kind, h, group)
        else:
            check_ref(kind, h)
            dirs = [self.root / g for g in self.groups()]
            p = next(
                (d / f"{h}.{Kind(kind).value}" for d in dirs if _present(d / f"{h}.{Kind(kind).value}")), None
            )
            if p is None:
                return None
        if p.is_file():
            return p
        index = p.with_name(p.name + SHARDS)
        return index if index.is_file() else None

    def has(self, kind: Kind | str, h: str, group: str | None = None) -> bool:
        return self.find(kind, h, group) is not None

    def groups(self) -> list[str]:
        """Group folders (a group being dropped is renamed away first, so it is not one)."""
        return sorted(d.name for d in self.root.iterdir() if d.is_dir() and _GROUP.match(d.name))

    def hashes(self, kind: Kind | str, group: str | None = None) -> list[str]:
        """The objects of a kind, complete ones only: a write in progress (`.tmp-*`, renamed into
        place when done) is not one yet, and another thread may be writing while we list."""
        dirs = [self.root / group] if group is not None else [self.root / g for g in self.groups()]
        out: set[str] = set()
        for suffix in ("." + Kind(kind).value, "." + Kind(kind).value + SHARDS):
            out |= {
                p.name[: -len(suffix)]
                for d in dirs
                if d.is_dir()
                for p in d.glob("*" + suffix)
                if not p.name.startswith(".")
            }
        return sorted(out)

    def _require(self, kind: Kind | str, h: str, group: str | None) -> Path:
        p = self.find(kind, h, group)
        if p is None:
            raise StoreError(f"{Kind(kind).value} {h[:12]}… is not in the store")
        return p

    # ---- writing

    def put_pieces(
        self,
        kind: Kind | str,
        pieces: Sequence[Piece],
        group: str,
        *,
        h: str | None = None,
        digests: Sequence[bytes] | None = None,
    ) -> str:
        """Store an object from its buffers; `h`/`digests` when the caller already hashed them."""
        kind = Kind(kind)
        if h is None or digests is None:
            h, digests = chunks.hash_stream(DOMAINS[kind], pieces, self.chunk_bytes)
        path = self._path(kind, h, group)
        if not self.has(kind, h, group):
            atomic_write_pieces(path.with_name(path.name + ".chunks"), [b"".join(digests)])
            atomic_write_pieces(path, pieces)
        return h

    def stage_pieces(
        self, kind: Kind | str, pieces: Sequence[Piece], group: str, h: str, digests: Sequence[bytes]
    ) -> Callable[[], None]:
        """`put_pieces` of an already-hashed object in two halves (`staged_write`): the bytes are
        copied now, the returned call makes the object durable and visible in the store."""
        path = self._path(kind, h, group)
        if self.has(kind, h, group):
            return lambda: None
        finish = staged_write(path, pieces)

        def commit() -> None:
            atomic_write_pieces(path.with_name(path.name + ".chunks"), [b"".join(digests)])
            finish()

        return commit

    def put_tensors(self, kind: Kind | str, tensors: Mapping[str, Tensor], group: str, **kw: object) -> str:
        return self.put_pieces(kind, canonical_pieces(tensors), group, **kw)  # type: ignore[arg-type]

    def put_bytes(self, kind: Kind | str, data: bytes, group: str) -> str:
        return self.put_pieces(kind, [data], group)

    # ---- sharded objects: one file per rank of a sharded host, served as one canonical stream

    def begin(self, kind: Kind | str, h: str, group: str, length: int) -> FileSink:
        """A part file for a fetch into the store, private to this fetch (two fetches of one object
        never share one); `commit` it once every chunk is verified, or `abort` it. One left by a
        process that died is removed by `sweep`."""
        path = self._path(kind, h, group)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.part-")
        os.close(fd)
        return FileSink(Path(tmp), length)

    def scratch(self, kind: Kind | str, group: str, length: int) -> FileSink:
        """A temp file in `group` for an object whose hash is not known yet (written while it is
        hashed); `commit` it under its hash, or `abort` it. Named as `staged_write` names its temp
        files (`.tmp-*.<kind>`): what is on disk counts the same either way."""
        if not _GROUP.match(str(group)):
            raise StoreError(f"bad group {group!r}")
        d = self.root / str(group)
        d.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-", suffix="." + Kind(kind).value)
        os.close(fd)
        return FileSink(Path(tmp), length)

    def commit(self, kind: Kind | str, h: str, group: str, sink: FileSink, digests: Sequence[bytes]) -> Path:
        path = self._path(kind, h, group)
        os.fsync(sink.fd)
        sink.close()
        atomic_write_pieces(path.with_name(path.name + ".chunks"), [b"".join(digests)])
        os.replace(sink.path, path)
        _fsync_dir(path.parent)
        self.delete_partial(kind, h, group)  # the whole object supersedes any part of it
        return path

    def abort(self, sink: FileSink) -> None:
        sink.close()
        sink.path.unlink(missing_ok=True)

    # ---- partial objects: some chunks and the whole manifest (specs §8)

    def partial(
        self, kind: Kind | str, h: str, group: str, length: int, digests: Sequence[bytes]
    ) -> PartialObject:
        """The partial object `h` of `group`, created holding nothing if there is none (its manifest
        checked against the hash either way)."""
        kind = Kind(kind)
        path = self._partial_path(kind, h, group)
        with self._partials_lock:
            obj = self._partials.get(path)
            if obj is None:
                if path.is_file() and path.with_name(path.name + ".chunks").is_file():
                    obj = PartialObject.open(path, kind, h, self.chunk_bytes)
                else:
                    obj = PartialObject.create(path, kind, h, length, self.chunk_bytes, digests)
                self._partials[path] = obj
        if obj.length != length or obj.digests() != [bytes(d) for d in digests]:
            raise StoreError(f"{path.name}: held with another length or manifest")
        return obj

    def open_partial(self, kind: Kind | str, h: str, group: str | None = None) -> PartialObject | None:
        """The partial object `h` (of `group`, or of any group), None if there is none."""
        kind = Kind(kind)
        groups = [group] if group is not None else self.groups()
        for g in groups:
            path = self._partial_path(kind, h, g)
            with self._partials_lock:
                obj = self._partials.get(path)
                if obj is None and path.is_file() and path.with_name(path.name + ".chunks").is_file():
                    obj = self._partials[path] = PartialObject.open(path, kind, h, self.chunk_bytes)
            if obj is not None:
                return obj
        return None

    def partials(self, kind: Kind | str, group: str) -> list[str]:
        """The hashes of `group`'s partial objects of a kind."""
        suffix = "." + Kind(kind).value + PARTIAL
        d = self.root / group
        if not _GROUP.match(str(group)) or not d.is_dir():
            return []
        return sorted(
            p.name[: -len(suffix)]
            for p in d.glob("*" + suffix)
            if not p.name.startswith(".") and p.with_name(p.name + ".chunks").is_file()
        )

    def delete_partial(self, kind: Kind | str, h: str, group: str) -> None:
        path = self._partial_path(kind, h, group)
        with self._partials_lock:
            self._partials.pop(path, None)
        for p in (path.with_name(path.name + HELD), path.with_name(path.name + ".chunks"), path):
            p.unlink(missing_ok=True)

    def _partial_path(self, kind: Kind | str, h: str, group: str) -> Path:
        path = self._path(kind, h, group)
        return path.with_name(path.name + PARTIAL)

    # ---- reading (always verified)

    def digests(self, kind: Kind | str, h: str, group: str | None = None) -> list[bytes]:
        """The chunk digests, checked against `h` (cheap: a tree over n digests, no data read)."""
        path = self._require(kind, h, group)
        obj = _object_path(path)
        raw = obj.with_name(obj.name + ".chunks").read_bytes()
        digests = [raw[i : i + chunks.DIGEST] for i in range(0, len(raw), chunks.DIGEST)]
        size = _Segments.of(path).length
        if not chunks.verify_manifest(h, DOMAINS[Kind(kind)], self.chunk_bytes, size, digests):
            raise StoreError(f"{obj.name}: stored chunk digests do not match its hash")
        return digests

    def length(self, kind: Kind | str, h: str, group: str | None = None) -> int:
        return _Segments.of(self._require(kind, h, group)).length

    def read(
        self, kind: Kind | str, h: str, start: int = 0, end: int | None = None, group: str | None = None
    ) -> Iterator[bytes]:
        """Bytes [start, end) in pieces of at most one chunk, each whole chunk checked before any of
        its bytes are given out (so a range costs the chunks it touches)."""
        path = self._require(kind, h, group)
        digests = self.digests(kind, h, group)
        segments = _Segments.of(path)
        size = segments.length
        end = size if end is None else min(end, size)
        if not 0 <= start <= end:
            raise StoreError(f"range [{start}, {end}) outside {size} bytes")
        c = self.chunk_bytes
        name = _object_path(path).name
        with segments.open() as reader:

            def chunk(i: int) -> bytearray:
                a, b = chunks.chunk_span(i, size, c)
                buf = bytearray(b - a)
                got = reader.read_into(a, buf)
                if got != len(buf) or chunks.chunk_digest(buf) != digests[i]:
                    raise StoreError(f"{name}: chunk {i} is corrupted on disk")
                return buf

            with contextlib.closing(read_ahead(chunk, range(start // c, -(-end // c)))) as ahead:
                for i, buf in ahead:  # (closed before the files are, however the reader stops)
                    a = i * c
                    lo, hi = max(a, start) - a, min(a + len(buf), end) - a
                    yield bytes(buf[lo:hi]) if (lo, hi) != (0, len(buf)) else bytes(buf)

    def verify(self, kind: Kind | str, h: str, group: str | None = None) -> None:
        """Read every chunk once and check it (O(chunk) memory); `StoreError` if one is corrupted."""
        for _ in self.read(kind, h, group=group):
            pass

    def read_bytes(self, kind: Kind | str, h: str, group: str | None = None) -> bytes:
        return b"".join(self.read(kind, h, group=group))

    def load_into(self, kind: Kind | str, h: str, sink: TensorSink, group: str | None = None) -> None:
        pos = 0
        for piece in self.read(kind, h, group=group):
            sink.write_at(pos, piece)
            pos += len(piece)
        if pos != sink.length:
            raise StoreError(f"{Kind(kind).value} {h[:12]}: {pos} bytes, the layout needs {sink.length}")

    def load_tensors(
        self, kind: Kind | str, h: str, specs: Sequence[TensorSpec] | None = None, group: str | None = None
    ) -> dict[str, Tensor]:
        """The stored tensor set; with `specs` (the node's own layout) it streams into fresh tensors,
        without them it parses the whole verified file (small objects)."""
        if specs is not None:
            if canonical_size(specs) != self.length(kind, h, group):
                raise StoreError(f"{Kind(kind).value} {h[:12]} does not fit this model's layout")
            sink = TensorSink(specs)
            self.load_into(kind, h, sink, group)
            return sink.tensors
        try:
            return decode_canonical(self.read_bytes(kind, h, group))
        except TensorFormatError as e:
            raise StoreError(f"{Kind(kind).value} {h[:12]}: {e}") from e

    # ---- deleting

    def delete(self, kind: Kind | str, h: str, group: str | None = None) -> None:
        """The object and any partial copy of it (in `group`, or in every group)."""
        for g in [group] if group is not None else self.groups():
            self.delete_partial(kind, h, g)
        path = self.find(kind, h, group)
        if path is not None:
            obj = _object_path(path)
            path.unlink(missing_ok=True)  # the file, or the index first: the object is gone at once
            obj.with_name(obj.name + ".chunks").unlink(missing_ok=True)
            for shard in obj.parent.glob(obj.name + ".r*"):
                shard.unlink(missing_ok=True)

    def drop_group(self, group: str) -> None:
        """Every object of `group` goes at once: the folder is renamed away (atomic), then deleted,
        so a crash mid-way never leaves half an object visible (`sweep` finishes the deletion)."""
        d = self.root / str(group)
        if not _GROUP.match(str(group)) or not d.is_dir():
            return
        with self._partials_lock:
            for p in [p for p in self._partials if p.parent == d]:
                del self._partials[p]
        trash = self.root / f"{TRASH}{group}-{os.getpid()}-{threading.get_ident()}"
        try:
            os.replace(d, trash)
        except FileNotFoundError:  # dropped by another thread meanwhile
            return
        shutil.rmtree(trash, ignore_errors=True)

    def sweep(self) -> list[Path]:
        """What a process killed mid-write left, removed; call it once at start-up, before anything
        writes (the node holds its data folder's lock): temp and part files, groups being dropped,
        digest lists without their object, objects without their digests, rank files of sharded
        objects never sealed. Returns what was removed (each of those is unreadable anyway: a
        listing skips it and a read refuses it)."""
        gone = stale_files(self.root)
        for p in gone:
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
        return gone


# ---------------------------------------------------------------- partial objects


PARTIAL = ".partial"
"""Suffix of a partial object's data file (`<hash>.<kind>.partial`); its manifest is
`<name>.partial.chunks`, the chunks it holds `<name>.partial.held`."""
HELD = ".held"
PERSIST_S = 1.0
"""A partial object's held list is made durable at most this often while chunks stream in (and
when the fetch ends): a crash loses at most this much of what was fetched, never claims more."""


class NotHeld(StoreError):
    """A byte range touching a chunk a partial object does not hold."""


class PartialObject:
    """Some chunks of a content-addressed object, with its whole manifest: what a node that fetched
    part of an object (θ_H's parameter chunks) keeps and serves (specs §8).

    `<name>.partial` holds the object's bytes at their own offsets (only held chunks mean
    anything), `<name>.partial.chunks` the manifest (checked against the hash when written and when
    opened), `<name>.partial.held` which chunks are held, rewritten atomically only after their
    bytes are on disk. Every read checks each chunk against its digest, so the held list is a
    claim, never trusted alone. Chunks arrive whole and already verified (`write_at` is a fetch
    sink); the held set only grows. Thread-safe; no file stays open between calls."""

    def __init__(self, path: Path, kind: Kind, h: str, length: int, chunk_bytes: int,
                 digests: list[bytes], held: set[int]) -> None:  # fmt: skip
        self.path, self.kind, self.hash, self.length = path, kind, h, length
        self.chunk_bytes, self._digests, self._held = chunk_bytes, digests, held
        self.n_chunks = chunks.n_chunks(length, chunk_bytes)
        self._lock = threading.Lock()
        self._persisted = time.monotonic()
        self._dirty = False

    @property
    def held_path(self) -> Path:
        return self.path.with_name(self.path.name + HELD)

    @classmethod
    def create(cls, path: Path, kind: Kind, h: str, length: int, chunk_bytes: int,
               digests: Sequence[bytes]) -> PartialObject:  # fmt: skip
        """A new partial object holding nothing: the data file (sparse), then the manifest."""
        digests = [bytes(d) for d in digests]
        if not chunks.verify_manifest(h, DOMAINS[kind], chunk_bytes, length, digests):
            raise StoreError(f"{path.name}: chunk digests do not match its hash")
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if os.fstat(fd).st_size != length:
                os.ftruncate(fd, length)
        finally:
            os.close(fd)
        atomic_write(path.with_name(path.name + ".chunks"), b"".join(digests))
        return cls(path, kind, h, length, chunk_bytes, digests, set())

    @classmethod
    def open(cls, path: Path, kind: Kind, h: str, chunk_bytes: int) -> PartialObject:
        """One on disk: its manifest checked against the hash; an unreadable held list holds nothing."""
        try:
            length = path.stat().st_size
            raw = path.with_name(path.name + ".chunks").read_bytes()
        except OSError as e:
            raise StoreError(f"{path.name}: {e}") from e
        digests = [raw[i : i + chunks.DIGEST] for i in range(0, len(raw), chunks.DIGEST)]
        if not chunks.verify_manifest(h, DOMAINS[kind], chunk_bytes, length, digests):
            raise StoreError(f"{path.name}: stored chunk digests do not match its hash")
        obj = cls(path, kind, h, length, chunk_bytes, digests, set())
        # nothing made durable yet (or a torn claim): its chunks are fetched again
        with contextlib.suppress(OSError, HeldError):
            obj._held = parse_held(obj.held_path.read_bytes(), obj.n_chunks)
        return obj

    # ---- what it holds

    def digests(self) -> list[bytes]:
        return list(self._digests)

    def held(self) -> frozenset[int]:
        with self._lock:
            return frozenset(self._held)

    def held_bitmap(self) -> bytes:
        with self._lock:
            return held_bitmap(self._held, self.n_chunks)

    def holds(self, start: int, end: int) -> bool:
        """Every chunk that bytes [start, end) touch is held."""
        c = self.chunk_bytes
        with self._lock:
            return start < end and all(i in self._held for i in range(start // c, -(-end // c)))

    @property
    def complete(self) -> bool:
        with self._lock:
            return len(self._held) == self.n_chunks

    # ---- writing: whole verified chunks

    def write_at(self, offset: int, data: Piece) -> None:
        """Chunk `offset // chunk_bytes`, whole, as a fetch delivers it (already checked against its
        digest; reads check it again)."""
        view = memoryview(data).cast("B")
        i, rest = divmod(offset, self.chunk_bytes)
        end = chunks.chunk_span(i, self.length, self.chunk_bytes)[1] if 0 <= i < self.n_chunks else -1
        whole = end - offset == len(view)
        if rest or not whole:
            raise StoreError(f"{self.path.name}: [{offset}, {offset + len(view)}) is not one whole chunk")
        fd = os.open(self.path, os.O_WRONLY)
        try:
            while len(view):
                n = os.pwrite(fd, view, offset)
                view, offset = view[n:], offset + n
        finally:
            os.close(fd)
        with self._lock:
            self._held.add(i)
            self._dirty = True
            due = time.monotonic() - self._persisted >= PERSIST_S
        if due:
            self.flush()

    def flush(self) -> None:
        """Make the held list durable: the data first (fdatasync), then the list (atomic rewrite)."""
        with self._lock:
            if not self._dirty:
                return
            held = held_bitmap(self._held, self.n_chunks)
            self._dirty = False
            self._persisted = time.monotonic()
            fd = os.open(self.path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            atomic_write(self.held_path, held)

    # ---- reading (always verified)

    def read(self, start: int, end: int) -> Iterator[bytes]:
        """Bytes [start, end), each whole chunk checked against its digest before any of its bytes
        are given out; `NotHeld` (before any byte) if a chunk the range touches is not held."""
        end = min(end, self.length)
        if not 0 <= start < end:
            raise StoreError(f"range [{start}, {end}) outside {self.length} bytes")
        if not self.holds(start, end):
            raise NotHeld(f"{self.path.name}: bytes [{start}, {end}) touch a chunk not held")
        c = self.chunk_bytes

        def chunk(i: int) -> bytearray:
            a, b = chunks.chunk_span(i, self.length, c)
            try:
                with open(self.path, "rb", buffering=0) as f:
                    f.seek(a)
                    buf = bytearray(b - a)
                    got = f.readinto(buf)
            except OSError as e:
                raise StoreError(f"{self.path.name}: {e}") from e
            if got != len(buf) or chunks.chunk_digest(buf) != self._digests[i]:
                raise StoreError(f"{self.path.name}: chunk {i} is corrupted on disk")
            return buf

        with contextlib.closing(read_ahead(chunk, range(start // c, -(-end // c)))) as ahead:
            for i, buf in ahead:
                a = i * c
                lo, hi = max(a, start) - a, min(a + len(buf), end) - a
                yield bytes(buf[lo:hi]) if (lo, hi) != (0, len(buf)) else bytes(buf)


# ---------------------------------------------------------------- a sharded host's objects


def put_shard(
    store: ContentStore, kind: Kind | str, h: str, group: str, rank: int, pieces: Iterable[Piece]
) -> Path:
    """Rank `rank`'s bytes of object `h` (its byte ranges, in order); invisible until sealed."""
    if not isinstance(rank, int) or not 0 <= rank < MAX_SHARDS:
        raise StoreError(f"bad shard rank {rank!r}")
    path = store._path(kind, h, group)
    shard = path.with_name(f"{path.name}.r{rank}")
    atomic_write_pieces(shard, pieces)
    return shard


def seal_shards(
    store: ContentStore,
    kind: Kind | str,
    h: str,
    group: str,
    length: int,
    layout: Sequence[Sequence[tuple[int, int]]],
    digests: Sequence[bytes],
) -> Path:
    """Make a sharded object visible: `layout[r]` = the byte ranges rank r's file holds, in
    order. Checked first: the ranges tile [0, length), each file has exactly their bytes, and
    the digests are the object's (`h`). Then the digests, then the index (the commit point)."""
    kind = Kind(kind)
    path = store._path(kind, h, group)
    _check_layout(path, length, layout)
    if not chunks.verify_manifest(h, DOMAINS[kind], store.chunk_bytes, length, digests):
        raise StoreError(f"{path.name}: chunk digests do not match its hash")
    atomic_write_pieces(path.with_name(path.name + ".chunks"), [b"".join(digests)])
    index = {"version": 1, "length": length, "shards": [[list(r) for r in rs] for rs in layout]}
    atomic_write(path.with_name(path.name + SHARDS), json.dumps(index).encode())
    return path


def stale_files(root: Path) -> list[Path]:
    """What `ContentStore.sweep` would remove under `root`, removing nothing: a check that a
    store holds complete objects only (the chaos test's, after a run of kills and restarts)."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [d for d in sorted(root.iterdir()) if d.is_dir() and d.name.startswith(TRASH)]
    for d in sorted(root.iterdir()):
        if d.is_dir() and _GROUP.match(d.name):
            found += [p for p in sorted(d.iterdir()) if _stale(p)]
    return found


def sweep_temps(folder: Path) -> list[Path]:
    """`atomic_write` temps (`.tmp-*`) a killed process left directly in `folder` (a node's
    node.json, its commit records), removed: call it at start-up, before the node writes there."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    gone = [p for p in sorted(folder.glob(".tmp-*")) if p.is_file()]
    for p in gone:
        p.unlink(missing_ok=True)
    return gone


TRASH = ".trash-"
_RANK = re.compile(r"\.r\d+$")


def _stale(p: Path) -> bool:
    """A file `sweep` removes: not part of any complete object."""
    name = p.name
    if not p.is_file():
        return False
    if name.startswith("."):  # .tmp-* (staged writes), .<name>.part-* (fetches)
        return True
    if name.endswith(".chunks"):
        obj = p.with_name(name.removesuffix(".chunks"))
        return not _present(obj)
    if name.endswith(PARTIAL + HELD):
        return not p.with_name(name.removesuffix(HELD)).is_file()
    if _RANK.search(name):
        return not p.with_name(_RANK.sub("", name) + SHARDS).is_file()
    if name.endswith(SHARDS):
        return not p.with_name(name.removesuffix(SHARDS) + ".chunks").is_file()
    return not p.with_name(name + ".chunks").is_file()
