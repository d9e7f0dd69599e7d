"""Fetching under contention and from slow or hostile holders (issues 22, 36): one fetch per object
whose failure fails only the callers it spoke for, hedged chunks, a rate floor enforced by the
clock, and nothing left half-written by a kill."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gonka_diloco.adversaries.holders import GarbageHolder, SlowHolder
from nodekit import holdings
from nodekit.fetch import BlobClient, BlobInvalid, BlobUnavailable
from nodekit.flight import SingleFlight
from nodekit.globalmodel import GlobalModel, GlobalStore
from nodekit.holdings import fetch_to_store
from nodekit.objects import Kind, ObjectRef, TransferPolicy
from nodekit.serve import BlobCatalog, BytesObject, ServerThread, build_app
from nodekit.store import BytesSink, ContentStore, stale_files
from protocol import chunks
from protocol.codecs import delta_hash
from tests.support.procs import cpu_burners

CHUNK = 1024


def obj(n: int, seed: int = 0) -> tuple[bytes, ObjectRef]:
    data = bytes((i * 7 + seed) % 251 for i in range(n))
    return data, ObjectRef(Kind.DELTA, delta_hash(data, CHUNK), len(data), CHUNK)


class Counting(BytesObject):
    """An honest holder that counts the bytes it sends."""

    sent = 0

    def read(self, start: int, end: int) -> Iterator[bytes]:
        for piece in super().read(start, end):
            type(self).sent += len(piece)
            yield piece


def serve(*objects: tuple[str, object]) -> ServerThread:
    catalog = BlobCatalog(CHUNK)
    for h, o in objects:
        catalog.publish("delta", h, o)  # type: ignore[arg-type]
    return ServerThread(build_app(catalog, dict)).start()


def test_one_fetch_per_object_among_threads_and_garbage_peers(tmp_path: Path) -> None:
    """Eight threads of one node fetch the same three objects, holders listed garbage first: each
    object crosses the wire about once, every stored copy verifies, no part file is left, and a
    fetch that failed (garbage only) does not poison the next one."""
    objects = [obj(16 * CHUNK, s) for s in range(3)]
    Counting.sent = 0
    honest = serve(*((ref.hash, Counting(data, CHUNK)) for data, ref in objects))
    liars = [serve(*((ref.hash, GarbageHolder(data, CHUNK)) for data, ref in objects)) for _ in range(2)]
    urls = [s.url for s in liars] + [honest.url]
    store = ContentStore(tmp_path / "store", CHUNK)
    errors: list[BaseException] = []
    try:
        with BlobClient([], timeout=5, retries=1, backoff=0) as client:
            with pytest.raises(BlobInvalid):  # only liars: refused, and nothing is kept
                fetch_to_store(client, store, objects[0][1], "delta-0", [s.url for s in liars])
            assert not store.has(Kind.DELTA, objects[0][1].hash)

            def work(i: int) -> None:
                try:
                    for data, ref in objects[i % 3 :] + objects[: i % 3]:
                        fetch_to_store(client, store, ref, "delta-0", urls)
                        assert store.read_bytes(Kind.DELTA, ref.hash) == data
                except BaseException as e:
                    errors.append(e)

            threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
    finally:
        for s in [honest, *liars]:
            s.stop()
    assert not errors, errors
    total = sum(len(d) for d, _ in objects)
    assert Counting.sent <= 1.5 * total  # not 8 ×: one flight per object (hedges may add a little)
    for _data, ref in objects:
        store.verify(Kind.DELTA, ref.hash)
    assert not [p for p in (tmp_path / "store").rglob(".*")]  # no part or temp file left


class Gated:
    """Another holder's answers, every chunk held until `release`: the flight it serves stays
    running until the test has its other callers waiting on it (`asked`: a chunk was asked for)."""

    def __init__(self, inner: BytesObject, release: threading.Event) -> None:
        self.inner, self.release, self.asked = inner, release, threading.Event()
        self.length, self.chunk_bytes = inner.length, inner.chunk_bytes

    def digests(self) -> list[bytes]:
        return self.inner.digests()

    def read(self, start: int, end: int) -> Iterator[bytes]:
        self.asked.set()
        if not self.release.wait(60):
            raise RuntimeError("the test never released its gated holder")
        yield from self.inner.read(start, end)


def test_a_waiter_whose_flight_failed_is_not_failed_by_another_callers_sources() -> None:
    """The flight's own rule, without HTTP: a failure is shared with a waiter whose sources the
    failed call had, and not with one that has a source it did not try (that one runs its own)."""
    started, release = threading.Event(), threading.Event()
    waiting = threading.Semaphore(0)
    flights = SingleFlight(on_wait=lambda key: waiting.release())

    def garbage() -> str:
        started.set()
        release.wait(30)
        raise BlobInvalid("chunk 0 does not match its digest")

    out: dict[str, object] = {}

    def call(name: str, fn: Any, sources: list[str]) -> None:
        try:
            out[name] = flights.do("k", fn, sources)
        except BlobInvalid as e:
            out[name] = e

    lead = threading.Thread(target=call, args=("lead", garbage, ["liar"]))
    lead.start()
    assert started.wait(30)
    others = [
        threading.Thread(target=call, args=("same", lambda: "unused", ["liar"])),
        threading.Thread(target=call, args=("honest", lambda: "data", ["liar", "honest"])),
    ]
    for t in others:
        t.start()
    for _ in others:
        assert waiting.acquire(timeout=30)
    release.set()
    for t in [lead, *others]:
        t.join(30)
    assert isinstance(out["lead"], BlobInvalid) and out["same"] is out["lead"]  # shared: same sources
    assert out["honest"] == ("data", False)  # not shared: it ran with its own sources
    assert not flights.running("k")


@pytest.mark.parametrize("first", ["garbage", "honest"], ids=["garbage-first", "honest-first"])
def test_a_failed_shared_fetch_never_fails_a_caller_with_an_honest_holder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, first: str
) -> None:
    """Issue 36 (2): eight threads of one node fetch one object beside two CPU burners, each with
    its own holders: honest, garbage, or both. The first caller's flight is held open (its holder
    is gated) until the seven others wait on it. Garbage first: its flight fails on a bad digest;
    every caller that had an honest holder still gets the object (before the fix all got the
    garbage caller's BlobInvalid and nothing was stored), one whose holders the failed flight
    had gets BlobInvalid. Honest first: everyone shares its one download."""
    data, ref = obj(16 * CHUNK)
    release = threading.Event()
    gate = Gated(GarbageHolder(data, CHUNK) if first == "garbage" else BytesObject(data, CHUNK), release)
    gated, honest = serve((ref.hash, gate)), serve((ref.hash, BytesObject(data, CHUNK)))
    liars = [serve((ref.hash, GarbageHolder(data, CHUNK))) for _ in range(2)]
    good = {honest.url} | ({gated.url} if first == "honest" else set())
    callers = [
        [gated.url],  # the first: leads the flight
        [honest.url],
        [liars[0].url, honest.url],
        [liars[0].url],
        [gated.url],  # the first's holders exactly
        [honest.url, liars[1].url],
        [liars[0].url, liars[1].url],
        [honest.url],
    ]
    waiting = threading.Semaphore(0)
    monkeypatch.setattr(holdings, "FLIGHTS", SingleFlight(on_wait=lambda key: waiting.release()))
    store = ContentStore(tmp_path / "store", CHUNK)
    outcome: dict[int, BaseException | None] = {}

    def work(i: int) -> None:
        try:
            fetch_to_store(client, store, ref, "delta-0", callers[i])
            outcome[i] = None
        except BaseException as e:
            outcome[i] = e

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(callers))]
    try:
        with cpu_burners(2), BlobClient([], timeout=10, retries=1, backoff=0) as client:
            threads[0].start()
            assert gate.asked.wait(30)  # the first caller's flight is the one running
            for t in threads[1:]:
                t.start()
            for _ in threads[1:]:
                assert waiting.acquire(timeout=30)  # every other caller waits on it
            release.set()
            for t in threads:
                t.join(60)
    finally:
        release.set()
        for s in [gated, honest, *liars]:
            s.stop()
    assert not any(t.is_alive() for t in threads)
    for i, sources in enumerate(callers):
        if good & set(sources):
            assert outcome[i] is None, (i, sources, outcome[i])
        elif first == "garbage" and set(sources) <= {gated.url}:
            assert isinstance(outcome[i], BlobInvalid), (i, outcome[i])
        else:  # only garbage holders: refused, unless an honest flight it waited on stored the object
            assert outcome[i] is None or isinstance(outcome[i], BlobInvalid), (i, outcome[i])
    assert store.read_bytes(Kind.DELTA, ref.hash) == data
    store.verify(Kind.DELTA, ref.hash)
    assert not [p for p in (tmp_path / "store").rglob(".*")]  # no part file left by the failed flights


def test_one_global_model_fetch_among_threads(tmp_path: Path) -> None:
    """The host's training loop and its tail both asking for G_n: one download, one good copy."""
    import torch

    gm = GlobalModel.create({"w": torch.arange(4096, dtype=torch.float32)}, chunk_bytes=CHUNK)
    src = GlobalStore(ContentStore(tmp_path / "src", CHUNK), gm.layout)
    src.save(gm)
    Counting.sent = 0
    data = src.get_bytes(gm.hash)
    catalog = BlobCatalog(CHUNK)
    catalog.publish("model", gm.hash, Counting(data, CHUNK))
    server = ServerThread(build_app(catalog, dict)).start()
    dst = GlobalStore(ContentStore(tmp_path / "dst", CHUNK), gm.layout)
    got: list[str] = []
    try:
        with BlobClient([], timeout=5, retries=0) as client:
            threads = [
                threading.Thread(target=lambda: got.append(dst.fetch(gm.hash, client, [server.url]).hash))
                for _ in range(6)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
    finally:
        server.stop()
    assert got == [gm.hash] * 6
    assert Counting.sent <= 1.5 * len(data)


def test_a_slow_holder_listed_first_costs_about_one_hedge() -> None:
    """A holder serving correct chunks slowly holds each chunk only until it is hedged to an idle
    holder; the first verified copy wins. Without hedging the slow holder would keep its chunks
    for 5 s each (16 chunks of 1 kB at 100 B per 0.5 s, above the floor)."""
    data, ref = obj(16 * CHUNK)
    slow = serve((ref.hash, SlowHolder(data, CHUNK, step=100, delay=0.5)))
    fast = serve((ref.hash, BytesObject(data, CHUNK)))
    policy = TransferPolicy(min_bytes_per_s=100.0, base_s=30.0)  # the floor alone would not drop it
    try:
        with BlobClient([], timeout=5, retries=0, policy=policy) as client:
            t0 = time.monotonic()
            sink = BytesSink(ref.length)
            report = client.fetch(ref, sink, [slow.url, fast.url])
            seconds = time.monotonic() - t0
    finally:
        slow.stop()
        fast.stop()
    assert bytes(sink.buf) == data
    assert report.hedged >= 1 and report.chunks_from.get(fast.url, 0) >= 15
    assert seconds < 3.0, seconds  # ≈ one hedge interval (0.5 s) plus the fast transfers


def test_a_trickling_holder_is_dropped_by_the_clock_not_resumed() -> None:
    """A holder sending a byte every 0.4 s never leaves a read waiting long, so a deadline checked
    only when a byte arrives never fires within the grace; the floor line does: once below it the
    holder is dropped (not resumed) and the chunk goes to the honest holder."""
    data, ref = obj(4 * CHUNK)
    trickle = serve((ref.hash, SlowHolder(data, CHUNK, step=1, delay=0.4)))
    fast = serve((ref.hash, BytesObject(data, CHUNK)))
    policy = TransferPolicy(min_bytes_per_s=1000.0, base_s=1.0)
    try:
        with BlobClient([], timeout=5, retries=0, policy=policy, parallel=1) as client:
            t0 = time.monotonic()
            report = client.fetch(ref, BytesSink(ref.length), [trickle.url, fast.url])
            assert report.slow == [trickle.url] and report.chunks_from == {fast.url: 4}
            assert time.monotonic() - t0 < 4.0
            t0 = time.monotonic()
            with pytest.raises(BlobUnavailable, match="slower than"):  # alone: unavailable, soon
                client.fetch(ref, BytesSink(ref.length), [trickle.url])
            assert time.monotonic() - t0 < 4.0
    finally:
        trickle.stop()
        fast.stop()


def test_a_holder_that_goes_silent_is_ended_by_the_clock() -> None:
    """Headers, ten bytes, then nothing: the read wait ends at the floor line."""
    data, ref = obj(CHUNK)

    class Silent(BytesObject):
        def read(self, start: int, end: int) -> Iterator[bytes]:
            yield self.data[start : start + 10]
            threading.Event().wait(30)
            yield self.data[start + 10 : end]

    server = serve((ref.hash, Silent(data, CHUNK)))
    policy = TransferPolicy(min_bytes_per_s=1000.0, base_s=0.5)
    try:
        with BlobClient([], timeout=5, retries=0, policy=policy) as client:
            t0 = time.monotonic()
            with pytest.raises(BlobUnavailable, match="slower than"):
                client.fetch(ref, BytesSink(ref.length), [server.url])
            assert time.monotonic() - t0 < 5.0
    finally:
        server.stop()


KILLED_FETCH = """
import sys
from gonka_diloco.adversaries.holders import SlowHolder
from nodekit.fetch import BlobClient
from nodekit.holdings import fetch_to_store
from nodekit.objects import Kind, ObjectRef, TransferPolicy
from nodekit.store import ContentStore
root, url, h, n = sys.argv[1:5]
store = ContentStore(root, 1024)
ref = ObjectRef(Kind.DELTA, h, int(n), 1024)
print("fetching", flush=True)
fetch_to_store(BlobClient([], 30, 0, policy=TransferPolicy(10.0, 60.0)), store, ref, "delta-0", [url])
"""


def test_kill_9_mid_fetch_leaves_nothing_half_written_and_sweep_cleans(tmp_path: Path) -> None:
    data, ref = obj(8 * CHUNK)
    slow = serve((ref.hash, SlowHolder(data, CHUNK, step=256, delay=0.05)))
    root = tmp_path / "store"
    store = ContentStore(root, CHUNK)
    store.put_bytes(Kind.DELTA, b"kept" * 100, "delta-0")
    try:
        proc = subprocess.Popen(
            [sys.executable, "-c", KILLED_FETCH, str(root), slow.url, ref.hash, str(ref.length)],
            stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parents[1],
        )  # fmt: skip
        assert proc.stdout is not None and proc.stdout.readline().strip() == "fetching"
        deadline = time.monotonic() + 30
        while not list((root / "delta-0").glob(".*.part-*")) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)  # some chunks in
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        slow.stop()
    assert list((root / "delta-0").glob(".*.part-*"))  # it died mid-fetch
    assert not store.has(Kind.DELTA, ref.hash)  # never visible half-written
    # a drop and a staged write killed half-way leave their marks too
    (root / ".trash-delta-7-1-2").mkdir()
    (root / "delta-0" / ".tmp-abc.delta").write_bytes(b"x")
    (root / "delta-0" / (("ab" * 32) + ".delta.chunks")).write_bytes(b"y" * 32)
    gone = store.sweep()
    assert len(gone) >= 4
    assert not [p for p in root.rglob(".*")]
    assert store.hashes(Kind.DELTA, "delta-0") == [store.put_bytes(Kind.DELTA, b"kept" * 100, "delta-0")]
    fast = serve((ref.hash, BytesObject(data, CHUNK)))
    try:
        with BlobClient([], timeout=5, retries=0) as client:
            fetch_to_store(client, store, ref, "delta-0", [fast.url])
    finally:
        fast.stop()
    assert store.read_bytes(Kind.DELTA, ref.hash) == data


def _litter(home: Path, group: str) -> list[Path]:
    """What a SIGKILL mid-write leaves in a node's data folder: a fetch's part file, a staged
    write's temp, a group half dropped, digests without their object, an atomic_write temp."""
    store = home / "store"
    (store / group).mkdir(parents=True, exist_ok=True)
    left = [
        store / group / (("ab" * 32) + ".delta.part-x1"),
        store / group / ".tmp-abc.delta",
        store / group / (("cd" * 32) + ".delta.chunks"),
        store / ".trash-9-1-2",
        home / ".tmp-node.json",
    ]
    for p in left[:3]:
        p.write_bytes(b"x" * 32)
    left[3].mkdir()
    left[4].write_bytes(b"{")
    return left


def test_nodes_sweep_what_a_kill_left_at_start_up(tmp_path: Path) -> None:
    """Issue 22 (chaos): nodes never called `sweep`, so part and temp files a kill left stayed on
    disk for good. Host and verifier now sweep their store (and the host its node.json temps)
    when they set up, before anything writes there."""
    from tests.support.nodes import (
        LockstepChain,
        create_run,
        host_config,
        run_config,
        tiny_corpus,
        verifier_node,
    )
    from trainer.node import HostNode

    corpus = tiny_corpus()
    chain = LockstepChain()
    run_id = create_run(chain, run_config(corpus, max_outer_steps=1))
    host_left = _litter(tmp_path / "host-1", "delta-0")
    ver_left = _litter(tmp_path / "verifier-9", "global")
    logs: list[dict] = []
    host = HostNode(host_config(tmp_path, 1, run_id), chain, corpus=corpus, log=logs.append)
    verifier = verifier_node(tmp_path, 9, run_id, corpus)
    verifier.rt.sink = logs.append
    try:
        host._setup()
        verifier._setup()
    finally:
        host.server.stop()
        verifier.server.stop()
    assert [p for p in host_left if p.exists()] == []
    assert [p for p in ver_left[:4] if p.exists()] == []  # (a verifier writes no node.json)
    assert {e["node"] for e in logs if e["event"] == "swept"} == {"host-1", "verifier-9"}
    assert stale_files(tmp_path / "host-1" / "store") == stale_files(tmp_path / "verifier-9" / "store") == []


class SlowSink(BytesSink):
    """A sink whose writes take a while (a loaded disk): a fetch must wait for them."""

    def write_at(self, offset: int, data: Any) -> None:
        time.sleep(0.8)
        super().write_at(offset, data)


@pytest.mark.parametrize("size", [CHUNK - 24, 3 * CHUNK], ids=["one-chunk", "three-chunks"])
def test_a_fetch_returns_only_once_every_chunk_is_in_the_sink(size: int) -> None:
    """Issue 22 (chaos, a devnet host's 'stored chunk digests do not match its hash'): a chunk was
    marked done before its bytes reached the sink (and, for a one-chunk object, before its digest
    was recorded), so another worker's wake-up could end the fetch with the last chunk still being
    written: the caller committed an empty digest list, or a file with that chunk missing. Two
    holders: the second one's worker waits for a hedge, wakes while the first is writing."""
    data, ref = obj(size)
    a, b = serve((ref.hash, BytesObject(data, CHUNK))), serve((ref.hash, BytesObject(data, CHUNK)))
    try:
        with BlobClient([], timeout=10, retries=0) as client:
            sink = SlowSink(ref.length)
            report = client.fetch(ref, sink, [a.url, b.url])
            assert bytes(sink.buf) == data
            assert chunks.verify_manifest(ref.hash, ref.domain, CHUNK, ref.length, report.digests)
    finally:
        a.stop()
        b.stop()
