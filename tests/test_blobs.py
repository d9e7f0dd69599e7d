"""The blob server and the fetcher: content addressing, bounded sizes, retries, named errors."""

from __future__ import annotations

import hashlib
import socket
from collections.abc import Iterator

import httpx
import pytest
import torch
from prometheus_client import CollectorRegistry, Counter

from protocol.tensors import StateKind, tensor_hash
from trainer.blobs import (
    BlobCatalog,
    BlobClient,
    BlobInvalid,
    BlobTooLarge,
    BlobUnavailable,
    ServerThread,
    build_app,
    parse_listen,
    state_verifier,
    tensors_from_bytes,
    tensors_to_bytes,
)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha_check(expected: str):
    def verify(data: bytes) -> None:
        if sha(data) != expected:
            raise ValueError("hash mismatch")

    return verify


@pytest.fixture
def node() -> Iterator[tuple[BlobCatalog, ServerThread, CollectorRegistry]]:
    catalog = BlobCatalog()
    registry = CollectorRegistry()
    sent = Counter("bytes_sent", "bytes sent", registry=registry)
    status = {"node": "t", "phase": "TRAIN"}
    app = build_app(catalog, lambda: status, registry, on_sent=lambda _k, n: sent.inc(n))
    with ServerThread(app) as server:
        yield catalog, server, registry


def dead_url() -> str:
    """A local port nothing listens on: connections are refused at once."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}"


def test_serves_published_blob_and_counts_bytes(node) -> None:
    catalog, server, registry = node
    data = b"delta-bytes" * 100
    catalog.publish("delta", sha(data), lambda: data)
    received: list[int] = []
    with BlobClient([server.url], timeout=5, retries=0, on_bytes=received.append) as client:
        assert client.get("delta", sha(data), sha_check(sha(data))) == data
        assert client.bytes_received == len(data) == sum(received)
    assert registry.get_sample_value("bytes_sent_total") == len(data)


def test_unpublished_blob_is_not_served(node) -> None:
    catalog, server, _ = node
    data = b"not revealed yet"
    with BlobClient([server.url], timeout=5, retries=1, backoff=0) as client:
        with pytest.raises(BlobUnavailable, match="HTTP 404"):
            client.get("state", sha(data), sha_check(sha(data)))
        catalog.publish("state", sha(data), lambda: data)
        assert client.get("state", sha(data), sha_check(sha(data))) == data
        catalog.withdraw("state", sha(data))
        with pytest.raises(BlobUnavailable):
            client.get("state", sha(data), sha_check(sha(data)))


def test_wrong_bytes_are_invalid_and_next_endpoint_is_tried(node) -> None:
    catalog, server, _ = node
    good = b"the real thing"
    catalog.publish("delta", sha(good), lambda: b"a forgery")
    client = BlobClient([server.url], timeout=5, retries=2, backoff=0)
    with client, pytest.raises(BlobInvalid, match="hash mismatch"):
        client.get("delta", sha(good), sha_check(sha(good)))
    honest = BlobCatalog()
    honest.publish("delta", sha(good), lambda: good)
    with (
        ServerThread(build_app(honest, dict)) as other,
        BlobClient([dead_url(), server.url, other.url], timeout=5, retries=0) as client,
    ):
        assert client.get("delta", sha(good), sha_check(sha(good))) == good


def test_unreachable_endpoints_retry_with_backoff_then_unavailable() -> None:
    sleeps: list[float] = []
    client = BlobClient([dead_url(), dead_url()], timeout=2, retries=2, backoff=0.5, sleep=sleeps.append)
    with client, pytest.raises(BlobUnavailable, match="after 3 rounds"):
        client.get("model", "ab" * 32, lambda _d: None)
    assert sleeps == [0.5, 1.0]


def test_size_limit_aborts_transfer(node) -> None:
    catalog, server, _ = node
    big = bytes(200_000)
    catalog.publish("delta", sha(big), lambda: big)
    with BlobClient([server.url], timeout=5, retries=0, max_bytes=10_000) as client:
        with pytest.raises(BlobTooLarge):
            client.get("delta", sha(big), sha_check(sha(big)))
        assert client.bytes_received <= 10_000 + 65_536  # stopped at the first chunk past the limit
        assert client.get("delta", sha(big), sha_check(sha(big)), max_bytes=300_000) == big


def test_serve_filter_can_refuse_or_tamper() -> None:
    catalog = BlobCatalog()
    data = b"abc"
    catalog.publish("state", sha(data), lambda: data)
    catalog.publish("delta", sha(data), lambda: data)

    def tamper(kind: str, _h: str, blob: bytes) -> bytes | None:
        return None if kind == "state" else blob + b"!"

    server = ServerThread(build_app(catalog, dict, serve_filter=tamper))
    with server, BlobClient([server.url], timeout=5, retries=0) as client:
        with pytest.raises(BlobUnavailable):
            client.get("state", sha(data), sha_check(sha(data)))
        with pytest.raises(BlobInvalid):
            client.get("delta", sha(data), sha_check(sha(data)))


def test_bad_requests_get_clear_errors_not_crashes(node) -> None:
    catalog, server, _ = node
    catalog.publish("model", "00" * 32, lambda: (_ for _ in ()).throw(OSError("pruned")))
    with httpx.Client(base_url=server.url, timeout=5) as http:
        assert http.get("/blobs/state/not-a-hash").status_code == 422
        assert http.get(f"/blobs/secrets/{'00' * 32}").status_code == 422
        assert http.get(f"/blobs/model/{'00' * 32}").status_code == 404  # loader failed: node lives on
        assert http.get("/status").json() == {"node": "t", "phase": "TRAIN"}
        assert "bytes_sent_total" in http.get("/metrics").text
    with BlobClient([server.url]) as client, pytest.raises(ValueError, match="64 lower-case hex"):
        client.get("state", "ABC", lambda _d: None)
    with pytest.raises(ValueError, match="HOST:PORT"):
        parse_listen("localhost")


def test_state_verifier_checks_tensor_hash(node) -> None:
    catalog, server, _ = node
    state = {"param/w": torch.arange(6, dtype=torch.float32).reshape(2, 3), "step": torch.tensor(3.0)}
    leaf = tensor_hash(state, StateKind.TRAINING)
    blob = tensors_to_bytes(state)
    catalog.publish("state", leaf, lambda: blob)
    other = dict(state, step=torch.tensor(4.0))
    catalog.publish("state", "11" * 32, lambda: tensors_to_bytes(other))
    with BlobClient([server.url], timeout=5, retries=0) as client:
        got = tensors_from_bytes(client.get("state", leaf, state_verifier(leaf)))
        assert tensor_hash(got, StateKind.TRAINING) == leaf
        with pytest.raises(BlobInvalid, match="hash"):
            client.get("state", "11" * 32, state_verifier("11" * 32))
    catalog.publish("state", "22" * 32, lambda: b"\x08\x00\x00\x00\x00\x00\x00\x00{garbage")
    client = BlobClient([server.url], timeout=5, retries=0)
    with client, pytest.raises(BlobInvalid, match="safetensors"):
        client.get("state", "22" * 32, state_verifier("22" * 32))


def test_single_byte_ranges_for_resumed_downloads(node) -> None:
    catalog, server, _ = node
    data = bytes(range(100))
    catalog.publish("model", sha(data), lambda: data)
    url = f"/blobs/model/{sha(data)}"
    with httpx.Client(base_url=server.url, timeout=5) as http:
        part = http.get(url, headers={"Range": "bytes=10-19"})
        assert part.status_code == 206 and part.content == data[10:20]
        assert part.headers["content-range"] == "bytes 10-19/100"
        assert http.get(url, headers={"Range": "bytes=90-"}).content == data[90:]
        assert http.get(url, headers={"Range": "bytes=-5"}).content == data[95:]
        assert http.get(url, headers={"Range": "bytes=95-1000"}).content == data[95:]
        for bad in ("bytes=100-", "bytes=5-2", "bytes=-0", "bytes=-", "items=0-1", "bytes=0-1,3-4"):
            assert http.get(url, headers={"Range": bad}).status_code == 416, bad
        assert http.get(url, headers={"Range": "bytes=" + "9" * 80}).status_code == 422  # header too long
        assert http.get(url).content == data
