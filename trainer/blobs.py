"""Content-addressed blobs over HTTP: the host's server and the fetcher every node uses.

A host serves three kinds of blob (DEVELOPERS-nodes.md): training states and Δ blobs once they
are revealed on chain, and every global model it holds. Nothing is trusted on the way: the
fetcher bounds the size while streaming (it never lets httpx decompress), runs the caller's
`verify` on the bytes, and moves on to the next endpoint when one is down, lies or is slow.
"""

from __future__ import annotations

import re
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import httpx
import safetensors
import safetensors.torch
import uvicorn
from fastapi import FastAPI, Header, Path, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from torch import Tensor

from protocol.tensors import StateKind, tensor_hash

BlobKind = Literal["state", "delta", "model"]
KINDS: tuple[str, ...] = ("state", "delta", "model")
HASH_RE = re.compile(r"^[0-9a-f]{64}$")
DEFAULT_MAX_BYTES = 512 << 20

Loader = Callable[[], bytes]
"""Reads a blob from the node's own disk (the store verifies it on every read)."""
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
    if kind not in KINDS:
        raise ValueError(f"unknown blob kind {kind!r}; expected one of {KINDS}")
    if not isinstance(blob_hash, str) or not HASH_RE.match(blob_hash):
        raise ValueError(f"blob hash must be 64 lower-case hex characters, got {blob_hash!r}")


class BlobFormatError(ValueError):
    """Bytes that are not a well-formed safetensors tensor set."""


MAX_TENSORS = 1 << 16


def tensors_to_bytes(tensors: dict[str, Tensor]) -> bytes:
    """The wire form of a state or global model: safetensors (never pickle)."""
    return safetensors.torch.save({k: v.detach().contiguous() for k, v in tensors.items()})


def tensors_from_bytes(data: bytes, max_tensors: int = MAX_TENSORS) -> dict[str, Tensor]:
    """Parse untrusted safetensors bytes; anything malformed is a `BlobFormatError`."""
    try:
        out = safetensors.torch.load(data)
    except safetensors.SafetensorError as e:
        raise BlobFormatError(f"not a safetensors tensor set: {e}") from e
    if not out or len(out) > max_tensors:
        raise BlobFormatError(f"tensor set must hold 1..{max_tensors} tensors, holds {len(out)}")
    return out


def state_verifier(leaf_hash: str) -> Callable[[bytes], None]:
    """`verify` for a training state: safetensors whose TRAINING hash is the leaf asked for."""

    def verify(data: bytes) -> None:
        got = tensor_hash(tensors_from_bytes(data), StateKind.TRAINING)
        if got != leaf_hash:
            raise ValueError(f"state hash {got[:12]} != requested {leaf_hash[:12]}")

    return verify


# ---------------------------------------------------------------- the fetcher


@dataclass
class _Outcome:
    data: bytes | None = None
    invalid: str | None = None  # served but bad: do not ask this endpoint again
    missing: str | None = None  # not served this time: maybe later


class BlobClient:
    """Fetch a blob by (kind, hash) from any of several endpoints, verified and size-bounded.

    Each round tries every endpoint that has not yet served bad bytes; rounds repeat `retries`
    times with exponential backoff. `verify(data)` must raise on anything wrong; its exception
    (any type) marks that endpoint's answer invalid.
    """

    def __init__(
        self,
        endpoints: Sequence[str],
        timeout: float = 30.0,
        retries: int = 2,
        max_bytes: int = DEFAULT_MAX_BYTES,
        *,
        backoff: float = 0.5,
        sleep: Callable[[float], None] = time.sleep,
        on_bytes: Callable[[int], None] | None = None,
    ) -> None:
        if timeout <= 0 or retries < 0 or max_bytes <= 0 or backoff < 0:
            raise ValueError("timeout and max_bytes must be positive, retries and backoff non-negative")
        self.endpoints = [e.rstrip("/") for e in endpoints]
        self.timeout = timeout
        self.retries = retries
        self.max_bytes = max_bytes
        self.backoff = backoff
        self._sleep = sleep
        self._on_bytes = on_bytes
        self.bytes_received = 0
        self._http = httpx.Client(timeout=httpx.Timeout(timeout), follow_redirects=False)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> BlobClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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
                for chunk in r.iter_raw():
                    buf += chunk
                    self._count(len(chunk))
                    if len(buf) > limit:
                        return _Outcome(invalid=f"too large: more than {limit} bytes")
                    if time.monotonic() > deadline:
                        return _Outcome(missing=f"timed out after {self.timeout}s")
        except httpx.HTTPError as e:
            return _Outcome(missing=f"{type(e).__name__}: {e}")
        data = bytes(buf)
        try:
            verify(data)
        except Exception as e:  # untrusted bytes: any failure of the check is a bad answer
            return _Outcome(invalid=f"{type(e).__name__}: {e}")
        return _Outcome(data=data)

    def _count(self, n: int) -> None:
        self.bytes_received += n
        if self._on_bytes is not None:
            self._on_bytes(n)


# ---------------------------------------------------------------- the server


class BlobCatalog:
    """What this node currently serves: (kind, hash) -> loader. Thread-safe.

    The node publishes a state or Δ only after its reveal is on chain, and withdraws it when
    the outer step is finalized and pruned; global models stay while they are on disk.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: dict[tuple[str, str], Loader] = {}

    def publish(self, kind: str, blob_hash: str, loader: Loader) -> None:
        _check_ref(kind, blob_hash)
        with self._lock:
            self._items[(kind, blob_hash)] = loader

    def withdraw(self, kind: str, blob_hash: str) -> None:
        with self._lock:
            self._items.pop((kind, blob_hash), None)

    def lookup(self, kind: str, blob_hash: str) -> Loader | None:
        with self._lock:
            return self._items.get((kind, blob_hash))

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
    """The host's HTTP routes: `/blobs/{kind}/{hash}`, `/status`, `/metrics`."""
    app = FastAPI(title="gonka-diloco host", docs_url=None, redoc_url=None, openapi_url=None)

    @app.get("/blobs/{kind}/{blob_hash}")
    def get_blob(
        kind: Literal["state", "delta", "model"],
        blob_hash: str = Path(pattern=r"^[0-9a-f]{64}$"),
        range_header: str | None = Header(None, alias="range", max_length=64),
    ) -> Response:
        loader = catalog.lookup(kind, blob_hash)
        if loader is None:
            return JSONResponse({"error": "not served", "kind": kind, "hash": blob_hash}, status_code=404)
        try:
            data: bytes | None = loader()
        except (OSError, ValueError) as e:  # pruned or corrupted on our own disk: say so, keep running
            return JSONResponse({"error": f"unreadable: {type(e).__name__}"}, status_code=404)
        if serve_filter is not None:
            data = serve_filter(kind, blob_hash, data)
        if data is None:
            return JSONResponse({"error": "not served", "kind": kind, "hash": blob_hash}, status_code=404)
        headers = {"Accept-Ranges": "bytes"}
        status = 200
        if range_header is not None:
            span = parse_range(range_header, len(data))
            if span is None:
                return Response(status_code=416, headers={"Content-Range": f"bytes */{len(data)}"})
            start, end = span
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{len(data)}"
            data, status = data[start:end], 206
        if on_sent is not None:
            on_sent(kind, len(data))
        return Response(
            content=data, status_code=status, headers=headers, media_type="application/octet-stream"
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
    Lets a peer resume a large model download; multi-range requests are not served."""
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
