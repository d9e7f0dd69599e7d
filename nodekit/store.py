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
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from nodekit.objects import DOMAINS, Kind, check_ref
from protocol import chunks
from protocol.chunks import DEFAULT_CHUNK_BYTES, Piece
from protocol.tensors import (
    StateKind,
    TensorFormatError,
    TensorSpec,
    canonical_bytes,
    canonical_header,
    canonical_pieces,
    canonical_size,
    data_offsets,
    decode_canonical,
    specs_of,
    tensor_hash,
)

_GROUP = re.compile(r"^[a-z0-9_-]{1,40}$")
READ_BLOCK = 1 << 20


class StoreError(ValueError):
    """Missing, malformed or corrupted stored data."""


# ---------------------------------------------------------------- the groups both nodes keep

OPTIMIZER_GROUP = "optimizer"
"""Carried optimizer states (a host's own, the starts a verifier needs), across outer steps."""
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
        self, specs: Sequence[TensorSpec] | None = None, tensors: Mapping[str, Tensor] | None = None
    ):
        if sys.byteorder != "little":  # pragma: no cover
            raise RuntimeError("the canonical form is little-endian")
        if tensors is not None:
            self.specs = specs_of(tensors)
            self.tensors = dict(tensors)
        elif specs is not None:
            self.specs = sorted(specs, key=lambda s: s[0].encode())
            self.tensors = {n: torch.empty(shape, dtype=dt) for n, dt, shape in self.specs}
        else:
            raise ValueError("TensorSink needs specs or tensors")
        self.header = canonical_header(self.specs)
        self.length = canonical_size(self.specs)
        offsets = data_offsets(self.specs)
        self._regions = sorted((a, b, n) for n, (a, b) in offsets.items() if b > a)
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
        while len(view):
            a, b, name = self._regions[i]
            if offset >= b:
                i += 1
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

    # ---- paths

    def _path(self, kind: Kind | str, h: str, group: str) -> Path:
        kind = check_ref(kind, h)
        if not _GROUP.match(str(group)):
            raise StoreError(f"bad group {group!r}")
        return self.root / str(group) / f"{h}.{kind.value}"

    def find(self, kind: Kind | str, h: str, group: str | None = None) -> Path | None:
        """The object's file, or for a sharded object its shard index (`<name>.shards`)."""
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

    def put_shard(self, kind: Kind | str, h: str, group: str, rank: int, pieces: Iterable[Piece]) -> Path:
        """Rank `rank`'s bytes of object `h` (its byte ranges, in order); invisible until sealed."""
        if not isinstance(rank, int) or not 0 <= rank < MAX_SHARDS:
            raise StoreError(f"bad shard rank {rank!r}")
        path = self._path(kind, h, group)
        shard = path.with_name(f"{path.name}.r{rank}")
        atomic_write_pieces(shard, pieces)
        return shard

    def seal_shards(
        self,
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
        path = self._path(kind, h, group)
        _check_layout(path, length, layout)
        if not chunks.verify_manifest(h, DOMAINS[kind], self.chunk_bytes, length, digests):
            raise StoreError(f"{path.name}: chunk digests do not match its hash")
        atomic_write_pieces(path.with_name(path.name + ".chunks"), [b"".join(digests)])
        index = {"version": 1, "length": length, "shards": [[list(r) for r in rs] for rs in layout]}
        atomic_write(path.with_name(path.name + SHARDS), json.dumps(index).encode())
        return path

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
        return path

    def abort(self, sink: FileSink) -> None:
        sink.close()
        sink.path.unlink(missing_ok=True)

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


SHARDS = ".shards"
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
    if _RANK.search(name):
        return not p.with_name(_RANK.sub("", name) + SHARDS).is_file()
    if name.endswith(SHARDS):
        return not p.with_name(name.removesuffix(SHARDS) + ".chunks").is_file()
    return not p.with_name(name + ".chunks").is_file()
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
) -> Iterator[tuple[int, bytearray]]:
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


# ---------------------------------------------------------------- training states by outer step


def state_to_bytes(state: Mapping[str, Tensor]) -> bytes:
    """The served and stored form of a state: its canonical bytes (never pickle)."""
    return canonical_bytes(state)


def state_from_bytes(
    data: bytes,
    expected_hash: str | None = None,
    kind: StateKind = StateKind.TRAINING,
    *,
    max_bytes: int | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> dict[str, Tensor]:
    """Parse untrusted canonical bytes, bounded in size, and check the content hash if given."""
    if max_bytes is not None and len(data) > max_bytes:
        raise StoreError(f"state of {len(data)} bytes exceeds the limit of {max_bytes}")
    try:
        state = decode_canonical(data)
    except TensorFormatError as e:
        raise StoreError(f"not a canonical tensor set: {e}") from e
    if expected_hash is not None:
        got = tensor_hash(state, kind, chunk_bytes)
        if got != expected_hash:
            raise StoreError(f"state hash {got[:12]}… does not match the expected {expected_hash[:12]}…")
    return state


_KIND_OF = {StateKind.TRAINING: Kind.STATE, StateKind.OPTIMIZER: Kind.OPTIMIZER, StateKind.GLOBAL: Kind.MODEL}


class StateStore:
    """Training (and optimizer) states by outer step over a `ContentStore`: what a host persists
    at boundaries and serves when opened. Kept for the behaviours' `ctx.store`."""

    def __init__(
        self, root: Path | str, *, chunk_bytes: int = DEFAULT_CHUNK_BYTES, checkpoint_every: int = 1
    ) -> None:
        self.content = ContentStore(root, chunk_bytes)
        self.root = self.content.root
        self.chunk_bytes = chunk_bytes
        self.checkpoint_every = max(1, checkpoint_every)
        """m: a host persists every m-th boundary while training (trainer.commit.Boundaries)."""
        self.pending: list[Future[Any]] = []
        """Writes still running in the background (the last boundary of a step)."""

    def flush(self) -> None:
        """Wait for background writes; a failed one is re-raised here."""
        while self.pending:
            self.pending.pop().result()

    def put(self, state: Mapping[str, Tensor], outer_step: int, kind: StateKind = StateKind.TRAINING) -> str:
        return self.content.put_tensors(_KIND_OF[kind], state, _group(outer_step))

    def put_hashed(
        self,
        state: Mapping[str, Tensor],
        outer_step: int,
        h: str,
        digests: Sequence[bytes] | None = None,
        kind: StateKind = StateKind.TRAINING,
    ) -> None:
        """Save a state whose hash the caller just computed (saves hashing twice on the hot path)."""
        pieces = canonical_pieces(state)
        if digests is None:
            self.content.put_pieces(_KIND_OF[kind], pieces, _group(outer_step))
        else:
            self.content.put_pieces(_KIND_OF[kind], pieces, _group(outer_step), h=h, digests=digests)

    def stage_hashed(
        self, state: Mapping[str, Tensor], outer_step: int, h: str, digests: Sequence[bytes]
    ) -> Callable[[], None]:
        """`put_hashed` in two halves (`ContentStore.stage_pieces`): bytes now, durable later."""
        return self.content.stage_pieces(Kind.STATE, canonical_pieces(state), _group(outer_step), h, digests)

    def has(self, h: str, outer_step: int | None = None, kind: StateKind = StateKind.TRAINING) -> bool:
        self.flush()
        group = None if outer_step is None else _group(outer_step)
        return self.content.has(_KIND_OF[kind], h, group)

    def find(self, h: str, outer_step: int | None = None, kind: StateKind = StateKind.TRAINING) -> Path:
        self.flush()
        group = None if outer_step is None else _group(outer_step)
        path = self.content.find(_KIND_OF[kind], h, group)
        if path is None:
            raise StoreError(f"state {h[:12]}… is not in the store")
        return path

    def get_bytes(self, h: str, outer_step: int | None = None, kind: StateKind = StateKind.TRAINING) -> bytes:
        self.flush()
        group = None if outer_step is None else _group(outer_step)
        if not self.content.has(_KIND_OF[kind], h, group):
            raise StoreError(f"state {h[:12]}… is not in the store")
        return self.content.read_bytes(_KIND_OF[kind], h, group)

    def get(
        self,
        h: str,
        outer_step: int | None = None,
        kind: StateKind = StateKind.TRAINING,
        specs: Sequence[TensorSpec] | None = None,
    ) -> dict[str, Tensor]:
        self.flush()
        group = None if outer_step is None else _group(outer_step)
        if not self.content.has(_KIND_OF[kind], h, group):
            raise StoreError(f"state {h[:12]}… is not in the store")
        return self.content.load_tensors(_KIND_OF[kind], h, specs, group)

    def delete(self, h: str, outer_step: int | None = None, kind: StateKind = StateKind.TRAINING) -> None:
        self.flush()
        self.content.delete(_KIND_OF[kind], h, None if outer_step is None else _group(outer_step))

    def hashes(self, outer_step: int, kind: StateKind = StateKind.TRAINING) -> list[str]:
        self.flush()
        return self.content.hashes(_KIND_OF[kind], _group(outer_step))

    def outer_steps(self) -> list[int]:
        return sorted(m for g in self.content.groups() if (m := state_group_step(g)) is not None)

    def prune(self, before: int) -> list[int]:
        """Delete every outer step < `before` (those are finalized); returns what was removed."""
        self.flush()
        gone = [n for n in self.outer_steps() if n < before]
        for n in gone:
            self.content.drop_group(_group(n))
        return gone

    def bytes_on_disk(self) -> int:
        return sum(p.stat().st_size for p in self.root.rglob("*") if p.is_file())


def _group(outer_step: int) -> str:
    if not isinstance(outer_step, int) or outer_step < 0:
        raise StoreError("outer_step must be an int >= 0")
    return str(outer_step)


def clone_state(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    return {k: v.detach().clone() for k, v in state.items()}
