"""Swarmed openings (issue 35 part 3, specs §8.1): a checker keeps the chunks of θ_H's parameters it
fetched as a partial object of the state and serves them; the other checkers of the contribution
fetch from it with the author spared, so the author uploads θ_H's parameters about once, not once
per checker. Real HTTP on 127.0.0.1; every byte checked against the state's hash."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import torch

from gonka_diloco.adversaries.holders import GarbageHolder
from nodekit.fetch import BlobClient, BlobInvalid
from nodekit.holdings import Holdings
from nodekit.objects import Kind, ObjectPolicy, held_bitmap, parse_held
from nodekit.serve import BlobCatalog, BytesObject, ServerThread, build_app
from nodekit.store import PARTIAL, ContentStore, NotHeld, StoreError, TensorSink, stale_files
from protocol.tensors import StateKind, canonical_bytes, specs_of, tensor_hash_and_digests
from verifier.source import HttpSource

CHUNK = 4096
GROUP = "3"
N_CHECKERS = 6


def training_state(seed: int = 0, scale: int = 1) -> dict[str, torch.Tensor]:
    """A small training state of several chunks: θ in the middle of the canonical order."""
    g = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    for name, n in (("a", 3000 * scale), ("b", 5000 * scale)):
        out[f"param/{name}"] = torch.randn(n, generator=g)
        out[f"exp_avg/{name}"] = torch.randn(n, generator=g) * 1e-3
        out[f"exp_avg_sq/{name}"] = torch.rand(n, generator=g) * 1e-6
    out["step"] = torch.tensor([7], dtype=torch.int64)
    return out


def param_bytes(state: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for n, t in state.items() if n.startswith("param/"))


@dataclass
class Node:
    """One node's store, holdings and server, counting what it sends by kind."""

    root: Path
    store: ContentStore = field(init=False)
    holdings: Holdings = field(init=False)
    server: ServerThread = field(init=False)
    sent: dict[str, int] = field(default_factory=dict)

    rate: float | None = None
    """Bytes per second this node sends each response at (an author's uplink shared by many)."""
    chunk: int = CHUNK

    def __post_init__(self) -> None:
        self.store = ContentStore(self.root, self.chunk)
        catalog = BlobCatalog(self.chunk)
        self.holdings = Holdings(self.store, catalog, lambda *a, **k: None)
        lock = threading.Lock()

        def on_sent(kind: str, n: int) -> None:
            with lock:
                self.sent[kind] = self.sent.get(kind, 0) + n

        app = build_app(catalog, dict, on_sent=on_sent, serve_rate=lambda _k, _h: self.rate)
        self.server = ServerThread(app).start()

    @property
    def url(self) -> str:
        return self.server.url

    def keep(self, kind: Kind, h: str, group: str) -> None:
        self.holdings.keep(kind, h, group, step=int(group))


@pytest.fixture
def state() -> dict[str, torch.Tensor]:
    return training_state()


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[list[Node]]:
    made: list[Node] = []
    yield made
    for n in made:
        n.server.stop()


def host_with(
    nodes: list[Node],
    root: Path,
    state: dict[str, torch.Tensor],
    rate: float | None = None,
    chunk: int = CHUNK,
) -> tuple[Node, str]:
    host = Node(root, rate=rate, chunk=chunk)
    nodes.append(host)
    h = host.store.put_tensors(Kind.STATE, state, GROUP)
    host.keep(Kind.STATE, h, GROUP)
    return host, h


def source(
    client: BlobClient, node: Node, holders: list[str], policy: ObjectPolicy, spare: list[str]
) -> HttpSource:
    return HttpSource(client, holders, policy, node.store, group=GROUP, keep=node.keep, spare=spare)


def test_checkers_fetch_theta_h_params_from_each_other_and_the_author_uploads_them_once(
    tmp_path: Path, nodes: list[Node], state: dict[str, torch.Tensor]
) -> None:
    """Six checkers one after the other, each listing the author first and the others after: every
    fetch is θ_H's parameters bit for bit, each checker serves the chunks it fetched, and the
    author sends the parameter chunks (and the header's) about once in all, not six times."""
    host, h = host_with(nodes, tmp_path / "host", state)
    checkers = [Node(tmp_path / f"v{i}") for i in range(N_CHECKERS)]
    nodes += checkers
    policy = ObjectPolicy(CHUNK, {Kind.STATE: specs_of(state)}, 0)
    ref = policy.ref(Kind.STATE, h)
    assert ref.n_chunks >= 8
    wanted_bytes = param_bytes(state)
    with BlobClient([], timeout=10, retries=1, backoff=0) as client:
        for i, me in enumerate(checkers):
            others = [c.url for j, c in enumerate(checkers) if j != i]
            got = source(client, me, [host.url, *others], policy, spare=[host.url]).params(h)
            assert set(got) == {n for n in state if n.startswith("param/")}
            for n, t in got.items():
                assert torch.equal(t, state[n])
            part = me.store.open_partial(Kind.STATE, h, GROUP)
            assert part is not None and part.held() and not part.complete
    # the parameter chunks cover ≈ 4 of 12 B/param, plus the header's chunk: once from the author
    print("author sent", host.sent["state"] / wanted_bytes, "× θ_H's parameters")
    assert host.sent["state"] <= 1.5 * wanted_bytes, (host.sent, wanted_bytes)
    peers = sum(c.sent.get("state", 0) for c in checkers)
    assert peers >= (N_CHECKERS - 2) * wanted_bytes  # the rest came from the checkers
    for c in checkers:  # every kept chunk reads back verified
        part = c.store.open_partial(Kind.STATE, h, GROUP)
        assert part is not None
        for i in sorted(part.held()):
            b"".join(part.read(*ref.span(i)))


def test_checkers_fetching_at_once_spread_the_load(
    tmp_path: Path, nodes: list[Node], state: dict[str, torch.Tensor]
) -> None:
    """The same six checkers all at once, the author's uplink slower than the checkers' (it serves
    them all): each checker takes its chunks in its own random order and asks the author only for
    chunks no other checker holds, so the author sends θ_H's parameters about once, not six
    times, and every fetch verifies."""
    state, chunk = training_state(1, scale=3), 1024  # ≈ 100 chunks of θ
    host, h = host_with(nodes, tmp_path / "host", state, rate=1_000_000.0, chunk=chunk)
    checkers = [Node(tmp_path / f"v{i}", chunk=chunk) for i in range(N_CHECKERS)]
    nodes += checkers
    policy = ObjectPolicy(chunk, {Kind.STATE: specs_of(state)}, 0)
    errors: list[BaseException] = []
    start = threading.Barrier(N_CHECKERS)

    def check(i: int) -> None:
        try:
            others = [c.url for j, c in enumerate(checkers) if j != i]
            with BlobClient([], timeout=10, retries=2, backoff=0) as client:
                src = source(client, checkers[i], [host.url, *others], policy, spare=[host.url])
                start.wait()
                got = src.params(h)
            assert all(torch.equal(t, state[n]) for n, t in got.items())
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=check, args=(i,)) for i in range(N_CHECKERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    wanted = param_bytes(state)
    print("author sent", host.sent["state"] / wanted, "× θ_H's parameters")
    assert host.sent["state"] < 2.0 * wanted, (host.sent, wanted)  # not 6 ×


def test_a_garbage_peer_among_the_holders_is_refused_and_the_honest_ones_succeed(
    tmp_path: Path, nodes: list[Node], state: dict[str, torch.Tensor]
) -> None:
    """A peer serving the honest manifest and wrong chunks, listed before the honest checker: every
    chunk it sends fails its digest, the fetch takes them from the others, and nothing it sent is
    kept or served on."""
    host, h = host_with(nodes, tmp_path / "host", state)
    honest = Node(tmp_path / "honest")
    me = Node(tmp_path / "me")
    nodes += [honest, me]
    data = canonical_bytes(state)
    garbage_catalog = BlobCatalog(CHUNK)
    garbage_catalog.publish("state", h, GarbageHolder(data, CHUNK))
    garbage = ServerThread(build_app(garbage_catalog, dict)).start()
    policy = ObjectPolicy(CHUNK, {Kind.STATE: specs_of(state)}, 0)
    reports: list[object] = []
    try:
        with BlobClient([], timeout=10, retries=1, backoff=0) as client:
            source(client, honest, [host.url], policy, spare=[host.url]).params(h)
            src = HttpSource(client, [host.url, garbage.url, honest.url], policy, me.store, reports.append,
                             group=GROUP, keep=me.keep, spare=[host.url])  # fmt: skip
            got = src.params(h)
            with pytest.raises(BlobInvalid):  # only the liar: refused, nothing kept from it
                client.fetch(policy.ref(Kind.STATE, h), TensorSink(specs_of(state)), [garbage.url])
    finally:
        garbage.stop()
    assert all(torch.equal(t, state[n]) for n, t in got.items())
    (report,) = reports
    assert report.bad_chunks >= 1 and garbage.url not in report.chunks_from  # type: ignore[attr-defined]
    assert report.chunks_from.get(honest.url, 0) > 0  # type: ignore[attr-defined]


def test_a_partial_holder_is_asked_only_for_what_it_holds_and_never_dropped_for_the_rest(
    tmp_path: Path, nodes: list[Node], state: dict[str, torch.Tensor]
) -> None:
    """The whole state fetched from a spared author and a checker holding some of its chunks (θ_H's
    parameters): the checker's 404s for the chunks it lacks cost it nothing, it serves every chunk
    it holds, the author only the others."""
    host, h = host_with(nodes, tmp_path / "host", state)
    peer, me = Node(tmp_path / "peer"), Node(tmp_path / "me")
    nodes += [peer, me]
    policy = ObjectPolicy(CHUNK, {Kind.STATE: specs_of(state)}, 0)
    ref = policy.ref(Kind.STATE, h)
    with BlobClient([], timeout=10, retries=0, backoff=0) as client:
        source(client, peer, [host.url], policy, spare=[host.url]).params(h)
        part = peer.store.open_partial(Kind.STATE, h, GROUP)
        assert part is not None
        held = set(part.held())
        sink = TensorSink(specs_of(state))
        report = client.fetch(ref, sink, [host.url, peer.url], spare=[host.url])
    assert all(torch.equal(sink.tensors[n], t) for n, t in state.items())
    assert report.bad_chunks == 0
    assert report.chunks_from[peer.url] == len(held)
    assert report.chunks_from[host.url] == ref.n_chunks - len(held)


def test_a_range_touching_a_chunk_not_held_is_404_partial_and_held_lists_what_is(
    tmp_path: Path, nodes: list[Node], state: dict[str, torch.Tensor]
) -> None:
    host, h = host_with(nodes, tmp_path / "host", state)
    peer = Node(tmp_path / "peer")
    nodes.append(peer)
    policy = ObjectPolicy(CHUNK, {Kind.STATE: specs_of(state)}, 0)
    ref = policy.ref(Kind.STATE, h)
    data = canonical_bytes(state)
    with BlobClient([], timeout=10, retries=0, backoff=0) as client:
        source(client, peer, [host.url], policy, spare=[host.url]).params(h)
    part = peer.store.open_partial(Kind.STATE, h, GROUP)
    assert part is not None
    held = sorted(part.held())
    lacking = next(i for i in range(ref.n_chunks) if i not in held)
    url = f"{peer.url}/blobs/state/{h}"
    with httpx.Client() as http:
        a, b = ref.span(held[-1])
        r = http.get(url, headers={"Range": f"bytes={a}-{b - 1}"})
        assert r.status_code == 206 and r.content == data[a:b]
        a, b = ref.span(lacking)
        r = http.get(url, headers={"Range": f"bytes={a}-{b - 1}"})
        assert r.status_code == 404 and r.headers["x-held"] == "partial" and r.content != data[a:b]
        assert http.get(url).status_code == 404  # the whole object: not all held
        r = http.get(url + "/held")
        assert r.status_code == 200 and parse_held(r.content, ref.n_chunks) == set(held)
        r = http.get(url + "/chunks")
        assert r.status_code == 200 and len(r.content) == 32 * ref.n_chunks
        r = http.get(f"{host.url}/blobs/state/{h}/held")  # a whole copy holds every chunk
        assert parse_held(r.content, ref.n_chunks) == set(range(ref.n_chunks))
        r = http.get(f"{host.url}/blobs/state/{'0' * 64}/held")
        assert r.status_code == 404 and "x-held" not in r.headers


def test_partial_objects_persist_verify_on_read_and_go_with_their_group(tmp_path: Path) -> None:
    """Atomic writes, verified on every read, reopened after a restart, swept only when torn, pruned
    with the step's group, superseded by the whole object."""
    state = training_state(2)
    h, digests = tensor_hash_and_digests(state, StateKind.TRAINING, CHUNK)
    data = canonical_bytes(state)
    store = ContentStore(tmp_path / "s", CHUNK)
    with pytest.raises(StoreError):  # a manifest that is not the hash's
        store.partial(Kind.STATE, h, GROUP, len(data), digests[::-1])
    part = store.partial(Kind.STATE, h, GROUP, len(data), digests)
    assert store.partial(Kind.STATE, h, GROUP, len(data), digests) is part  # one live object
    n = part.n_chunks
    for i in (0, 2, n - 1):
        a = i * CHUNK
        part.write_at(a, data[a : a + CHUNK])
    with pytest.raises(StoreError):  # not one whole chunk
        part.write_at(5, data[5:100])
    assert b"".join(part.read(2 * CHUNK + 10, 3 * CHUNK)) == data[2 * CHUNK + 10 : 3 * CHUNK]
    with pytest.raises(NotHeld):
        list(part.read(0, 2 * CHUNK))
    part.flush()
    again = ContentStore(tmp_path / "s", CHUNK)  # a restart: the held list read back
    reopened = again.open_partial(Kind.STATE, h, GROUP)
    assert reopened is not None and reopened.held() == {0, 2, n - 1}
    assert again.partials(Kind.STATE, GROUP) == [h] and again.hashes(Kind.STATE) == []
    assert not stale_files(tmp_path / "s")
    # a corrupted chunk on disk is an error, never a wrong chunk
    path = tmp_path / "s" / GROUP / f"{h}.state{PARTIAL}"
    with open(path, "r+b") as f:
        f.seek(2 * CHUNK)
        f.write(b"\xff")
    with pytest.raises(StoreError, match="corrupted"):
        list(reopened.read(2 * CHUNK, 3 * CHUNK))
    # the held list without its data file is what a kill leaves: swept
    os.replace(path, tmp_path / "elsewhere")
    assert {p.name for p in stale_files(tmp_path / "s")} == {
        f"{h}.state{PARTIAL}.held",
        f"{h}.state{PARTIAL}.chunks",
    }
    os.replace(tmp_path / "elsewhere", path)
    # the whole object supersedes it; dropping the group drops it
    again.put_tensors(Kind.STATE, state, "4")
    part4 = again.partial(Kind.STATE, h, "4", len(data), digests)
    sink = again.begin(Kind.STATE, h, "4", len(data))
    sink.write_at(0, data)
    again.commit(Kind.STATE, h, "4", sink, digests)
    assert again.open_partial(Kind.STATE, h, "4") is None and part4.hash == h
    again.drop_group(GROUP)
    assert again.open_partial(Kind.STATE, h, GROUP) is None and not (tmp_path / "s" / GROUP).exists()


def test_held_bitmaps_are_exact() -> None:
    assert held_bitmap({0, 9}, 10) == bytes([1, 2])
    assert parse_held(bytes([1, 2]), 10) == {0, 9}
    for bad in (bytes([1]), bytes([1, 2, 0]), bytes([1, 4])):  # short, long, a bit past chunk 9
        with pytest.raises(ValueError):
            parse_held(bad, 10)
    assert BytesObject(b"x" * 10, CHUNK).length == 10


def test_a_whole_state_after_its_parameters_fetches_only_the_rest(
    tmp_path: Path, nodes: list[Node], state: dict[str, torch.Tensor]
) -> None:
    """A checker that kept θ_H's parameter chunks and then needs the whole state (a dispute panel
    replaying the last window in tolerance mode) fetches only the other chunks; the whole state
    replaces the partial copy in its store and on its server."""
    host, h = host_with(nodes, tmp_path / "host", state)
    me = Node(tmp_path / "me")
    nodes.append(me)
    policy = ObjectPolicy(CHUNK, {Kind.STATE: specs_of(state)}, 0)
    ref = policy.ref(Kind.STATE, h)
    with BlobClient([], timeout=10, retries=0, backoff=0) as client:
        src = source(client, me, [host.url], policy, spare=[host.url])
        src.params(h)
        part = me.store.open_partial(Kind.STATE, h, GROUP)
        assert part is not None
        kept = sum(ref.span(i)[1] - ref.span(i)[0] for i in part.held())
        before = host.sent["state"]
        got = src.state(h)
    assert all(torch.equal(got[n], t) for n, t in state.items())
    assert host.sent["state"] - before == ref.length - kept
    assert me.store.has(Kind.STATE, h, GROUP) and me.store.open_partial(Kind.STATE, h, GROUP) is None
    me.store.verify(Kind.STATE, h, GROUP)
    with httpx.Client() as http:  # served whole now
        assert http.get(f"{me.url}/blobs/state/{h}").content == canonical_bytes(state)
