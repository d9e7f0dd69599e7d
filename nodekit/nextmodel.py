"""G by hash and G_{n+1} from the accepted Δs: the one way both nodes get a global model.

A global model comes from memory, else the node's own disk (verified on read), else any holder
(verified chunk by chunk), and is served on once held. G_{n+1} is computed over the Δs the chain
accepted, each fetched from all of its holders at once (a few Δs at a time) and applied one at a
time in sorted host order, decoded tensor by tensor: the same bits on every node, and memory of
one model. A Δ that fails its chunk checks on our own disk is evicted and fetched again; one that
hashes right and still does not decode is nobody's to use.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

from torch import Tensor

from nodekit.chainview import Accepted
from nodekit.fetch import BlobError
from nodekit.globalmodel import BadPayload, GlobalModel, GlobalStore
from nodekit.holdings import Holdings
from nodekit.objects import Kind, ObjectPolicy
from nodekit.runtime import NodeRuntime
from nodekit.store import StoreError, delta_group
from protocol.codecs import CodecError, iter_decode
from protocol.config import OuterOptim
from protocol.errorfeedback import EFConfig

DELTA_FETCHES = 4
"""Accepted Δs fetched at once while aggregating (each from all of its holders at once)."""


class _BadDelta(Exception):
    def __init__(self, host: str, error: Exception) -> None:
        super().__init__(host)
        self.host, self.error = host, error


class GlobalModels:
    """A node's global models: `get(h)`, `keep(gm)`, `prune(keep)`; and the accepted Δs of a step,
    fetched (`fetch_deltas`) and applied (`compute`)."""

    def __init__(
        self,
        rt: NodeRuntime,
        holdings: Holdings,
        layout: Mapping[str, tuple[int, ...]],
        objects: ObjectPolicy,
        outer: OuterOptim,
        peers: Callable[[], list[str]],
        *,
        sparse: EFConfig | None = None,
    ) -> None:
        """`sparse`: the run's sparse codec (chunk, k), whose payloads are summed without ever
        being made dense (specs §4.1); None for the dense codecs."""
        self.rt, self.holdings, self.objects, self.outer, self._peers = rt, holdings, objects, outer, peers
        self.sparse = sparse
        self.store = GlobalStore(holdings.content, dict(layout))
        self._cache: dict[str, GlobalModel] = {}
        self._lock = threading.Lock()

    # ---------------------------------------------------------------- G by hash

    def get(self, h: str) -> GlobalModel:
        """G by hash: memory, own disk (verified), else the peers (verified chunk by chunk)."""
        with self._lock:
            gm = self._cache.get(h)
        if gm is None:
            if not self.store.has(h):
                self.rt.log("fetching_global", model_hash=h)
            gm = self.store.fetch(h, self.rt.blobs, endpoints=self._peers())
            with self._lock:
                gm = self._cache.setdefault(h, gm)
            self.holdings.keep(Kind.MODEL, h)
        return gm

    def has(self, h: str) -> bool:
        with self._lock:
            return h in self._cache or self.store.has(h)

    def keep(self, gm: GlobalModel, *, read_from_disk: bool = False) -> GlobalModel:
        """On disk and served; with `read_from_disk`, held from here on as its file (its tensors read
        when used: G's 8 B/param leave memory)."""
        self.store.save(gm)
        if read_from_disk and not gm.stored:  # the caller drops its copy and calls `release()`
            gm = self.store.load(gm.hash)
        with self._lock:
            self._cache[gm.hash] = gm
        self.holdings.keep(Kind.MODEL, gm.hash)
        return gm

    def forget(self, h: str) -> None:
        """Out of memory (a candidate the chain did not adopt); the file stays until pruned."""
        with self._lock:
            self._cache.pop(h, None)

    def serve_stored(self) -> None:
        """After a restart: serve the models on disk."""
        for h in self.store.hashes():
            self.holdings.keep(Kind.MODEL, h)

    def prune(self, keep: Sequence[str]) -> None:
        for h in self.store.prune(keep):
            self.holdings.withdraw(Kind.MODEL, h)
            self.forget(h)

    # ---------------------------------------------------------------- G_{n+1}

    def fetch_deltas(self, n: int, accepted: Sequence[Accepted]) -> list[str]:
        """Every accepted Δ not yet on disk, fetched from its author, the verifiers that checked it
        and every other participant (a few Δs at once, each from all its holders; every chunk
        checked); returns the hosts whose Δ nobody served, after the fetcher's retries."""
        content = self.holdings.content
        todo = [a for a in accepted if not content.has(Kind.DELTA, a.delta_hash)]
        if not todo:
            return []
        holders = self.rt.view.holders(n, exclude=self.rt.address)

        def one(a: Accepted) -> str | None:
            try:
                self.fetch_delta(n, a, holders.get(a.host, []))
            except BlobError as e:
                self.rt.log("delta_unavailable", outer_step=n, host=a.host, error=f"{type(e).__name__}: {e}")
                return a.host
            return None

        prefix = f"{self.rt.name}-fetch"
        with ThreadPoolExecutor(min(DELTA_FETCHES, len(todo)), thread_name_prefix=prefix) as pool:
            return sorted(h for h in pool.map(one, todo) if h is not None)

    def fetch_delta(self, n: int, a: Accepted, holders: Sequence[str]) -> None:
        """One accepted Δ (its author first, then the given holders), kept and served on."""
        endpoints = [e for e in [a.endpoint, *holders] if e and e != self.rt.url]
        ref = self.objects.ref(Kind.DELTA, a.delta_hash)
        report = self.holdings.fetch(self.rt.blobs, ref, delta_group(n), endpoints, step=n)
        if report is not None:
            self.rt.log("fetched", outer_step=n, host=a.host, **self.rt.board.fetched(report))

    def compute(
        self, n: int, gm: GlobalModel, accepted: Sequence[Accepted], unusable: set[str] | None = None
    ) -> GlobalModel | None:
        """G_{n+1} over the given accepted Δs (all on disk); None if one does not decode (that host
        added to `unusable`) or is corrupted on our disk (evicted: fetched again next time)."""
        by_host = {a.host: a for a in accepted}
        content = self.holdings.content

        def delta_of(host: str) -> Iterator[tuple[str, Tensor]]:
            try:
                yield from iter_decode(content.read_bytes(Kind.DELTA, by_host[host].delta_hash), gm.layout)
            except (CodecError, StoreError) as e:
                raise _BadDelta(host, e) from e

        def payload_of(host: str) -> bytes:
            try:
                return content.read_bytes(Kind.DELTA, by_host[host].delta_hash)
            except StoreError as e:
                raise _BadDelta(host, e) from e

        tokens = {a.host: a.tokens for a in accepted}
        try:
            if self.sparse is not None:
                try:
                    return gm.apply_sparse(
                        tokens, payload_of, self.outer, chunk=self.sparse.chunk, topk=self.sparse.topk
                    )
                except BadPayload as e:
                    raise _BadDelta(e.host, CodecError(str(e))) from e
            return gm.apply_streamed(tokens, delta_of, self.outer)
        except _BadDelta as e:
            error = f"{type(e.error).__name__}: {e.error}"
            self.rt.log("delta_unusable", outer_step=n, host=e.host, error=error)
            if isinstance(e.error, StoreError):
                self.holdings.evict(Kind.DELTA, by_host[e.host].delta_hash, e.error)
            elif unusable is not None:  # it hashes right and still does not decode: nobody can use it
                unusable.add(e.host)
            return None

    def next_model(self, n: int, base: GlobalModel, accepted: Sequence[Accepted]) -> GlobalModel | None:
        """G_{n+1} over the step's final accepted set, None where a Δ could not be had."""
        if self.fetch_deltas(n, accepted):
            return None
        return self.compute(n, base, accepted)
