"""What a node holds: objects in its content store, fetched at most once at a time, and served.

`fetch_to_store` is the one way an object enters a node's store from the network: single-flight
per (store root, kind, hash) within the process (a failed flight is retried by each waiter that
had a holder it did not ask), into a part file private to that fetch, visible only once every
chunk is verified. `Holdings` keeps the disk and the served catalog in step: what
a node stores for others is published as it is stored, dropping it withdraws it, and a copy found
corrupted on disk is evicted in one place (fetched again when next needed).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from torch import Tensor

from nodekit.fetch import BlobClient, FetchReport
from nodekit.flight import FLIGHTS
from nodekit.objects import Kind, ObjectRef
from nodekit.serve import BlobCatalog, Served, StoredObject
from nodekit.store import ContentStore


def flight_key(store: ContentStore, kind: Kind | str, h: str) -> tuple[str, str, str]:
    return (str(store.root.resolve()), Kind(kind).value, h)


def fetch_to_store(
    client: BlobClient, store: ContentStore, ref: ObjectRef, group: str, endpoints: Sequence[str]
) -> FetchReport | None:
    """Fetch `ref` into `group` unless the store has it; returns this call's report, or None when
    the object was already there or another thread of this process fetched it meanwhile. Another
    thread's failure is raised here only if that thread asked every one of `endpoints`; else this
    call tries its own (a thread given only a garbage peer must not fail one given an honest one)."""

    def fetch() -> FetchReport | None:
        if store.has(ref.kind, ref.hash):
            return None
        sink = store.begin(ref.kind, ref.hash, group, ref.length)
        try:
            report = client.fetch(ref, sink, endpoints)
        except BaseException:
            store.abort(sink)
            raise
        store.commit(ref.kind, ref.hash, group, sink, report.digests)
        return report

    sources = [e.rstrip("/") for e in endpoints]
    report, shared = FLIGHTS.do(flight_key(store, ref.kind, ref.hash), fetch, sources)
    return None if shared else report


class Holdings:
    """A node's content store and its served catalog as one: `keep`/`put_*` store and publish,
    `withdraw` stops serving, `drop` withdraws and deletes, `evict` a corrupted copy. Each served
    object remembers the outer step it belongs to (None: not tied to one), so what a finished
    step no longer needs is withdrawn by step (`withdraw_before`)."""

    def __init__(self, content: ContentStore, catalog: BlobCatalog, log: Callable[..., None]) -> None:
        self.content, self.catalog, self._log = content, catalog, log
        self._steps: dict[tuple[Kind, str], int | None] = {}
        self._lock = threading.Lock()

    def keep(self, kind: Kind, h: str, group: str | None = None, step: int | None = None) -> None:
        """Serve an object already in the store (read from disk, every chunk checked on its way out):
        the whole object, or else the chunks of it we hold (a partial object, growing as a fetch
        brings them; asked for any other chunk, the server says it does not hold it)."""
        served: Served | None = None
        if not self.content.has(kind, h, group):
            served = self.content.open_partial(kind, h, group)
        self.catalog.publish(kind, h, served or StoredObject(self.content, kind, h, group))
        with self._lock:
            self._steps[(kind, h)] = step

    def keep_as_is(self, kind: Kind, h: str, load: Callable[[], bytes], step: int | None = None) -> None:
        """Serve bytes that are not in the store under `h` (an adversary's payload that does not hash
        to what it committed): whoever fetches it finds out."""
        self.catalog.publish(kind, h, load)
        with self._lock:
            self._steps[(kind, h)] = step

    def put_bytes(self, kind: Kind, data: bytes, group: str, step: int | None = None) -> str:
        h = self.content.put_bytes(kind, data, group)
        self.keep(kind, h, group, step)
        return h

    def put_tensors(
        self, kind: Kind, tensors: Mapping[str, Tensor], group: str, step: int | None = None, **kw: Any
    ) -> str:
        h = self.content.put_tensors(kind, tensors, group, **kw)
        self.keep(kind, h, group, step)
        return h

    def serves(self, kind: Kind, h: str) -> bool:
        with self._lock:
            return (kind, h) in self._steps

    def withdraw(self, kind: Kind, h: str) -> None:
        self.catalog.withdraw(kind, h)
        with self._lock:
            self._steps.pop((kind, h), None)

    def withdraw_before(self, kind: Kind, step: int) -> None:
        """Stop serving every object of `kind` that belongs to an outer step before `step`."""
        with self._lock:
            old = [h for (k, h), m in self._steps.items() if k is kind and m is not None and m < step]
        for h in old:
            self.withdraw(kind, h)

    def withdraw_all(self, kind: Kind) -> None:
        for _, h in self.catalog.served(kind):
            self.withdraw(kind, h)

    def drop(self, kind: Kind, h: str, group: str | None = None) -> None:
        self.withdraw(kind, h)
        self.content.delete(kind, h, group)

    def evict(self, kind: Kind, h: str, error: Exception) -> None:
        """A copy that fails its checks on our own disk: neither served nor kept (fetched again by
        hash when next needed)."""
        self._log("evicted", kind=kind.value, hash=h, error=f"{type(error).__name__}: {error}")
        self.drop(kind, h)

    def drop_groups(self, step_of: Callable[[str], int | None], before: int) -> list[int]:
        """Every store group of an outer step before `before` (as `step_of` reads it) goes from
        disk, its objects withdrawn first; returns those steps."""
        gone = []
        for group in self.content.groups():
            m = step_of(group)
            if m is not None and m < before:
                for kind in Kind:
                    for h in self.content.hashes(kind, group):
                        self.withdraw(kind, h)
                self.content.drop_group(group)
                gone.append(m)
        return gone

    def fetch(
        self,
        client: BlobClient,
        ref: ObjectRef,
        group: str,
        endpoints: Sequence[str],
        step: int | None = None,
    ) -> FetchReport | None:
        """`fetch_to_store`, then serve it on: a node serves what it fetched to the others."""
        report = fetch_to_store(client, self.content, ref, group, endpoints)
        if not self.serves(ref.kind, ref.hash) and self.content.has(ref.kind, ref.hash, group):
            self.keep(ref.kind, ref.hash, group, step)
        return report


__all__ = ["Holdings", "fetch_to_store", "flight_key"]
