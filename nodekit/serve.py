"""What a node serves over HTTP: its catalog of content-addressed objects and the routes.

Routes (specs §8): `GET /blobs/{kind}/{hash}` (the object's canonical bytes, `Range: bytes=a-b`
honoured, streamed from disk chunk by chunk, each chunk checked against its digest before it
leaves), `GET /blobs/{kind}/{hash}/chunks` (the chunk digests, 32 bytes each, with
`X-Object-Length` and `X-Chunk-Bytes`), `/status`, `/metrics`. What is in the catalog is decided
by the node's holdings (`nodekit.holdings`): what is on disk and may be shown is served.
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path as FilePath
from typing import Any, Literal, Protocol, cast

import uvicorn
from fastapi import FastAPI, Header, Path, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from nodekit.objects import Kind, check_ref
from nodekit.objects import held_bitmap as held_bitmap_of
from nodekit.store import ContentStore, atomic_write
from protocol import chunks

BlobKind = Literal["state", "optimizer", "model", "delta", "error_feedback"]
MAX_ERROR_ECHO = 64
"""The most of a client's input an error body repeats (a 100 kB header is not sent back)."""

Loader = Callable[[], bytes]
ServeFilter = Callable[[str, str, bytes], "bytes | None"]
"""`HostBehaviour.serve_blob`: the bytes to send, or None to refuse."""
Coder = Callable[["Served", int, str], "bytes | None"]
"""`nodekit.coding.StateCoder`: chunk i of a served state coded against base G (specs §8.2), or
None when this node cannot (it does not hold G)."""
ServeRate = Callable[[str, str], "float | None"]
"""`HostBehaviour.serve_bytes_per_s`: a pace to send an object at (an adversary's trickle), or None."""
PACED_PIECE = 16
"""Bytes per write when an object is paced: small, so a trickle really is one."""


# ---------------------------------------------------------------- what a node serves


class Served(Protocol):
    """One object a node can serve: its length, chunk digests, and verified byte ranges. A partial
    object (`nodekit.store.PartialObject`) also says which chunks it holds (`holds`,
    `held_bitmap`); whatever lacks them holds every chunk."""

    length: int

    def digests(self) -> list[bytes]: ...

    def read(self, start: int, end: int) -> Iterator[bytes]: ...


CODED_HEADER = "X-Coded"
"""On `/coded/{i}`: `diff` (the body is a `protocol.statecode` coded chunk) or, on a 404, `none`
(this node does not code it: ask for the bytes)."""
HELD_HEADER = "X-Held"
"""On a 404 for a byte range: `partial` — this holder has the object, not every chunk of that range
(ask it for other chunks, see `/held`); without it the object itself is not served."""


def holds(obj: Served, start: int, end: int) -> bool:
    check = getattr(obj, "holds", None)
    return True if check is None else bool(check(start, end))


def held_bitmap(obj: Served, chunk_bytes: int) -> bytes:
    """The held bitmap (`nodekit.store.held_bitmap`): a partial object's own, else every chunk."""
    own = getattr(obj, "held_bitmap", None)
    if own is not None:
        return bytes(own())
    n = chunks.n_chunks(obj.length, chunk_bytes)
    return held_bitmap_of(range(n), n)


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
        self.coder: Coder | None = None
        """Codes training-state chunks against a base G on request (set once the node knows its
        run's layout); without one, states are served as plain bytes only."""

    def publish(self, kind: str, blob_hash: str, source: Served | Loader) -> None:
        check_ref(kind, blob_hash)
        # a Loader is a plain function: only a Served has digests
        item = cast(Served, source) if hasattr(source, "digests") else _Lazy(source, self.chunk_bytes)
        with self._lock:
            self._items[(kind, blob_hash)] = item

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
    serve_rate: ServeRate | None = None,
    on_sent: Callable[[str, int], None] | None = None,
) -> FastAPI:
    """The node's HTTP routes. `serve_filter` (an adversary's hook) sees and may replace whole
    objects, `serve_rate` (another) paces them; without them objects stream from disk at once."""
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

    @app.get("/blobs/{kind}/{blob_hash}/held")
    def get_held(kind: BlobKind, blob_hash: str = Path(pattern=r"^[0-9a-f]{64}$")) -> Response:
        """Which chunks this node holds: ⌈n/8⌉ bytes, bit i (byte i // 8, least significant bit
        first) for chunk i: a fetcher asks a partial holder only for those."""
        obj = resolve(kind, blob_hash)
        if isinstance(obj, JSONResponse):
            return obj
        body = held_bitmap(obj, catalog.chunk_bytes)
        return Response(content=body, media_type="application/octet-stream")

    @app.get("/blobs/{kind}/{blob_hash}/coded/{index}")
    def get_coded(
        kind: BlobKind,
        blob_hash: str = Path(pattern=r"^[0-9a-f]{64}$"),
        index: int = Path(ge=0),
        base: str = Query(pattern=r"^[0-9a-f]{64}$"),
    ) -> Response:
        """Chunk `index` of a training state coded against base G's parameters (specs §8.2): 404
        `X-Held: partial` if we lack the chunk, 404 `X-Coded: none` if we do not code it (no G)."""
        obj = resolve(kind, blob_hash)
        if isinstance(obj, JSONResponse):
            return obj
        c = catalog.chunk_bytes
        if index >= chunks.n_chunks(obj.length, c):
            return JSONResponse({"error": "no such chunk"}, status_code=416)
        a, b = chunks.chunk_span(index, obj.length, c)
        if not holds(obj, a, b):
            lacks = {"error": "chunk not held", "kind": kind, "hash": blob_hash}
            return JSONResponse(lacks, status_code=404, headers={HELD_HEADER: "partial"})
        coder = catalog.coder
        try:
            out = coder(obj, index, base) if coder is not None and kind == Kind.STATE.value else None
        except (OSError, ValueError) as e:  # unreadable on our own disk: say so, keep running
            return JSONResponse({"error": f"unreadable: {type(e).__name__}"}, status_code=404)
        if out is None:
            return JSONResponse({"error": "not coded here"}, status_code=404, headers={CODED_HEADER: "none"})
        return StreamingResponse(
            paced(kind, blob_hash, [out]), headers={CODED_HEADER: "diff", "Content-Length": str(len(out))},
            media_type="application/octet-stream",
        )  # fmt: skip

    def paced(kind: str, blob_hash: str, pieces: Iterable[bytes]) -> Iterator[bytes]:
        """The bytes as they go out: counted, and paced where a behaviour says so."""
        rate = serve_rate(kind, blob_hash) if serve_rate is not None else None
        for piece in pieces:
            if on_sent is not None:
                on_sent(kind, len(piece))
            if not rate:
                yield piece
                continue
            for a in range(0, len(piece), PACED_PIECE):
                time.sleep(PACED_PIECE / rate)
                yield piece[a : a + PACED_PIECE]

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
        if not holds(obj, start, end):  # never a wrong or zero chunk: a partial holder says so
            lacks = {"error": "chunk not held", "kind": kind, "hash": blob_hash}
            return JSONResponse(lacks, status_code=404, headers={HELD_HEADER: "partial"})
        headers["Content-Length"] = str(end - start)
        return StreamingResponse(
            paced(kind, blob_hash, obj.read(start, end)), status_code=status, headers=headers,
            media_type="application/octet-stream",
        )  # fmt: skip

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


def bind_kept_port(
    app: FastAPI, listen: str, path: FilePath, log: Callable[..., None] = lambda event, **kw: None
) -> ServerThread:
    """A server on `listen`; with port 0, on the port it got the first time (kept in `path`): a
    node's endpoint is on chain, so a restarted node must come back where its peers look for it.
    If that port is taken meanwhile, any free one (logged `port_taken`)."""
    host, port = parse_listen(listen)
    if port == 0 and path.is_file():
        try:
            kept = int(json.loads(path.read_bytes())["port"])
            return ServerThread(app, f"{host}:{kept}")
        except (OSError, ValueError, KeyError, TypeError) as e:
            log("port_taken", port=path.read_text(errors="replace")[:40], error=f"{type(e).__name__}: {e}")
    server = ServerThread(app, listen)
    if port == 0:
        atomic_write(path, json.dumps({"port": server.port}).encode())
    return server


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


__all__ = [
    "CODED_HEADER",
    "HELD_HEADER",
    "BlobCatalog",
    "BytesObject",
    "Coder",
    "Served",
    "ServerThread",
    "StoredObject",
    "build_app",
    "parse_listen",
    "parse_range",
]
