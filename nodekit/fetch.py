"""The one fetcher both nodes use: a protocol object from many holders, chunk by chunk, hedged.

`BlobClient.fetch` moves one object (`ObjectRef`: kind, content hash, exact length from the run's
layout, chunk size) into a sink. It gets the chunk digests from the first holder that answers with
a list matching the hash (asked of several at once), then pulls chunks with Range requests from up
to `parallel` holders at once, each chunk into a private buffer that reaches the sink only once
its digest matched: a holder never writes an unverified byte anywhere.

What a slow or hostile holder can cost (specs §8):
- **The clock, not the holder, ends a transfer.** Every read waits at most until the holder's
  progress would fall below the rate floor (`TransferPolicy`: `base_s` of grace, then
  `min_bytes_per_s`), so a holder that stops sending, or sends a byte now and then, is dropped
  when it crosses that line whether or not a byte arrives.
- **Below the floor is out.** Such a holder is dropped for the rest of the round, not resumed; a
  broken connection from a holder that keeps up is resumed at the byte reached (`max_resumes`).
- **Hedged chunks.** A chunk still in flight after `HEDGE_FACTOR` × the time this fetch's chunks
  have been taking (its share of the size-scaled deadline at most) is also asked of an idle
  holder, one more copy per such interval; the first verified copy wins and the others are
  abandoned. So a holder serving correct bytes slowly delays a chunk by about one hedge interval.
- A holder that served a bad chunk or manifest gets no more work from this client.
- **Partial holders.** A holder may hold some chunks only (a dispute panel member that fetched
  θ_H's parameter chunks serves them): asked for another, it answers 404 with `X-Held: partial`,
  which costs it nothing here: this client reads which chunks it holds (`/held`, read again while
  it idles) and asks it only for those. A holder that says it holds a chunk and then does not is
  dropped for the round, and one that holds none of what is left for a chunk's deadline makes way
  for the next.
- **Spared holders** (`fetch(spare=...)`: a contribution's author) are asked only for chunks no
  other working holder may hold, and to hedge: the panel of a dispute fetches θ_H's parameters
  from each other, so its author uploads them about once (specs §8.1). Such fetches
  take their chunks in a random order, so checkers fetching at once mostly take different ones.

Memory: one chunk buffer per worker (O(parallel · chunk)). Bytes wasted by hedging are counted
(`FetchReport.hedged`, `bytes_from`).
"""

from __future__ import annotations

import math
import random
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

import httpx

from nodekit.objects import HeldError, ObjectRef, TransferPolicy, parse_held
from protocol import chunks

HEDGE_FACTOR = 3.0
"""A chunk is hedged once in flight this many times longer than this fetch's chunks take."""
HEDGE_MIN_S = 0.5
"""Never hedge sooner: on a loaded machine a chunk of a few kB can take a scheduling tick."""
MIN_READ_WAIT_S = 0.2
"""The shortest read wait near the floor line (a few reconnects at most before a holder drops)."""
HELD_REFRESH_MIN_S = 0.1
"""An idle partial holder's held chunks are read again at most this often (or once per chunk time
of this fetch, if longer): often enough that a spared author is not asked for a chunk a peer got
meanwhile, and a few tiny requests per chunk at most."""
PARTIAL = "partial"
"""`X-Held` of a 404 from a holder that has the object but not that chunk (`nodekit.serve`)."""


class BlobError(Exception):
    """Base of the fetcher's errors."""


class BlobUnavailable(BlobError):
    """No holder served the object (404, refused, too slow, timed out, 5xx) after every retry."""


class BlobInvalid(BlobError):
    """Some holder served bytes that failed verification, and no holder served valid ones."""


class Sink(Protocol):
    length: int

    def write_at(self, offset: int, data: bytes | memoryview) -> None: ...


class ChunkCoding(Protocol):
    """How a fetch may receive chunks coded against a base it holds (`nodekit.coding.StateCoding`):
    `/coded/{i}?base=` is asked first, its body decoded (a ValueError: the holder's bad bytes), and
    the decoded chunk checked against its digest like any chunk."""

    @property
    def base(self) -> str: ...

    def max_len(self, index: int) -> int: ...

    def decode(self, index: int, data: bytes | bytearray | memoryview) -> bytes: ...


class Chunk(StrEnum):
    """What one attempt at one chunk from one holder came to."""

    OK = "ok"  # verified and written to the sink
    INVALID = "invalid"  # bad bytes or headers: this holder gets no more work
    MISSING = "missing"  # not served (404, refused, broken too often): maybe next round
    SLOW = "slow"  # below the rate floor: dropped for the round, not resumed
    LOST = "lost"  # another holder delivered it first
    NOT_HELD = "not_held"  # a partial holder without this chunk: ask it for the ones it holds
    ABSENT = "absent"  # 404, the object not served: missing, or in a swarm a peer not started yet


@dataclass
class FetchReport:
    """What one `fetch` did: bytes and chunks per holder, resumes, hedges and holders dropped."""

    ref: ObjectRef
    bytes_from: dict[str, int] = field(default_factory=dict)
    chunks_from: dict[str, int] = field(default_factory=dict)
    resumed: int = 0
    bad_chunks: int = 0
    hedged: int = 0
    slow: list[str] = field(default_factory=list)
    digests: list[bytes] = field(default_factory=list)
    coded_bytes: int = 0
    """Bytes on the wire of the chunks that arrived coded (`coding`), and their canonical size."""
    coded_raw: int = 0


class _Broken(Exception):
    """The connection broke, or closed early: resume at the byte reached."""


@dataclass
class _View:
    """What a holder holds, as far as this fetch knows: `held` None = any chunk (unknown yet, or a
    whole copy, which never says otherwise); else the chunks its `/held` listed at `at`."""

    held: set[int] | None = None
    at: float = 0.0


class _Next(StrEnum):
    """What a worker does when `_take` has no chunk for it."""

    DONE = "done"  # nothing left for anyone: the round is over for it
    REFRESH = "refresh"  # a partial holder idle: read its held chunks again
    LEAVE = "leave"  # a partial holder that holds nothing still needed: make way for the next


@dataclass
class _Flight:
    """One chunk being fetched: when it started, by whom, whether a copy has won (`claimed`: its
    verified bytes are being written, no other copy writes them) and whether they are in the sink
    (`done`: only then may the fetch end, or a caller commit a file missing them)."""

    index: int
    started: float
    holders: set[str]
    claimed: bool = False
    done: bool = False


class _Watch:
    """The rate floor of one chunk transfer: `base_s` of grace, then `min_bytes_per_s`."""

    def __init__(self, policy: TransferPolicy) -> None:
        self.policy, self.t0 = policy, time.monotonic()

    def line(self, got: int) -> float:
        """The clock time at which `got` bytes fall below the floor."""
        return self.t0 + self.policy.base_s + got / self.policy.min_bytes_per_s

    def below(self, got: int) -> bool:
        return time.monotonic() > self.line(got)

    def wait(self, got: int) -> float:
        """How long the next read may wait for a byte before the floor decides."""
        return max(MIN_READ_WAIT_S, self.line(got) - time.monotonic())


class BlobClient:
    """Fetch protocol objects from any of several holders (`fetch`, `fetch_manifest`).

    Rounds repeat `retries` times with exponential backoff over the holders that have not served
    bad bytes; `policy` sets the rate floor and grace, `timeout` the connect and write timeouts.
    """

    def __init__(
        self,
        endpoints: Sequence[str] = (),
        timeout: float = 30.0,
        retries: int = 2,
        *,
        backoff: float = 0.5,
        sleep: Callable[[float], None] = time.sleep,
        on_bytes: Callable[[int], None] | None = None,
        policy: TransferPolicy | None = None,
        max_resumes: int = 3,
        parallel: int = 4,
    ) -> None:
        if timeout <= 0 or retries < 0 or backoff < 0:
            raise ValueError("timeout must be positive, retries and backoff non-negative")
        self.endpoints = [e.rstrip("/") for e in endpoints]
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.policy = policy or TransferPolicy(base_s=timeout)
        self.max_resumes = max_resumes
        self.parallel = max(1, parallel)
        self._sleep = sleep
        self._on_bytes = on_bytes
        self._count_lock = threading.Lock()
        self.bytes_received = 0
        self.bytes_by_kind: dict[str, int] = {}
        """Object bytes received (every holder's, verified or not), by object kind: what the node's
        traffic table reports (`NodeRuntime.traffic`)."""
        self.resumed = 0
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=32)
        self._http = httpx.Client(timeout=httpx.Timeout(timeout), limits=limits, follow_redirects=False)

    def received_by_kind(self) -> dict[str, int]:
        with self._count_lock:
            return dict(self.bytes_by_kind)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> BlobClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _count(self, n: int) -> None:
        with self._count_lock:
            self.bytes_received += n
        if self._on_bytes is not None:
            self._on_bytes(n)

    # ---- one object

    def fetch(
        self,
        ref: ObjectRef,
        sink: Sink,
        endpoints: Sequence[str] | None = None,
        *,
        have: set[int] | None = None,
        spare: Collection[str] = (),
        on_manifest: Callable[[list[bytes]], None] | None = None,
        coding: ChunkCoding | None = None,
    ) -> FetchReport:
        """Fill `sink` with the object's bytes, every chunk verified; raises `BlobInvalid` (someone
        served bad bytes and nobody served good ones) or `BlobUnavailable` (nobody served it).
        `have`: chunks not to fetch. `spare`: holders asked only for what no other working holder
        may hold (and to hedge). `on_manifest`: called with the verified chunk digests before any
        chunk reaches the sink (objects of more than one chunk). `coding`: ask holders for chunks
        coded against its base first (specs §8.2), bytes from those that do not code."""
        bases = list(
            dict.fromkeys(e.rstrip("/") for e in (endpoints if endpoints is not None else self.endpoints))
        )
        if not bases:
            raise BlobUnavailable(f"{ref.kind}/{ref.hash[:12]}: no endpoints to ask")
        if sink.length != ref.length:
            raise ValueError(f"sink of {sink.length} bytes for an object of {ref.length}")
        report = FetchReport(ref)
        spared = frozenset(e.rstrip("/") for e in spare)
        try:
            return self._fetch(ref, sink, bases, report, have, spared, on_manifest, coding)
        finally:
            with self._count_lock:
                kind = str(ref.kind)
                self.bytes_by_kind[kind] = self.bytes_by_kind.get(kind, 0) + sum(report.bytes_from.values())

    def _fetch(
        self,
        ref: ObjectRef,
        sink: Sink,
        bases: list[str],
        report: FetchReport,
        have: set[int] | None,
        spare: frozenset[str],
        on_manifest: Callable[[list[bytes]], None] | None,
        coding: ChunkCoding | None,
    ) -> FetchReport:
        invalid: dict[str, str] = {}
        missing: dict[str, str] = {}
        views: dict[str, _View] = {}
        plain: set[str] = set()  # holders that do not code: asked for bytes
        digests: list[bytes] | None = None
        order = [i for i in range(ref.n_chunks) if i not in (have or set())]
        if spare:  # checkers fetching one object at once mostly take different chunks first
            random.shuffle(order)
        pending = deque(order)
        for attempt in range(self.retries + 1):
            if attempt:
                self._sleep(self.backoff * 2 ** (attempt - 1))
            live = sorted((b for b in bases if b not in invalid), key=lambda b: b in missing)
            if not live:
                break
            if digests is None:
                digests = self._manifest(ref, live, invalid, missing)
                if digests is None:
                    continue
                report.digests = list(digests)
                if on_manifest is not None and digests:
                    on_manifest(list(digests))
            # holders that failed last round (or did not answer the manifest) are asked last
            ready = sorted((b for b in live if b not in invalid), key=lambda b: b in missing)
            _Round(self, ref, sink, digests, ready, pending, report, invalid, missing, views, spare,
                   coding, plain).run()  # fmt: skip
            if not pending:
                return report
        what = f"{ref.kind}/{ref.hash[:12]}"
        if invalid:
            raise BlobInvalid(f"{what}: " + "; ".join(f"{b}: {r}" for b, r in invalid.items()))
        detail = "; ".join(f"{b}: {r}" for b, r in missing.items())
        raise BlobUnavailable(f"{what} not served after {self.retries + 1} rounds: {detail}")

    # ---- the manifest, asked of several holders at once

    def _manifest(
        self, ref: ObjectRef, bases: list[str], invalid: dict[str, str], missing: dict[str, str]
    ) -> list[bytes] | None:
        """The verified chunk digests; a one-chunk object needs none (its chunk is checked alone)."""
        if ref.n_chunks == 1:
            return []
        want = chunks.DIGEST * ref.n_chunks
        cond = threading.Condition()
        found: list[list[bytes]] = []
        queue = deque(bases)
        active = 0

        def ask(base: str) -> None:
            nonlocal active
            buf = bytearray(want)
            url = f"{base}/blobs/{ref.kind}/{ref.hash}/chunks"
            try:
                verdict, detail, _ = self._download(url, None, buf, lambda: bool(found))
            except Exception as e:  # never leave the asker waiting on a thread that died
                verdict, detail = Chunk.MISSING, f"{type(e).__name__}: {e}"
            with cond:
                active -= 1
                if verdict is Chunk.OK:
                    digests = [bytes(buf[i : i + chunks.DIGEST]) for i in range(0, want, chunks.DIGEST)]
                    if chunks.verify_manifest(ref.hash, ref.domain, ref.chunk_bytes, ref.length, digests):
                        found.append(digests)
                    else:
                        invalid[base] = "chunk digests do not match the hash"
                elif verdict is Chunk.INVALID:
                    invalid[base] = detail
                elif verdict is not Chunk.LOST:
                    missing[base] = detail
                cond.notify_all()

        with cond:
            while not found and (queue or active):
                while queue and active < self.parallel and not found:
                    active += 1
                    threading.Thread(target=ask, args=(queue.popleft(),), daemon=True).start()
                cond.wait()
        return found[0] if found else None

    # ---- one transfer, with the clock enforced

    def _download(
        self,
        url: str,
        span: tuple[int, int, int] | None,
        buf: bytearray,
        lost: Callable[[], bool],
        on_resume: Callable[[], None] | None = None,
        *,
        upto: bool = False,
    ) -> tuple[Chunk, str, int]:
        """`len(buf)` bytes of `url` (the Range `span` = [a, b) of an object of `span[2]` bytes, or the
        whole body) into `buf`: (result, detail, bytes received). `upto`: a whole body of the length
        it declares, at most `len(buf)` (`buf` is cut to it). Each read waits only until the rate
        floor would be crossed; below it the holder is SLOW, whether or not bytes still trickle in."""
        n = cap = len(buf)
        watch = _Watch(self.policy)
        pos = got = breaks = 0
        while pos < n:
            if lost():
                return Chunk.LOST, "", got
            if watch.below(pos):
                return Chunk.SLOW, f"slower than {self.policy.min_bytes_per_s:.0f} B/s", got
            headers = {"Accept-Encoding": "identity"}
            if span is not None:
                headers["Range"] = f"bytes={span[0] + pos}-{span[1] - 1}"
            else:
                pos = 0  # a whole body (the manifest route has no ranges) starts over
            connect = min(self.timeout, max(MIN_READ_WAIT_S, self.policy.base_s))
            timeout = httpx.Timeout(connect, read=watch.wait(pos))
            try:
                with self._http.stream("GET", url, headers=headers, timeout=timeout) as r:
                    if r.status_code == 404:
                        if r.headers.get("x-held") == PARTIAL:
                            return Chunk.NOT_HELD, "chunk not held", got
                        return Chunk.ABSENT, "HTTP 404", got
                    if r.status_code != (206 if span is not None else 200):
                        return Chunk.MISSING, f"HTTP {r.status_code}", got
                    if r.headers.get("content-encoding", "identity").lower() != "identity":
                        return Chunk.INVALID, "content-encoding other than identity", got
                    if span is not None:
                        want = f"bytes {span[0] + pos}-{span[1] - 1}/{span[2]}"
                        if r.headers.get("content-range") != want:
                            return Chunk.INVALID, f"content-range {r.headers.get('content-range')!r}", got
                    elif upto:
                        declared = r.headers.get("content-length", "")
                        if not declared.isdigit() or not 0 < int(declared) <= cap:
                            return Chunk.INVALID, f"body of {declared[:20]!r} bytes, at most {cap} due", got
                        n = int(declared)
                        buf[n:] = b""
                        buf.extend(bytes(n - len(buf)))
                    elif r.headers.get("content-length", str(n)) != str(n):
                        return Chunk.INVALID, f"{r.headers['content-length']} bytes where {n} are due", got
                    for piece in r.iter_raw():
                        if pos + len(piece) > n:
                            return Chunk.INVALID, "more bytes than asked for", got
                        buf[pos : pos + len(piece)] = piece
                        pos += len(piece)
                        got += len(piece)
                        self._count(len(piece))
                        if lost():
                            return Chunk.LOST, "", got
                        if watch.below(pos):
                            return Chunk.SLOW, f"slower than {self.policy.min_bytes_per_s:.0f} B/s", got
                    if pos < n:
                        raise _Broken("connection closed early")
            except (httpx.ReadTimeout, httpx.PoolTimeout):
                continue  # no byte until the floor line: the loop's clock check decides
            except (httpx.HTTPError, _Broken) as e:
                breaks += 1
                if on_resume is not None:
                    on_resume()
                if breaks > self.max_resumes:
                    return Chunk.MISSING, f"{type(e).__name__}: {e}", got
        return Chunk.OK, "", got


class _Round:
    """One round of a fetch: a worker per holder (at most `parallel` at once) takes pending chunks,
    hedges slow ones, and leaves when its holder fails; the next holder in line takes its place.
    A partial holder's worker takes only the chunks it holds (`views`), a spared holder's only
    those no other working holder may hold. The round ends when every chunk is in, or no holder
    is left working."""

    def __init__(
        self,
        client: BlobClient,
        ref: ObjectRef,
        sink: Sink,
        digests: list[bytes],
        bases: list[str],
        pending: deque[int],
        report: FetchReport,
        invalid: dict[str, str],
        missing: dict[str, str],
        views: dict[str, _View] | None = None,
        spare: frozenset[str] = frozenset(),
        coding: ChunkCoding | None = None,
        plain: set[str] | None = None,
    ) -> None:
        self.client, self.ref, self.sink, self.digests = client, ref, sink, digests
        self.pending, self.report, self.invalid, self.missing = pending, report, invalid, missing
        self.views = views if views is not None else {}
        self.spare = spare
        self.coding, self.plain = coding, plain if plain is not None else set()
        # a spared holder is asked from the start: behind partial holders that hold nothing it
        # would wait for one of them to give up its place
        bases = [b for b in bases if b in spare] + [b for b in bases if b not in spare]
        self.reserve = deque(bases[client.parallel :])
        self.first = bases[: client.parallel]
        self.cond = threading.Condition()
        self.flights: dict[int, _Flight] = {}
        self.working = 0
        self.active: set[str] = set()  # holders with a worker now
        self.idle_since: dict[str, float] = {}  # partial holders with nothing to do (since when)
        self.seconds_per_byte: list[float] = []  # of the chunks this round delivered
        self.over = False
        self.error: BaseException | None = None  # our own failure (a full disk): the fetch's

    def run(self) -> None:
        with self.cond:
            for base in self.first:
                self._start(base)
            while not self._finished() and self.error is None:
                self.cond.wait()
            self.over = True  # workers still in a read are abandoned; they never touch the sink
            for f in self.flights.values():
                if not f.done:
                    self.pending.appendleft(f.index)
            self.cond.notify_all()
        if self.error is not None:
            raise self.error

    def _finished(self) -> bool:
        return (not self.pending and all(f.done for f in self.flights.values())) or self.working == 0

    def _start(self, base: str) -> None:
        self.working += 1
        self.active.add(base)
        threading.Thread(target=self._worker, args=(base,), daemon=True).start()

    def _chunk_seconds(self) -> float | None:
        """The median time a chunk of this fetch has taken (None before the first)."""
        if not self.seconds_per_byte:
            return None
        return statistics.median(self.seconds_per_byte) * min(self.ref.chunk_bytes, self.ref.length)

    def _hedge_after(self, f: _Flight) -> float:
        """Seconds after which flight `f` gets one more copy (per copy it already has)."""
        a, b = self.ref.span(f.index)
        share = self.client.policy.timeout(self.ref.length) * (b - a) / self.ref.length
        if self.seconds_per_byte:
            expected = statistics.median(self.seconds_per_byte) * (b - a)
        else:  # nothing delivered yet: a few times the floor's rate is the least to expect
            expected = (b - a) / (4 * self.client.policy.min_bytes_per_s)
        return min(share, max(HEDGE_MIN_S, HEDGE_FACTOR * expected))

    def _may_hold(self, base: str, i: int) -> bool:
        view = self.views.get(base)
        return view is None or view.held is None or i in view.held

    def _eligible(self, base: str, i: int) -> bool:
        """Chunk i may be asked of `base`: it may hold it, and, if `base` is spared, no other
        working holder that is not spared may."""
        if not self._may_hold(base, i):
            return False
        if base not in self.spare:
            return True
        return not any(p != base and p not in self.spare and self._may_hold(p, i) for p in self.active)

    def _take(self, base: str) -> _Flight | _Next:
        """Under the lock: the next chunk for `base` (pending first, else a hedge), waiting while
        others may still hand one back or need a hedge; `_Next` when there is no chunk for it."""
        while not self.over:
            now = time.monotonic()
            j = next((j for j, i in enumerate(self.pending) if self._eligible(base, i)), None)
            if j is not None:
                i = self.pending[j]
                del self.pending[j]
                self.idle_since.pop(base, None)
                f = self.flights[i] = _Flight(i, now, {base})
                return f
            soonest = None
            for f in self.flights.values():
                if f.claimed or base in f.holders or not self._may_hold(base, f.index):
                    continue
                due = f.started + self._hedge_after(f) * len(f.holders)
                if now >= due:
                    f.holders.add(base)
                    self.report.hedged += 1
                    return f
                soonest = due if soonest is None else min(soonest, due)
            if not self.pending and all(f.done for f in self.flights.values()):
                return _Next.DONE
            view = self.views.get(base)
            if view is not None and view.held is not None:  # a partial holder with nothing to do
                idle = self.idle_since.setdefault(base, now)
                if now - idle >= self.client.policy.timeout(self.ref.chunk_bytes):
                    return _Next.LEAVE  # its holdings do not grow: make way for the next holder
                if self.active <= self.idle_since.keys():  # nobody left who serves anything now
                    return _Next.LEAVE
                fresh = max(HELD_REFRESH_MIN_S, self._chunk_seconds() or 0.0)
                if now - view.at >= fresh:
                    return _Next.REFRESH
                soonest = min(soonest or math.inf, view.at + fresh)
            self.cond.wait(None if soonest is None else max(0.0, soonest - now))
        return _Next.DONE

    def _worker(self, base: str) -> None:
        try:
            self._work(base)
        except BaseException as e:  # not the holder's doing (e.g. our disk): end the fetch with it
            with self.cond:
                self.error = self.error or e
                self._leave(base)

    def _leave(self, base: str, start_next: bool = False) -> None:
        """Under the lock: `base`'s worker ends (and the next holder in line takes its place)."""
        self.working -= 1
        self.active.discard(base)
        self.idle_since.pop(base, None)
        if start_next and self.reserve and not self.over:
            self._start(self.reserve.popleft())
        self.cond.notify_all()

    def _fail(self, base: str, verdict: Chunk, detail: str) -> None:
        """Under the lock: `base` gets no more work this round (this fetch, if INVALID)."""
        if verdict is Chunk.INVALID:
            self.report.bad_chunks += 1
            self.invalid[base] = detail
        else:
            self.missing[base] = detail
            if verdict is Chunk.SLOW:
                self.report.slow.append(base)
        self._leave(base, start_next=True)

    def _work(self, base: str) -> None:
        buf = bytearray()
        url = f"{base}/blobs/{self.ref.kind}/{self.ref.hash}"
        while True:
            with self.cond:
                f = self._take(base)
                if f is _Next.DONE:
                    self._leave(base)
                    return
                if f is _Next.LEAVE:
                    self.missing[base] = "holds none of the chunks still needed"
                    self._leave(base, start_next=True)
                    return
            if f is _Next.REFRESH:
                verdict, detail = self._refresh(base)
                if verdict is not Chunk.OK:
                    with self.cond:
                        self._fail(base, verdict, detail)
                    return
                continue
            assert isinstance(f, _Flight)
            a, b = self.ref.span(f.index)
            if len(buf) != b - a:
                buf = bytearray(b - a)

            def lost(f: _Flight = f) -> bool:  # this chunk's copy won elsewhere, or the fetch is over
                return f.claimed or self.over

            t0 = time.monotonic()
            coded = 0
            verdict, detail, n = Chunk.MISSING, "", 0
            if self.coding is not None and base not in self.plain:
                verdict, detail, n, coded = self._coded(base, f.index, buf, lost)
            if not coded and verdict not in (Chunk.NOT_HELD, Chunk.INVALID, Chunk.SLOW, Chunk.LOST):
                verdict, detail, m = self.client._download(
                    url, (a, b, self.ref.length), buf, lost, self._resumed
                )
                n += m
            if verdict is Chunk.OK:
                verdict, detail = self._deliver(f, buf, base)
                if verdict is Chunk.OK and coded:
                    with self.cond:
                        self.report.coded_bytes += coded
                        self.report.coded_raw += b - a
            with self.cond:
                f.holders.discard(base)
                self.report.bytes_from[base] = self.report.bytes_from.get(base, 0) + n
                if verdict is Chunk.OK:
                    self.report.chunks_from[base] = self.report.chunks_from.get(base, 0) + 1
                    self.seconds_per_byte.append((time.monotonic() - t0) / max(1, b - a))
                    self.missing.pop(base, None)
                if verdict in (Chunk.OK, Chunk.LOST):
                    self.cond.notify_all()
                    continue
                if not f.claimed and not f.holders:  # nobody else is on it: back to the queue
                    del self.flights[f.index]
                    self.pending.appendleft(f.index)
                if verdict in (Chunk.NOT_HELD, Chunk.ABSENT) and self._claimed(base, f.index):
                    verdict, detail = Chunk.MISSING, f"said it held chunk {f.index}, then did not"
                elif verdict is Chunk.ABSENT and self._peer(base):  # holds nothing yet
                    self.views[base] = _View(set(), time.monotonic())
                    self.cond.notify_all()
                    continue
                if verdict is not Chunk.NOT_HELD:
                    self._fail(base, Chunk.MISSING if verdict is Chunk.ABSENT else verdict, detail)
                    return
                self.cond.notify_all()  # a partial holder, as far as we knew: ask what it holds
            verdict, detail = self._refresh(base)
            if verdict is not Chunk.OK:
                with self.cond:
                    self._fail(base, verdict, detail)
                return

    def _coded(
        self, base: str, i: int, buf: bytearray, lost: Callable[[], bool]
    ) -> tuple[Chunk, str, int, int]:
        """Chunk i from `base` coded against our base, decoded into `buf` (its digest is checked
        by `_deliver`): (result, detail, bytes received, coded length when decoded, else 0). A
        holder that does not code it (404 `X-Coded: none`, an older node, any other refusal) is
        asked for bytes from now on."""
        assert self.coding is not None
        url = f"{base}/blobs/{self.ref.kind}/{self.ref.hash}/coded/{i}?base={self.coding.base}"
        body = bytearray(self.coding.max_len(i))
        verdict, detail, n = self.client._download(url, None, body, lost, self._resumed, upto=True)
        if verdict is not Chunk.OK:
            if verdict in (Chunk.ABSENT, Chunk.MISSING):
                with self.cond:
                    self.plain.add(base)
            return verdict, detail, n, 0
        try:
            raw = self.coding.decode(i, body)
        except ValueError as e:  # not a coding of this chunk: the holder's bytes are bad
            return Chunk.INVALID, f"coded chunk {i}: {str(e)[:120]}", n, 0
        if len(raw) != len(buf):
            return Chunk.INVALID, f"coded chunk {i} decodes to {len(raw)} bytes, not {len(buf)}", n, 0
        buf[:] = raw
        return Chunk.OK, "", n, len(body)

    def _claimed(self, base: str, i: int) -> bool:
        """Under the lock: `base`'s held list named chunk i."""
        view = self.views.get(base)
        return view is not None and view.held is not None and i in view.held

    def _peer(self, base: str) -> bool:
        """A fellow fetcher of a swarmed object (not a spared author): one that does not serve it
        yet may be fetching it too, and serve its chunks soon."""
        return bool(self.spare) and base not in self.spare

    def _refresh(self, base: str) -> tuple[Chunk, str]:
        """Read which chunks `base` holds (`/held`: ⌈n/8⌉ bytes, exactly)."""
        n = self.ref.n_chunks
        buf = bytearray(-(-n // 8))
        url = f"{base}/blobs/{self.ref.kind}/{self.ref.hash}/held"
        verdict, detail, _ = self.client._download(url, None, buf, lambda: self.over)
        held: set[int] = set()
        if verdict is Chunk.ABSENT and self._peer(base):
            with self.cond:
                if any(self._claimed(base, i) for i in range(n)):
                    return Chunk.MISSING, "held chunks, then the object not served"
        elif verdict is not Chunk.OK:
            return Chunk.MISSING if verdict is Chunk.ABSENT else verdict, f"held chunks: {detail}"
        else:
            try:
                held = parse_held(buf, n)
            except HeldError as e:
                return Chunk.INVALID, f"held chunks: {e}"
        with self.cond:
            self.views[base] = _View(held, time.monotonic())
            self.cond.notify_all()
        return Chunk.OK, ""

    def _resumed(self) -> None:
        with self.cond:
            self.report.resumed += 1
            self.client.resumed += 1

    def _deliver(self, f: _Flight, buf: bytearray, base: str) -> tuple[Chunk, str]:
        """Check the chunk against its digest; the first verified copy is written to the sink."""
        digest = chunks.chunk_digest(buf)
        if self.digests:
            ok = digest == self.digests[f.index]
        else:  # a one-chunk object: its chunk digest is its tree hash
            ref = self.ref
            ok = chunks.root_hash(ref.domain, ref.chunk_bytes, ref.length, digest) == ref.hash
        if not ok:
            return Chunk.INVALID, f"chunk {f.index} does not match its digest"
        with self.cond:
            if f.claimed or self.over:
                return Chunk.LOST, ""
            f.claimed = True  # no other copy writes this chunk
        try:
            self.sink.write_at(self.ref.span(f.index)[0], memoryview(buf))
        except ValueError as e:  # verified bytes that do not fit our layout: nobody's will
            with self.cond:
                f.claimed = False
            return Chunk.INVALID, f"{type(e).__name__}: {e}"
        with self.cond:  # in the sink (and its digest recorded): now the fetch may end
            if not self.digests:
                self.report.digests = [digest]
            f.done = True
            self.cond.notify_all()
        return Chunk.OK, ""


__all__ = [
    "BlobClient",
    "BlobError",
    "BlobInvalid",
    "BlobUnavailable",
    "Chunk",
    "ChunkCoding",
    "FetchReport",
    "Sink",
]
