"""Where a verifier's replay gets what it cannot rebuild: a contribution's objects from their
holders, each fetched chunk by chunk straight into the replay's tensors, and kept to serve on."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from torch import Tensor

from nodekit.blobs import (
    BlobClient,
    BlobInvalid,
    BlobUnavailable,
    ChunkCoding,
    fetch_to_store,
)
from nodekit.objects import Kind, ObjectPolicy, ObjectRef
from nodekit.store import (
    EF_GROUP,
    OPTIMIZER_GROUP,
    BytesSink,
    ContentStore,
    PartialObject,
    StoreError,
    TensorSink,
)
from nodekit.storefiles import StoredTensors
from protocol.tensors import TensorSpec, data_offsets
from replay.step import State
from verifier.job import MalformedBlob, MissingData
from verifier.tolerance import PARAM

_locks: dict[tuple[str, str], threading.Lock] = {}
_locks_guard = threading.Lock()


def param_chunks(specs: Sequence[TensorSpec], chunk_bytes: int) -> set[int]:
    """The chunks of a training state of these specs that a fetch of its parameters alone takes
    (`HttpSource.params`): the first (the header) and every chunk holding bytes of a `param/*`
    tensor, from the first parameter byte to the last (they are contiguous: names sort together)."""
    spans = [(a, b) for n, (a, b) in data_offsets(specs).items() if n.startswith(PARAM) and b > a]
    a, b = (min(x for x, _ in spans), max(y for _, y in spans)) if spans else (0, 0)
    return {0, *range(a // chunk_bytes, max(a, b - 1) // chunk_bytes + 1)}


def _lock(store: ContentStore, h: str) -> threading.Lock:
    with _locks_guard:
        return _locks.setdefault((str(store.root), h), threading.Lock())


class _Tee:
    """A sink writing every verified byte twice: into the replay's tensors and into a store file,
    so a fetched state is kept (and served to audit and dispute voters) without being read again."""

    def __init__(self, *sinks: Any) -> None:
        self.sinks = sinks
        self.length = sinks[0].length

    def write_at(self, offset: int, data: bytes | memoryview) -> None:
        for sink in self.sinks:
            sink.write_at(offset, data)


class _PartialTee:
    """A sink into the replay's tensors and, once the manifest is known, a partial object of the
    store: each verified chunk is served to the other checkers as soon as it is ours."""

    def __init__(self, sink: TensorSink, part: PartialObject | None) -> None:
        self.sink, self.part, self.length = sink, part, sink.length

    def write_at(self, offset: int, data: bytes | memoryview) -> None:
        self.sink.write_at(offset, data)  # a chunk that does not fit our layout is never served
        if self.part is not None:
            self.part.write_at(offset, data)


class HttpSource:
    """`BlobSource` over the holders of a contribution's objects (its author first, then the
    verifiers that checked it, then the rest): each object fetched chunk by chunk (Range,
    resumable, every chunk checked against its hash as it arrives) straight into fresh tensors, so
    a state is hashed once and never buffered; errors become reasons.

    With a `store`, what is fetched is also kept there and handed to `keep` (the node serves it):
    opened states under `group` (written as they stream into the replay's tensors), θ_H's
    parameter chunks as a partial object of that state (served chunk by chunk as they arrive),
    optimizer states (segment 0's start, fetched at most once per host) under `optimizer`. A state
    already in the store is read from it, not fetched again. Training states spare the holders in
    `spare` (the contribution's author): they are asked only for chunks no other holder serves, so
    a dispute panel fetches θ_H's parameters from each other and the author uploads them about once."""

    def __init__(
        self,
        client: BlobClient,
        endpoints: str | Sequence[str],
        objects: ObjectPolicy,
        store: ContentStore | None = None,
        on_fetched: Callable[[Any], None] | None = None,
        *,
        group: str | None = None,
        keep: Callable[[Kind, str, str], None] | None = None,
        keep_deltas: Mapping[str, str] | None = None,
        spare: Sequence[str] = (),
        coding: ChunkCoding | None = None,
    ):
        self.client = client
        self.spare = [e for e in spare if e]
        self.coding = coding  # training states' chunks asked for coded against G_n (specs §8.2)
        self.endpoints = [endpoints] if isinstance(endpoints, str) else [e for e in endpoints if e]
        self.objects, self.store, self.group = objects, store, group
        self.on_fetched = on_fetched or (lambda _r: None)
        self.keep = keep or (lambda _k, _h, _g: None)
        self.keep_deltas = dict(keep_deltas or {})  # Δ hash -> group: fetched Δs kept and served

    def _fetch(self, kind: Kind, h: str, sink: Any, have: set[int] | None = None, **kw: Any) -> None:
        try:
            ref = self.objects.ref(kind, h)
            self.on_fetched(self.client.fetch(ref, sink, self.endpoints, have=have, **kw))
        except BlobUnavailable as e:
            raise MissingData(str(e)) from e
        except (BlobInvalid, ValueError) as e:
            raise MalformedBlob(str(e)) from e

    def _tensors(self, kind: Kind, h: str, into: State | None = None) -> State:
        sink = TensorSink(self.objects.specs[kind]) if into is None else TensorSink.into(into)
        kw: dict[str, Any] = {"spare": self.spare, "coding": self.coding} if kind is Kind.STATE else {}
        self._fetch(kind, h, sink, **kw)
        return sink.tensors

    def state(self, leaf_hash: str, into: State | None = None) -> State:
        """Fetched into `into` (the replay model's own tensors) when given: no buffer state."""
        if self.store is None or self.group is None:
            return self._tensors(Kind.STATE, leaf_hash, into)
        sink = TensorSink(self.objects.specs[Kind.STATE]) if into is None else TensorSink.into(into)
        with _lock(self.store, leaf_hash):  # two jobs may open one state (e.g. two zero-Δ hosts)
            if self.store.has(Kind.STATE, leaf_hash, self.group):  # fetched before: verified on read
                self.store.load_into(Kind.STATE, leaf_hash, sink, self.group)
                return sink.tensors
            return self._fetch_kept(leaf_hash, sink)

    def params(self, leaf_hash: str) -> State:
        """θ of a training state (its `param/*` tensors): only the chunks that hold them, and the
        first (the header, compared with our layout), each checked against `leaf_hash`'s manifest —
        4 of a state's 12 B/param. A state we hold already is read from the store; with a store,
        the chunks are kept as a partial object of the state and served to the contribution's
        other checkers (specs §8.1), the author spared."""
        sink = TensorSink(self.objects.specs[Kind.STATE], only=lambda n: n.startswith(PARAM))
        ref = self.objects.ref(Kind.STATE, leaf_hash)
        wanted = param_chunks(self.objects.specs[Kind.STATE], ref.chunk_bytes)
        if self.store is None or self.group is None:
            have = set(range(ref.n_chunks)) - wanted
            self._fetch(Kind.STATE, leaf_hash, sink, have=have, spare=self.spare, coding=self.coding)
            return sink.tensors
        with _lock(self.store, leaf_hash):
            if self.store.has(Kind.STATE, leaf_hash, self.group):
                self.store.load_into(Kind.STATE, leaf_hash, sink, self.group)
                return sink.tensors
            if len(wanted) == ref.n_chunks:  # θ_H's chunks are the whole state: kept whole
                return self._fetch_kept(leaf_hash, sink)
            return self._fetch_partial(ref, sink, wanted)

    def _fetch_partial(self, ref: ObjectRef, sink: TensorSink, wanted: set[int]) -> State:
        """`wanted` chunks of `ref` into `sink` and into the store's partial object of it: the
        chunks it holds already are read from it (verified), the others fetched; it is served
        from the moment its manifest is verified, growing chunk by chunk."""
        assert self.store is not None and self.group is not None
        store, group, h = self.store, self.group, ref.hash
        part = store.open_partial(Kind.STATE, h, group)
        held: frozenset[int] = frozenset()
        if part is not None:
            try:
                held = part.held() & wanted
                for i in sorted(held):
                    pos = ref.span(i)[0]
                    for piece in part.read(*ref.span(i)):
                        sink.write_at(pos, piece)
                        pos += len(piece)
                self.keep(Kind.STATE, h, group)
            except (StoreError, ValueError):  # corrupted on our own disk: all fetched again
                store.delete_partial(Kind.STATE, h, group)
                part, held = None, frozenset()
        tee = _PartialTee(sink, part)

        def manifest(digests: list[bytes]) -> None:
            if tee.part is None:
                tee.part = store.partial(Kind.STATE, h, group, ref.length, digests)
                self.keep(Kind.STATE, h, group)

        try:
            if wanted - held:
                have = set(range(ref.n_chunks)) - (wanted - held)
                self._fetch(
                    Kind.STATE, h, tee, have=have, spare=self.spare, on_manifest=manifest, coding=self.coding
                )
        finally:
            if tee.part is not None:
                tee.part.flush()
        return sink.tensors

    def _fetch_kept(self, leaf_hash: str, sink: TensorSink) -> State:
        assert self.store is not None and self.group is not None
        ref = self.objects.ref(Kind.STATE, leaf_hash)
        part = self.store.begin(Kind.STATE, leaf_hash, self.group, ref.length)
        tee = _Tee(sink, part)
        have = self._from_partial(ref, tee)
        try:
            report = self.client.fetch(
                ref, tee, self.endpoints, have=have, spare=self.spare, coding=self.coding
            )
        except BlobUnavailable as e:
            self.store.abort(part)
            raise MissingData(str(e)) from e
        except (BlobInvalid, ValueError) as e:
            self.store.abort(part)
            raise MalformedBlob(str(e)) from e
        except BaseException:
            self.store.abort(part)
            raise
        self.store.commit(Kind.STATE, leaf_hash, self.group, part, report.digests)
        self.on_fetched(report)
        self.keep(Kind.STATE, leaf_hash, self.group)
        return sink.tensors

    def _from_partial(self, ref: ObjectRef, sink: _Tee) -> set[int]:
        """The chunks of `ref` our partial copy holds (θ_H's parameters, fetched for a Δ check),
        written into `sink` (each read checked against its digest): the whole state then needs
        only the others. A copy that fails its checks is dropped and everything fetched."""
        assert self.store is not None and self.group is not None
        held = self.store.open_partial(Kind.STATE, ref.hash, self.group)
        if held is None:
            return set()
        done = set(held.held())
        try:
            for i in sorted(done):
                pos = ref.span(i)[0]
                for piece in held.read(*ref.span(i)):
                    sink.write_at(pos, piece)
                    pos += len(piece)
        except (StoreError, ValueError):
            self.store.delete_partial(Kind.STATE, ref.hash, self.group)
            return set()
        return done

    def _into_store(self, kind: Kind, h: str, group: str) -> None:
        """A carried state we do not hold yet, fetched from the holders into the store; then served on."""
        assert self.store is not None
        if not self.store.has(kind, h, group):
            try:
                ref = self.objects.ref(kind, h)
                report = fetch_to_store(self.client, self.store, ref, group, self.endpoints)
                if report is not None:
                    self.on_fetched(report)
            except BlobUnavailable as e:
                raise MissingData(str(e)) from e
            except BlobInvalid as e:
                raise MalformedBlob(str(e)) from e
        self.keep(kind, h, group)

    def optimizer(self, optimizer_hash: str, into: State | None = None) -> State:
        if self.store is None:
            return self._tensors(Kind.OPTIMIZER, optimizer_hash, into)
        self._into_store(Kind.OPTIMIZER, optimizer_hash, OPTIMIZER_GROUP)
        sink = TensorSink(self.objects.specs[Kind.OPTIMIZER]) if into is None else TensorSink.into(into)
        self.store.load_into(Kind.OPTIMIZER, optimizer_hash, sink, OPTIMIZER_GROUP)
        return sink.tensors

    def error_feedback(self, ef_hash: str) -> Mapping[str, Tensor]:
        """A host's carried accumulator (codec sparse, specs §4.1) by the hash the chain names: ours
        (derived when we verified its previous step, verified on read) or fetched from its holders
        into the store and served on; read tensor by tensor from disk, never held whole. Without a
        store: fetched into memory."""
        if self.store is None:
            return self._tensors(Kind.ERROR_FEEDBACK, ef_hash)
        with _lock(self.store, ef_hash):
            self._into_store(Kind.ERROR_FEEDBACK, ef_hash, EF_GROUP)
        try:
            specs = self.objects.specs[Kind.ERROR_FEEDBACK]
            return StoredTensors(self.store, Kind.ERROR_FEEDBACK, ef_hash, specs, EF_GROUP)
        except StoreError as e:  # corrupted on our disk: fetched again next time
            self.store.delete(Kind.ERROR_FEEDBACK, ef_hash, EF_GROUP)
            raise MissingData(f"error-feedback accumulator {ef_hash[:12]}: {e}") from e

    def delta(self, delta_hash: str) -> bytes:
        """A Δ we hold (derived or fetched before: verified on read), else fetched. With a store, a
        Δ named in `keep_deltas` (an eager run's parent Δ, under its step's group) is kept there and
        served on: the next verifier of the child fetches it from us too."""
        if self.store is not None and self.store.has(Kind.DELTA, delta_hash):
            try:
                return self.store.read_bytes(Kind.DELTA, delta_hash)
            except (StoreError, ValueError, OSError):
                self.store.delete(Kind.DELTA, delta_hash)  # corrupted on our disk: fetch it again
        sink = BytesSink(self.objects.length(Kind.DELTA))
        self._fetch(Kind.DELTA, delta_hash, sink)
        payload = bytes(sink.buf)
        group = self.keep_deltas.get(delta_hash)
        if self.store is not None and group is not None:
            self.keep(Kind.DELTA, self.store.put_bytes(Kind.DELTA, payload, group), group)
        return payload
