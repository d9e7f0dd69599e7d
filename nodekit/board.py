"""One status/metrics board per node: the JSON `/status` serves and the Prometheus registry
`/metrics` serves, updated under one lock (the node loop, its pool and HTTP threads share it)."""

from __future__ import annotations

import enum
import json
import threading
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter


class NodePhase(enum.StrEnum):
    """What a node is doing, as `/status` shows it and its Prometheus phase gauge counts it."""

    STARTING = "STARTING"
    WAITING = "WAITING"
    """For the chain to reach the step's phase it acts in."""
    TRAINING = "TRAINING"
    COMMITTED = "COMMITTED"
    REVEALED = "REVEALED"
    AGGREGATING = "AGGREGATING"
    SITTING_OUT = "SITTING_OUT"
    """A host that cannot train this step (its run state is behind or not resolvable)."""
    FOLLOWING = "FOLLOWING"
    """A verifier that joined late, catching up with the global models."""
    VERIFYING = "VERIFYING"
    DONE = "DONE"


HOST_PHASES = (
    NodePhase.STARTING, NodePhase.WAITING, NodePhase.TRAINING, NodePhase.COMMITTED, NodePhase.REVEALED,
    NodePhase.AGGREGATING, NodePhase.SITTING_OUT, NodePhase.DONE,
)  # fmt: skip


class Board:
    def __init__(self, **status: Any) -> None:
        self._lock = threading.Lock()
        self.status: dict[str, Any] = dict(status)
        self.extra: Callable[[], dict[str, Any]] | None = None
        """Fields computed when `/status` is read (counters kept elsewhere: the node's traffic)."""
        self.registry = CollectorRegistry()
        r = self.registry
        self.fetch_resumed = Counter("gonka_fetch_resumed", "transfers resumed mid-chunk (Range)", registry=r)
        self.fetch_bad_chunks = Counter(
            "gonka_fetch_bad_chunks", "chunks that failed their digest", registry=r
        )
        self.fetch_bytes = Counter("gonka_fetch_bytes", "object bytes fetched, by kind", ["kind"], registry=r)

    def set(self, **fields: Any) -> None:
        with self._lock:
            self.status.update(fields)

    def update(self, key: str, fn: Any) -> None:
        """status[key] = fn(status[key]) under the lock (counters, maps)."""
        with self._lock:
            self.status[key] = fn(self.status.get(key))

    def snapshot(self) -> dict[str, Any]:
        extra = self.extra() if self.extra is not None else {}
        with self._lock:
            return json.loads(json.dumps({**self.status, **extra}, default=str))

    def fetched(self, report: Any) -> dict[str, Any]:
        """Account one `BlobClient.fetch` report; returns the fields of its log line."""
        self.fetch_resumed.inc(report.resumed)
        self.fetch_bad_chunks.inc(report.bad_chunks)
        self.fetch_bytes.labels(report.ref.kind.value).inc(sum(report.bytes_from.values()))
        return {
            "kind": report.ref.kind.value,
            "hash": report.ref.hash,
            "bytes": sum(report.bytes_from.values()),
            "chunks_from": dict(report.chunks_from),
            "resumed": report.resumed,
            "bad_chunks": report.bad_chunks,
            "coded_bytes": report.coded_bytes,  # of `bytes`, those of chunks that came coded (§8.2)
            "coded_raw": report.coded_raw,  # and what they decoded to
        }
