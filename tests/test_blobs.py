"""The blob server and the fetcher: content addressing, bounded sizes, retries, named errors."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch
from prometheus_client import CollectorRegistry, Counter

from nodekit.blobs import (
    BlobCatalog,
    BlobClient,
    BlobInvalid,
    BlobUnavailable,
    BytesObject,
    ServerThread,
    StoredObject,
    build_app,
    parse_listen,
)
from nodekit.objects import Kind, ObjectRef, TransferPolicy
from nodekit.store import BytesSink, ContentStore, TensorSink
from protocol.codecs import delta_hash
from protocol.tensors import StateKind, canonical_bytes, specs_of, tensor_hash


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


def delta_ref(data: bytes, chunk: int = 1 << 20) -> ObjectRef:
    """Any bytes as a Δ-kind object: its chunked content hash (specs §3) and exact length."""
    return ObjectRef(Kind.DELTA, delta_hash(data, chunk), len(data), chunk)


def fetch_bytes(client: BlobClient, ref: ObjectRef, endpoints: list[str] | None = None) -> bytes:
    sink = BytesSink(ref.length)
    client.fetch(ref, sink, endpoints)
    return bytes(sink.buf)


def test_serves_published_blob_and_counts_bytes(node) -> None:
    catalog, server, registry = node
    data = b"delta-bytes" * 100
    ref = delta_ref(data)
    catalog.publish("delta", ref.hash, lambda: data)
    received: list[int] = []
    with BlobClient([server.url], timeout=5, retries=0, on_bytes=received.append) as client:
        assert fetch_bytes(client, ref) == data
        assert client.bytes_received == len(data) == sum(received)
    assert registry.get_sample_value("bytes_sent_total") == len(data)


def test_unpublished_blob_is_not_served(node) -> None:
    catalog, server, _ = node
    data = b"not revealed yet"
    ref = delta_ref(data)
    with BlobClient([server.url], timeout=5, retries=1, backoff=0) as client:
        with pytest.raises(BlobUnavailable, match="HTTP 404"):
            fetch_bytes(client, ref)
        catalog.publish("delta", ref.hash, lambda: data)
        assert fetch_bytes(client, ref) == data
        catalog.withdraw("delta", ref.hash)
        with pytest.raises(BlobUnavailable):
            fetch_bytes(client, ref)


def test_wrong_bytes_are_invalid_and_next_endpoint_is_tried(node) -> None:
    catalog, server, _ = node
    good = b"the real thing"
    ref = delta_ref(good)
    catalog.publish("delta", ref.hash, lambda: b"a forgery!!!!!")  # same length, other bytes
    client = BlobClient([server.url], timeout=5, retries=2, backoff=0)
    with client, pytest.raises(BlobInvalid, match="does not match its digest"):
        fetch_bytes(client, ref)
    honest = BlobCatalog()
    honest.publish("delta", ref.hash, lambda: good)
    with (
        ServerThread(build_app(honest, dict)) as other,
        BlobClient([dead_url(), server.url, other.url], timeout=5, retries=0) as client,
    ):
        assert fetch_bytes(client, ref) == good


def test_unreachable_endpoints_retry_with_backoff_then_unavailable() -> None:
    sleeps: list[float] = []
    client = BlobClient([dead_url(), dead_url()], timeout=2, retries=2, backoff=0.5, sleep=sleeps.append)
    with client, pytest.raises(BlobUnavailable, match="after 3 rounds"):
        fetch_bytes(client, delta_ref(b"x" * 10))
    assert sleeps == [0.5, 1.0]


def test_more_bytes_than_the_layout_says_abort_the_transfer(node) -> None:
    """The receiver knows the exact length (no size caps): a holder sending more is invalid."""
    catalog, server, _ = node
    big = bytes(200_000)
    ref = delta_ref(big[:10_000])
    catalog.publish("delta", ref.hash, lambda: big)
    with BlobClient([server.url], timeout=5, retries=0) as client:
        with pytest.raises(BlobInvalid):
            fetch_bytes(client, ref)
        assert client.bytes_received <= 10_000 + 65_536  # stopped at the first piece past the span


def test_serve_filter_can_refuse_or_tamper() -> None:
    catalog = BlobCatalog()
    data = b"abc"
    ref = delta_ref(data)
    catalog.publish("state", ref.hash, lambda: data)
    catalog.publish("delta", ref.hash, lambda: data)

    def tamper(kind: str, _h: str, blob: bytes) -> bytes | None:
        return None if kind == "state" else blob[:-1] + b"!"

    server = ServerThread(build_app(catalog, dict, serve_filter=tamper))
    with server, BlobClient([server.url], timeout=5, retries=0) as client:
        with pytest.raises(BlobUnavailable):
            fetch_bytes(client, ObjectRef(Kind.STATE, ref.hash, ref.length, ref.chunk_bytes))
        with pytest.raises(BlobInvalid):
            fetch_bytes(client, ref)


def test_bad_requests_get_clear_errors_not_crashes(node) -> None:
    catalog, server, _ = node
    catalog.publish("model", "00" * 32, lambda: (_ for _ in ()).throw(OSError("pruned")))
    with httpx.Client(base_url=server.url, timeout=5) as http:
        assert http.get("/blobs/state/not-a-hash").status_code == 422
        assert http.get(f"/blobs/secrets/{'00' * 32}").status_code == 422
        assert http.get(f"/blobs/model/{'00' * 32}").status_code == 404  # loader failed: node lives on
        assert http.get("/status").json() == {"node": "t", "phase": "TRAIN"}
        assert "bytes_sent_total" in http.get("/metrics").text
    with pytest.raises(ValueError, match="64 lower-case hex"):
        ObjectRef(Kind.STATE, "ABC", 10, 1 << 20)
    with pytest.raises(ValueError, match="HOST:PORT"):
        parse_listen("localhost")


class Flaky:
    """A served object that breaks its connection after `cut` bytes, `times` times (then behaves)."""

    def __init__(self, inner: BytesObject, cut: int, times: int) -> None:
        self.inner, self.cut, self.times, self.length = inner, cut, times, inner.length

    def digests(self) -> list[bytes]:
        return self.inner.digests()

    def read(self, start: int, end: int) -> Iterator[bytes]:
        if self.times > 0 and end - start > self.cut:
            self.times -= 1
            yield self.inner.data[start : start + self.cut]
            raise ConnectionResetError("cut")  # the server drops the connection mid-response
        yield from self.inner.read(start, end)


def state_object(chunk: int) -> tuple[dict[str, torch.Tensor], bytes, ObjectRef]:
    g = torch.Generator().manual_seed(1)
    state = {"param/w": torch.randn(50, 40, generator=g), "exp_avg/w": torch.randn(50, 40, generator=g),
             "step": torch.tensor(3.0)}  # fmt: skip
    data = canonical_bytes(state)
    ref = ObjectRef(Kind.STATE, tensor_hash(state, StateKind.TRAINING, chunk), len(data), chunk)
    return state, data, ref


def test_chunked_fetch_pulls_from_every_holder_resumes_and_drops_a_liar() -> None:
    """A 16-kB state in 1-kB chunks held by three nodes: one serves a corrupted copy, one drops its
    connection twice mid-chunk. The fetch resumes with Range, gets the rest from the honest ones,
    checks every chunk on arrival and lands the state straight in tensors."""
    chunk = 1024
    state, data, ref = state_object(chunk)
    assert ref.n_chunks == 16
    bad = bytearray(data)
    for i in range(0, len(bad), chunk):  # every chunk it serves is wrong
        bad[i] ^= 1
    catalogs = [BlobCatalog(chunk) for _ in range(3)]
    catalogs[0].publish("state", ref.hash, Flaky(BytesObject(data, chunk), cut=300, times=2))
    catalogs[1].publish("state", ref.hash, BytesObject(data, chunk))
    liar = BytesObject(bytes(bad), chunk)
    liar.digests = BytesObject(data, chunk).digests  # type: ignore[method-assign]  # an honest manifest
    catalogs[2].publish("state", ref.hash, liar)
    servers = [ServerThread(build_app(c, dict)).start() for c in catalogs]
    try:
        with BlobClient([], timeout=5, retries=1, backoff=0) as client:
            sink = TensorSink(specs_of(state))
            report = client.fetch(ref, sink, [s.url for s in reversed(servers)])
            assert all(torch.equal(sink.tensors[k], v) for k, v in state.items())
            assert report.resumed >= 2 and report.bad_chunks <= 1  # the liar's first chunk is its last
            assert len(report.chunks_from) >= 2 and servers[2].url not in report.chunks_from
            assert sum(report.chunks_from.values()) == 16
            assert client.bytes_received < 1.3 * len(data) + 32 * 16  # a resume costs no re-download
            with pytest.raises(BlobInvalid, match="digest"):  # only the liar: invalid, never accepted
                client.fetch(ref, BytesSink(ref.length), [servers[2].url])
            with pytest.raises(ValueError):  # a sink of another size is a caller bug
                client.fetch(ref, BytesSink(10), [servers[1].url])
    finally:
        for server in servers:
            server.stop()


def test_a_dead_first_holder_never_strands_a_chunk() -> None:
    """A one-chunk object whose first-listed holder is down: the chunk it gives back goes to the
    live holder in the same round (once, a lone chunk waited for the dead one round after round)."""
    state, data, ref = state_object(1 << 20)
    assert ref.n_chunks == 1
    catalog = BlobCatalog(1 << 20)
    catalog.publish("state", ref.hash, BytesObject(data, 1 << 20))
    with ServerThread(build_app(catalog, dict)) as server, BlobClient([], timeout=5, retries=0) as client:
        sink = TensorSink(specs_of(state))
        report = client.fetch(ref, sink, [dead_url(), server.url])
        assert report.chunks_from == {server.url: 1}
        assert all(torch.equal(sink.tensors[k], v) for k, v in state.items())


def test_every_holder_of_a_long_list_is_asked_in_one_round() -> None:
    """Author, verifiers, peers: most of a long list may not hold an object (the author withholds
    it, peers have not fetched it). With 4 holders at work at once, the ones after them take the
    place of each that fails, so the one holder at the end of 7 is reached without a retry, for a
    many-chunk object (manifest) and a one-chunk one alike. A holder without a seeded chunk waits
    for the seeded ones (it once left when it ran before they had started, and nobody took its
    place: the one-chunk fetch then missed the holder, in the availability node test)."""
    objects = [state_object(1024)[1:], state_object(1 << 20)[1:]]
    holder = BlobCatalog(1024)
    for data, ref in objects:
        holder.publish("state", ref.hash, BytesObject(data, ref.chunk_bytes))
    servers = [ServerThread(build_app(c, dict)).start() for c in [BlobCatalog(), BlobCatalog(), holder]]
    urls = [dead_url(), dead_url(), dead_url(), servers[0].url, dead_url(), servers[1].url, servers[2].url]
    try:
        with BlobClient([], timeout=5, retries=0, parallel=4) as client:
            for data, ref in [*objects, objects[1], objects[1]]:
                sink = BytesSink(ref.length)
                report = client.fetch(ref, sink, urls)
                assert report.chunks_from == {servers[2].url: ref.n_chunks} and bytes(sink.buf) == data
    finally:
        for server in servers:
            server.stop()


def test_deadlines_scale_with_size_and_a_stalled_holder_is_left() -> None:
    policy = TransferPolicy(min_bytes_per_s=1e6, base_s=2.0)
    assert policy.timeout(0) == 2.0 and policy.timeout(360 * 10**9) == 2.0 + 360_000  # 360 GB at 1 MB/s
    chunk = 1024
    _, data, ref = state_object(chunk)

    class Stalled(BytesObject):
        def read(self, start: int, end: int) -> Iterator[bytes]:
            yield self.data[start : start + 10]
            threading.Event().wait(1.5)  # a holder that goes silent
            yield self.data[start + 10 : end]

    catalog = BlobCatalog(chunk)
    catalog.publish("state", ref.hash, Stalled(data, chunk))
    tight = TransferPolicy(min_bytes_per_s=1e6, base_s=0.5)
    client = BlobClient([], timeout=1, retries=0, policy=tight, max_resumes=1)
    with (
        ServerThread(build_app(catalog, dict)) as server,
        client,
        pytest.raises(BlobUnavailable, match=r"Timeout|slower"),
    ):
        client.fetch(ref, BytesSink(ref.length), [server.url])


def test_store_serves_verified_ranges_and_manifests(tmp_path: Path) -> None:
    chunk = 1024
    state, data, ref = state_object(chunk)
    store = ContentStore(tmp_path, chunk)
    assert store.put_tensors(Kind.STATE, state, "0") == ref.hash
    catalog = BlobCatalog(chunk)
    catalog.publish("state", ref.hash, StoredObject(store, Kind.STATE, ref.hash))
    server = ServerThread(build_app(catalog, dict))
    with server, httpx.Client(base_url=server.url, timeout=5) as http:
        m = http.get(f"/blobs/state/{ref.hash}/chunks")
        assert m.headers["x-object-length"] == str(len(data)) and len(m.content) == 32 * ref.n_chunks
        part = http.get(f"/blobs/state/{ref.hash}", headers={"Range": "bytes=1000-3047"})
        assert part.status_code == 206 and part.content == data[1000:3048]
        path = store.find(Kind.STATE, ref.hash)
        raw = bytearray(path.read_bytes())
        raw[2500] ^= 1
        path.write_bytes(bytes(raw))
        with pytest.raises(httpx.HTTPError):  # a corrupted chunk never leaves: the stream is cut
            http.get(f"/blobs/state/{ref.hash}", headers={"Range": "bytes=2048-3071"})
        assert http.get(f"/blobs/state/{ref.hash}", headers={"Range": "bytes=0-1023"}).content == data[:1024]
    with (
        BlobClient([], timeout=5, retries=0) as client,
        ServerThread(build_app(catalog, dict)) as server,
        pytest.raises(BlobUnavailable),  # the holder's own disk is bad: nobody gets bad bytes
    ):
        client.fetch(ref, BytesSink(ref.length), [server.url])


def test_error_bodies_do_not_echo_large_input(node) -> None:
    _, server, _ = node
    with httpx.Client(base_url=server.url, timeout=5) as http:
        r = http.get(f"/blobs/model/{'00' * 32}", headers={"Range": "bytes=" + "9" * 100_000})
        assert r.status_code == 422 and len(r.content) < 512


def test_single_byte_ranges_for_resumed_downloads(node) -> None:
    catalog, server, _ = node
    data = bytes(range(100))
    h = delta_ref(data).hash
    catalog.publish("model", h, lambda: data)
    url = f"/blobs/model/{h}"
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


def test_stored_tensors_read_ahead_and_read_into(tmp_path: Path) -> None:
    """Chunks read and checked ahead on the hash pool give the same tensors, read straight into a
    caller's tensor too; a corrupted chunk is still an error when it is reached, ahead or not."""
    from nodekit.store import StoreError
    from nodekit.storefiles import StoredTensors

    chunk = 1024
    state, data, ref = state_object(chunk)
    store = ContentStore(tmp_path, chunk)
    store.put_tensors(Kind.STATE, state, "0")
    stored = StoredTensors(store, Kind.STATE, ref.hash, specs_of(state), "0")
    assert all(torch.equal(stored[k], state[k]) for k in sorted(state))
    for k in sorted(state):
        out = torch.empty_like(state[k])
        stored.read_into(k, out)
        assert torch.equal(out, state[k])
    with pytest.raises(StoreError):
        stored.read_into(sorted(state)[0], torch.empty(1, dtype=torch.float64))
    assert b"".join(store.read(Kind.STATE, ref.hash, 100, 5000)) == data[100:5000]
    path = store.find(Kind.STATE, ref.hash)
    raw = bytearray(path.read_bytes())
    raw[-10] ^= 1  # the last chunk: reached only after the read-ahead has run past the others
    path.write_bytes(bytes(raw))
    stored.release()
    with pytest.raises(StoreError):
        for k in sorted(state):
            stored[k]
    with pytest.raises(StoreError):
        b"".join(store.read(Kind.STATE, ref.hash))


def test_a_write_in_progress_is_not_listed(tmp_path: Path) -> None:
    # another thread's write is a `.tmp-*` file until it is renamed into place: a listing (pruning
    # what is not kept) must neither return it nor fail on its name (a host crashed on one mid-run)
    store = ContentStore(tmp_path, 1024)
    h = store.put_bytes(Kind.OPTIMIZER, b"x" * 100, "opt")
    (tmp_path / "opt" / ".tmp-9w1ntmav.optimizer").write_bytes(b"partial")
    assert store.hashes(Kind.OPTIMIZER, "opt") == [h] == store.hashes(Kind.OPTIMIZER)
