"""Content-addressed objects over HTTP: the server every node runs and the one fetcher they use.

Served routes (DEVELOPERS-nodes.md): `GET /blobs/{kind}/{hash}` (the object's canonical bytes,
`Range: bytes=a-b` honoured, streamed from disk chunk by chunk, each chunk checked against its
digest before it leaves), `GET /blobs/{kind}/{hash}/chunks` (the chunk digests, 32 bytes each,
with `X-Object-Length` and `X-Chunk-Bytes`), `/status`, `/metrics`.

`BlobClient.fetch` moves one protocol object (`ObjectRef`: kind, content hash, exact length from
the run's layout, chunk size) into a sink: it gets the digest list from any holder and checks it
against the hash, then pulls chunks with Range requests from every holder that has the object at
once, checks each chunk as it arrives, resumes a broken transfer at the byte where it stopped,
gives a holder that served a bad chunk no more work, and scales every deadline with the bytes
asked for. Memory: O(chunk) per transfer (bytes go straight to the sink). `BlobClient.get` is the
older whole-object fetch with a caller's `verify(bytes)`, for small objects and tests.
"""

from __future__ import annotations

import hashlib
import re
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import httpx
import uvicorn
from fastapi import FastAPI, Header, Path, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from nodekit.objects import KINDS, Kind, ObjectRef, TransferPolicy, check_ref
from nodekit.store import ContentStore
from protocol import chunks

BlobKind = Literal["state", "optimizer", "model", "delta"]
DEFAULT_MAX_BYTES = 512 << 20
MAX_ERROR_ECHO = 64
"""The most of a client's input an error body repeats (a 100 kB header is not sent back)."""

Loader = Callable[[], bytes]
ServeFilter = Callable[[str, str, bytes], "bytes | None"]
"""`HostBehaviour.serve_blob`: the bytes to send, or None to refuse."""


class BlobError(Exception):
    """Base of the fetcher's errors."""


class BlobUnavailable(BlobError):
    """No endpoint served the blob (404, refused, timed out, 5xx) after every retry."""


class BlobInvalid(BlobError):
    """Some endpoint served bytes that failed verification (wrong hash, malformed, too large),
    and no endpoint served valid ones."""


class BlobTooLarge(BlobInvalid):
    """The response exceeded the size limit; the transfer was aborted."""


def _check_ref(kind: str, blob_hash: str) -> None:
    check_ref(kind, blob_hash)


# ---------------------------------------------------------------- what a node serves


class Served(Protocol):
    """One object a node can serve: its length, chunk digests, and verified byte ranges."""

    length: int

    def digests(self) -> list[bytes]: ...

    def read(self, start: int, end: int) -> Iterator[bytes]: ...


class BytesObject:
    """An object held in memory (small objects, and whatever a behaviour's filter returns)."""

    def __init__(self, data: bytes, chunk_bytes: int) -> None:
        self.data, self.chunk_bytes, self.length = data, chunk_bytes, len(data)
        self._digests: list[bytes] | None = None

    def digests(self) -> list[bytes]:
        if self._digests is None:
            self._digests = chunks.hash_stream(b"", [self.data], self.chunk_bytes)[1] if self.data else []
        return self._digests

    def read(self, start: int, end: int) -> Iterator[bytes]:
        step = 1 << 20
        for a in range(start, end, step):
            yield self.data[a : min(end, a + step)]


class StoredObject:
    """An object on the node's disk, read through the store (each chunk verified on its way out)."""

    def __init__(self, store: ContentStore, kind: Kind | str, h: str, group: str | None = None) -> None:
        self.store, self.kind, self.h, self.group = store, Kind(kind), h, group
        self.length = store.length(kind, h, group)

    def digests(self) -> list[bytes]:
        return self.store.digests(self.kind, self.h, self.group)

    def read(self, start: int, end: int) -> Iterator[bytes]:
        return self.store.read(self.kind, self.h, start, end, self.group)


class _Lazy:
    """A legacy loader (`() -> bytes`), read on each request."""

    def __init__(self, loader: Loader, chunk_bytes: int) -> None:
        self.loader, self.chunk_bytes = loader, chunk_bytes

    def open(self) -> BytesObject:
        return BytesObject(self.loader(), self.chunk_bytes)


class BlobCatalog:
    """What this node currently serves: (kind, hash) -> object. Thread-safe.

    A host publishes a step's opened states and its Δ only after its reveal is on chain and
    withdraws them when the step is finalized; global models and optimizer states stay while
    they are on disk.
    """

    def __init__(self, chunk_bytes: int = chunks.DEFAULT_CHUNK_BYTES) -> None:
        self._lock = threading.Lock()
        self._items: dict[tuple[str, str], Served | _Lazy] = {}
        self.chunk_bytes = chunk_bytes

    def publish(self, kind: str, blob_hash: str, source: Served | Loader) -> None:
        _check_ref(kind, blob_hash)
        item = source if hasattr(source, "digests") else _Lazy(source, self.chunk_bytes)  # type: ignore[arg-type]
        with self._lock:
            self._items[(kind, blob_hash)] = item  # type: ignore[assignment]

    def withdraw(self, kind: str, blob_hash: str) -> None:
        with self._lock:
            self._items.pop((kind, blob_hash), None)

    def lookup(self, kind: str, blob_hash: str) -> Served | None:
        with self._lock:
            item = self._items.get((kind, blob_hash))
        return item.open() if isinstance(item, _Lazy) else item

    def served(self, kind: str | None = None) -> list[tuple[str, str]]:
        with self._lock:
            return sorted(k for k in self._items if kind is None or k[0] == kind)


def build_app(
    catalog: BlobCatalog,
    status: Callable[[], dict[str, Any]],
    registry: CollectorRegistry | None = None,
    *,
    serve_filter: ServeFilter | None = None,
    on_sent: Callable[[str, int], None] | None = None,
) -> FastAPI:
    """The node's HTTP routes. `serve_filter` (an adversary's hook) sees and may replace whole
    objects; without it objects stream from disk."""
    app = FastAPI(title="gonka-diloco node", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(RequestValidationError)
    async def bad_request(_request: Request, exc: RequestValidationError) -> JSONResponse:
        fields = [".".join(str(x) for x in e.get("loc", ()))[:MAX_ERROR_ECHO] for e in exc.errors()[:4]]
        return JSONResponse({"error": "invalid request", "fields": fields}, status_code=422)

    def resolve(kind: str, blob_hash: str) -> Served | JSONResponse:
        not_served = JSONResponse({"error": "not served", "kind": kind, "hash": blob_hash}, status_code=404)
        try:
            obj = catalog.lookup(kind, blob_hash)
            if obj is None:
                return not_served
            if serve_filter is not None:
                data = b"".join(obj.read(0, obj.length))
                out = serve_filter(kind, blob_hash, data)
                if out is None:
                    return not_served
                obj = BytesObject(out, catalog.chunk_bytes)
            return obj
        except (OSError, ValueError) as e:  # pruned or corrupted on our own disk: say so, keep running
            return JSONResponse({"error": f"unreadable: {type(e).__name__}"}, status_code=404)

    @app.get("/blobs/{kind}/{blob_hash}/chunks")
    def get_chunks(kind: BlobKind, blob_hash: str = Path(pattern=r"^[0-9a-f]{64}$")) -> Response:
        obj = resolve(kind, blob_hash)
        if isinstance(obj, JSONResponse):
            return obj
        try:
            body = b"".join(obj.digests())
        except (OSError, ValueError) as e:
            return JSONResponse({"error": f"unreadable: {type(e).__name__}"}, status_code=404)
        headers = {"X-Object-Length": str(obj.length), "X-Chunk-Bytes": str(catalog.chunk_bytes)}
        return Response(content=body, headers=headers, media_type="application/octet-stream")

    @app.get("/blobs/{kind}/{blob_hash}")
    def get_blob(
        kind: BlobKind,
        blob_hash: str = Path(pattern=r"^[0-9a-f]{64}$"),
        range_header: str | None = Header(None, alias="range", max_length=MAX_ERROR_ECHO),
    ) -> Response:
        obj = resolve(kind, blob_hash)
        if isinstance(obj, JSONResponse):
            return obj
        headers = {"Accept-Ranges": "bytes"}
        status, start, end = 200, 0, obj.length
        if range_header is not None:
            span = parse_range(range_header, obj.length)
            if span is None:
                return Response(status_code=416, headers={"Content-Range": f"bytes */{obj.length}"})
            start, end = span
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{obj.length}"
            status = 206
        headers["Content-Length"] = str(end - start)

        def body() -> Iterator[bytes]:
            for piece in obj.read(start, end):
                if on_sent is not None:
                    on_sent(kind, len(piece))
                yield piece

        return StreamingResponse(
            body(), status_code=status, headers=headers, media_type="application/octet-stream"
        )

    @app.get("/status")
    def get_status() -> JSONResponse:
        return JSONResponse(status())

    @app.get("/metrics")
    def get_metrics() -> Response:
        body = generate_latest(registry) if registry is not None else b""
        return Response(content=body, media_type=CONTENT_TYPE_LATEST)

    return app


_RANGE = re.compile(r"^bytes=(\d{0,19})-(\d{0,19})$")


def parse_range(header: str, size: int) -> tuple[int, int] | None:
    """One `bytes=a-b` / `a-` / `-n` range -> [start, end) within `size`, else None (416).
    Multi-range requests are not served."""
    m = _RANGE.match(header.strip())
    if m is None or (not m.group(1) and not m.group(2)):
        return None
    first, last = m.group(1), m.group(2)
    if not first:  # the last n bytes
        n = int(last)
        return (size - n, size) if 0 < n <= size else None
    start = int(first)
    end = min(int(last) + 1, size) if last else size
    return (start, end) if start < size and start < end else None


def parse_listen(listen: str) -> tuple[str, int]:
    """`host:port` (port 0 = any free port) -> (host, port), with a clear error."""
    host, sep, port = listen.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"listen must be HOST:PORT, got {listen!r}")
    return host, int(port)


class ServerThread:
    """Uvicorn in a daemon thread on a socket bound up front, so the URL is known (and connections
    queue in the backlog) before `start` returns: nobody has to poll for readiness."""

    def __init__(self, app: FastAPI, listen: str = "127.0.0.1:0") -> None:
        host, port = parse_listen(listen)
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._sock.bind((host, port))
            self._sock.listen(128)
        except OSError:
            self._sock.close()
            raise
        self.host, self.port = self._sock.getsockname()[:2]
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, name=f"http:{self.port}", daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> ServerThread:
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout)
        self._sock.close()

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# ---------------------------------------------------------------- the fetcher


class Sink(Protocol):
    length: int

    def write_at(self, offset: int, data: bytes | memoryview) -> None: ...


@dataclass
class _Outcome:
    data: bytes | None = None
    invalid: str | None = None  # served but bad: do not ask this endpoint again
    missing: str | None = None  # not served this time: maybe later


@dataclass
class FetchReport:
    """What one `fetch` did: bytes and chunks per holder, and how often a transfer resumed."""

    ref: ObjectRef
    bytes_from: dict[str, int] = field(default_factory=dict)
    chunks_from: dict[str, int] = field(default_factory=dict)
    resumed: int = 0
    bad_chunks: int = 0
    digests: list[bytes] = field(default_factory=list)


class _Interrupted(Exception):
    """The connection broke mid-chunk: resume at the byte reached."""


class BlobClient:
    """Fetch protocol objects (`fetch`) or small blobs (`get`) from any of several endpoints.

    Rounds repeat `retries` times with exponential backoff over the endpoints that have not
    served bad bytes. `policy` sets deadlines by size; `timeout` is the floor for small requests.
    """

    def __init__(
        self,
        endpoints: Sequence[str] = (),
        timeout: float = 30.0,
        retries: int = 2,
        max_bytes: int = DEFAULT_MAX_BYTES,
        *,
        backoff: float = 0.5,
        sleep: Callable[[float], None] = time.sleep,
        on_bytes: Callable[[int], None] | None = None,
        policy: TransferPolicy | None = None,
        max_resumes: int = 3,
        parallel: int = 4,
    ) -> None:
        if timeout <= 0 or retries < 0 or max_bytes <= 0 or backoff < 0:
            raise ValueError("timeout and max_bytes must be positive, retries and backoff non-negative")
        self.endpoints = [e.rstrip("/") for e in endpoints]
        self.timeout = timeout
        self.retries = retries
        self.max_bytes = max_bytes
        self.backoff = backoff
        self.policy = policy or TransferPolicy(base_s=timeout)
        self.max_resumes = max_resumes
        self.parallel = max(1, parallel)
        self._sleep = sleep
        self._on_bytes = on_bytes
        self._count_lock = threading.Lock()
        self.bytes_received = 0
        self.resumed = 0
        self._http = httpx.Client(timeout=httpx.Timeout(timeout), follow_redirects=False)

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

    # ---- protocol objects, chunk by chunk

    def fetch(
        self,
        ref: ObjectRef,
        sink: Sink,
        endpoints: Sequence[str] | None = None,
        *,
        have: set[int] | None = None,
    ) -> FetchReport:
        """Fill `sink` with the object's bytes, every chunk verified; raises `BlobInvalid` (someone
        served bad bytes and nobody served good ones) or `BlobUnavailable` (nobody served it)."""
        bases = list(
            dict.fromkeys(e.rstrip("/") for e in (endpoints if endpoints is not None else self.endpoints))
        )
        if not bases:
            raise BlobUnavailable(f"{ref.kind}/{ref.hash[:12]}: no endpoints to ask")
        if sink.length != ref.length:
            raise ValueError(f"sink of {sink.length} bytes for an object of {ref.length}")
        report = FetchReport(ref)
        invalid: dict[str, str] = {}
        missing: dict[str, str] = {}
        digests: list[bytes] | None = None
        pending = deque(i for i in range(ref.n_chunks) if i not in (have or set()))
        for attempt in range(self.retries + 1):
            if attempt:
                self._sleep(self.backoff * 2 ** (attempt - 1))
            live = [b for b in bases if b not in invalid]
            live.sort(key=lambda b: b in missing)  # holders that failed last round are asked last
            if not live:
                break
            if digests is None:
                digests = self._manifest(ref, live, invalid, missing)
                if digests is None:
                    continue
                report.digests = list(digests)
            # holders that did not answer the manifest go last: most of a long list may not hold it
            ready = sorted((b for b in live if b not in invalid), key=lambda b: b in missing)
            self._pull(ref, sink, digests, ready, pending, report, invalid, missing)
            if not pending:
                return report
        what = f"{ref.kind}/{ref.hash[:12]}"
        if invalid:
            raise BlobInvalid(f"{what}: " + "; ".join(f"{b}: {r}" for b, r in invalid.items()))
        detail = "; ".join(f"{b}: {r}" for b, r in missing.items())
        raise BlobUnavailable(f"{what} not served after {self.retries + 1} rounds: {detail}")

    def _manifest(
        self, ref: ObjectRef, bases: list[str], invalid: dict[str, str], missing: dict[str, str]
    ) -> list[bytes] | None:
        """The verified chunk digests; a one-chunk object needs none (its chunk is checked alone)."""
        if ref.n_chunks == 1:
            return []
        want = 32 * ref.n_chunks
        for base in bases:
            url = f"{base}/blobs/{ref.kind}/{ref.hash}/chunks"
            try:
                r = self._http.get(
                    url, timeout=self.policy.timeout(want), headers={"Accept-Encoding": "identity"}
                )
            except httpx.HTTPError as e:
                missing[base] = f"{type(e).__name__}: {e}"
                continue
            if r.status_code != 200:
                missing[base] = f"HTTP {r.status_code}"
                continue
            self._count(len(r.content))
            digests = [r.content[i : i + 32] for i in range(0, len(r.content), 32)]
            if len(r.content) != want or not chunks.verify_manifest(
                ref.hash, ref.domain, ref.chunk_bytes, ref.length, digests
            ):
                invalid[base] = "chunk digests do not match the hash"
                continue
            return digests
        return None

    def _pull(
        self,
        ref: ObjectRef,
        sink: Sink,
        digests: list[bytes],
        bases: list[str],
        pending: deque[int],
        report: FetchReport,
        invalid: dict[str, str],
        missing: dict[str, str],
    ) -> None:
        """One round: a worker per holder takes chunks from the shared queue until every chunk is in
        or its holder fails (a bad chunk: never again; a missing one: maybe next round). A chunk a
        failing holder gives back goes to the others still working, so one dead holder never
        strands a chunk (a one-chunk object included). At most `parallel` holders work at once;
        the next one in line takes the place of each that fails, so every holder of a long list
        (author, verifiers, peers) is asked within the round."""
        cond = threading.Condition(threading.Lock())
        reserve = deque(bases[self.parallel :])
        bases = bases[: self.parallel]
        working = set(bases)
        threads: list[threading.Thread] = []
        # every holder starts with one chunk of its own, so all of them share the work from the start;
        # those chunks count as in flight from here, so a holder without one waits for them instead
        # of leaving before the others have even started (and the chunk with it, if they fail)
        first = {b: pending.popleft() for b in bases if pending}
        in_flight = len(first)

        def worker(base: str) -> None:
            nonlocal in_flight
            while True:
                with cond:
                    if base in first:
                        i = first.pop(base)  # counted in flight already
                    else:
                        # idle: wait while others may still hand a chunk back
                        while not pending and in_flight:
                            cond.wait()
                        if not pending:
                            working.discard(base)
                            cond.notify_all()
                            return
                        i = pending.popleft()
                        in_flight += 1
                verdict, detail, n = self._chunk(ref, sink, i, digests, base, report, cond)
                with cond:
                    in_flight -= 1
                    report.bytes_from[base] = report.bytes_from.get(base, 0) + n
                    if verdict == "ok":
                        report.chunks_from[base] = report.chunks_from.get(base, 0) + 1
                        missing.pop(base, None)
                        cond.notify_all()
                        continue
                    pending.appendleft(i)
                    if verdict == "invalid":
                        report.bad_chunks += 1
                        invalid[base] = detail
                    else:
                        missing[base] = detail
                    working.discard(base)
                    if reserve and pending:  # under the lock: joined below before the list ends
                        start(reserve.popleft())
                    cond.notify_all()
                    return

        def start(base: str) -> None:
            working.add(base)
            t = threading.Thread(target=worker, args=(base,), daemon=True)
            threads.append(t)
            t.start()

        with cond:
            for b in bases:
                start(b)
        joined = 0
        while True:
            with cond:
                if joined == len(threads):
                    break
                t = threads[joined]
            t.join()
            joined += 1

    def _chunk(
        self,
        ref: ObjectRef,
        sink: Sink,
        i: int,
        digests: list[bytes],
        base: str,
        report: FetchReport,
        lock: threading.Lock | threading.Condition,
    ) -> tuple[str, str, int]:
        """('ok' | 'invalid' | 'missing', detail, bytes received) for chunk i from one holder."""
        a, b = ref.span(i)
        h = hashlib.sha256(b"\x00")
        pos, resumes, got = a, 0, 0
        url = f"{base}/blobs/{ref.kind}/{ref.hash}"
        while pos < b:
            deadline = time.monotonic() + self.policy.timeout(b - pos)
            try:
                headers = {"Range": f"bytes={pos}-{b - 1}", "Accept-Encoding": "identity"}
                with self._http.stream(
                    "GET", url, headers=headers, timeout=self.policy.timeout(b - pos)
                ) as r:
                    if r.status_code != 206:
                        return "missing", f"HTTP {r.status_code}", got
                    if r.headers.get("content-encoding", "identity").lower() != "identity":
                        return "invalid", "content-encoding other than identity", got
                    if not r.headers.get("content-range", "").startswith(f"bytes {pos}-{b - 1}/{ref.length}"):
                        return "invalid", f"content-range {r.headers.get('content-range')!r}", got
                    for piece in r.iter_raw():
                        if pos + len(piece) > b:
                            return "invalid", "more bytes than the range asked for", got
                        h.update(piece)
                        try:
                            sink.write_at(pos, piece)
                        except ValueError as e:  # e.g. a header that does not fit our layout
                            return "invalid", f"{type(e).__name__}: {e}", got
                        pos += len(piece)
                        got += len(piece)
                        self._count(len(piece))
                        if time.monotonic() > deadline:
                            raise _Interrupted(f"slower than {self.policy.min_bytes_per_s:.0f} B/s")
                    if pos < b:
                        raise _Interrupted("connection closed early")
            except (httpx.HTTPError, _Interrupted) as e:
                resumes += 1
                with lock:
                    report.resumed += 1
                    self.resumed += 1
                if resumes > self.max_resumes:
                    return "missing", f"{type(e).__name__}: {e}", got
        digest = h.digest()
        if digests:
            ok = digest == digests[i]
        else:  # a one-chunk object: its chunk digest is its tree hash
            ok = chunks.root_hash(ref.domain, ref.chunk_bytes, ref.length, digest) == ref.hash
            if ok:
                report.digests = [digest]
        return ("ok", "", got) if ok else ("invalid", f"chunk {i} does not match its digest", got)

    # ---- small blobs, whole

    def get(
        self,
        kind: str,
        blob_hash: str,
        verify: Callable[[bytes], None],
        *,
        endpoints: Sequence[str] | None = None,
        max_bytes: int | None = None,
    ) -> bytes:
        """The verified bytes, else `BlobInvalid` (someone served bad bytes) or `BlobUnavailable`."""
        _check_ref(kind, blob_hash)
        bases = [e.rstrip("/") for e in (endpoints if endpoints is not None else self.endpoints)]
        if not bases:
            raise BlobUnavailable(f"{kind}/{blob_hash[:12]}: no endpoints to ask")
        limit = max_bytes if max_bytes is not None else self.max_bytes
        invalid: dict[str, str] = {}
        missing: dict[str, str] = {}
        for attempt in range(self.retries + 1):
            if attempt:
                self._sleep(self.backoff * 2 ** (attempt - 1))
            for base in bases:
                if base in invalid:
                    continue
                out = self._fetch_once(f"{base}/blobs/{kind}/{blob_hash}", limit, verify)
                if out.data is not None:
                    return out.data
                if out.invalid is not None:
                    invalid[base] = out.invalid
                else:
                    missing[base] = out.missing or "?"
            if len(invalid) == len(set(bases)):
                break
        what = f"{kind}/{blob_hash[:12]}"
        if invalid:
            detail = "; ".join(f"{b}: {r}" for b, r in invalid.items())
            too_large = all(r.startswith("too large") for r in invalid.values())
            raise (BlobTooLarge if too_large else BlobInvalid)(f"{what}: {detail}")
        detail = "; ".join(f"{b}: {r}" for b, r in missing.items())
        raise BlobUnavailable(f"{what} not served after {self.retries + 1} rounds: {detail}")

    def _fetch_once(self, url: str, limit: int, verify: Callable[[bytes], None]) -> _Outcome:
        deadline = time.monotonic() + self.timeout
        try:
            with self._http.stream("GET", url, headers={"Accept-Encoding": "identity"}) as r:
                if r.status_code != 200:
                    return _Outcome(missing=f"HTTP {r.status_code}")
                if r.headers.get("content-encoding", "identity").lower() != "identity":
                    return _Outcome(invalid="content-encoding other than identity")
                declared = r.headers.get("content-length")
                if declared is not None and declared.isdigit() and int(declared) > limit:
                    return _Outcome(invalid=f"too large: declares {declared} bytes > {limit}")
                buf = bytearray()
                for piece in r.iter_raw():
                    buf += piece
                    self._count(len(piece))
                    if len(buf) > limit:
                        return _Outcome(invalid=f"too large: more than {limit} bytes")
                    if time.monotonic() > deadline:
                        return _Outcome(missing="timed out")
        except httpx.HTTPError as e:
            return _Outcome(missing=f"{type(e).__name__}: {e}")
        data = bytes(buf)
        try:
            verify(data)
        except Exception as e:  # untrusted bytes: any failure of the check is a bad answer
            return _Outcome(invalid=f"{type(e).__name__}: {e}")
        return _Outcome(data=data)


def fetch_to_store(
    client: BlobClient, store: ContentStore, ref: ObjectRef, group: str, endpoints: Sequence[str]
) -> FetchReport:
    """Fetch an object into the store (a part file, resumed if an earlier fetch was interrupted
    is not tracked: chunks are re-fetched), committed only once every chunk is verified."""
    sink = store.begin(ref.kind, ref.hash, group, ref.length)
    try:
        report = client.fetch(ref, sink, endpoints)
    except BaseException:
        store.abort(sink)
        raise
    store.commit(ref.kind, ref.hash, group, sink, report.digests)
    return report


__all__ = [
    "KINDS",
    "BlobCatalog",
    "BlobClient",
    "BlobError",
    "BlobInvalid",
    "BlobTooLarge",
    "BlobUnavailable",
    "BytesObject",
    "FetchReport",
    "ServerThread",
    "StoredObject",
    "build_app",
    "parse_listen",
    "parse_range",
]
