"""What a node holds: objects in its content store, fetched at most once at a time.

`fetch_to_store` is the one way an object enters a node's store from the network: single-flight
per (store root, kind, hash) within the process, into a part file private to that fetch, visible
only once every chunk is verified.
"""

from __future__ import annotations

from collections.abc import Sequence

from nodekit.fetch import BlobClient, FetchReport
from nodekit.flight import FLIGHTS
from nodekit.objects import Kind, ObjectRef
from nodekit.store import ContentStore


def flight_key(store: ContentStore, kind: Kind | str, h: str) -> tuple[str, str, str]:
    return (str(store.root.resolve()), Kind(kind).value, h)


def fetch_to_store(
    client: BlobClient, store: ContentStore, ref: ObjectRef, group: str, endpoints: Sequence[str]
) -> FetchReport | None:
    """Fetch `ref` into `group` unless the store has it; returns this call's report, or None when
    the object was already there or another thread of this process fetched it meanwhile (that
    thread's error, if it failed, is raised here too)."""

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

    report, shared = FLIGHTS.do(flight_key(store, ref.kind, ref.hash), fetch)
    return None if shared else report


__all__ = ["fetch_to_store", "flight_key"]
