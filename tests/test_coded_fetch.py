"""Training-state chunks on the wire coded against G_n (issue 35 part 1, specs §8.2), at the fetch
level over real HTTP on 127.0.0.1: a holder that holds G_n serves a chunk coded against it, the
fetcher decodes it and checks the decoded chunk against the state's manifest as any chunk; a holder
that does not code is asked for bytes; a holder coding against another base, or coding another
chunk, is caught next to an honest one whose chunks are accepted."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch

from gonka_diloco.adversaries.holders import OtherChunkCoder, WrongBaseCoder
from nodekit.coding import StateCoder, StateCoding
from nodekit.fetch import BlobClient, BlobInvalid, FetchReport
from nodekit.objects import Kind, ObjectPolicy
from nodekit.serve import BlobCatalog, ServerThread, StoredObject, build_app
from nodekit.store import ContentStore, TensorSink
from protocol.tensors import data_offsets, specs_of
from verifier.source import HttpSource, param_chunks

CHUNK = 4096
LAYOUT = {"a": (3000,), "b": (5000,)}


def g_and_state() -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """G (params + momentum) and a training state whose params moved a little away from G's."""
    gen = torch.Generator().manual_seed(5)
    g: dict[str, torch.Tensor] = {}
    state: dict[str, torch.Tensor] = {"step": torch.tensor([40], dtype=torch.int64)}
    for name, shape in LAYOUT.items():
        p = torch.randn(shape, generator=gen)
        g[f"param/{name}"], g[f"momentum/{name}"] = p, torch.zeros(shape)
        state[f"param/{name}"] = p + 1e-4 * torch.randn(shape, generator=gen)
        state[f"exp_avg/{name}"] = 1e-3 * torch.randn(shape, generator=gen)
        state[f"exp_avg_sq/{name}"] = 1e-6 * torch.rand(shape, generator=gen)
    return g, state


class Holder:
    """A node holding the state (and G, unless `with_g` is False), coding with `coder` (a class)."""

    def __init__(self, root: Path, g: dict[str, torch.Tensor], state: dict[str, torch.Tensor],
                 coder: type[StateCoder] | None = StateCoder, with_g: bool = True) -> None:  # fmt: skip
        self.store = ContentStore(root, CHUNK)
        self.g = self.store.put_tensors(Kind.MODEL, g, "global") if with_g else ""
        self.h = self.store.put_tensors(Kind.STATE, state, "0")
        catalog = BlobCatalog(CHUNK)
        catalog.publish("state", self.h, StoredObject(self.store, Kind.STATE, self.h, "0"))
        if coder is not None:
            catalog.coder = coder(self.store, specs_of(state), LAYOUT)
        self.sent = 0

        def count(_kind: str, n: int) -> None:
            self.sent += n

        self.server = ServerThread(build_app(catalog, dict, on_sent=count)).start()


Setup = tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], list[Holder], Path]


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[Setup]:
    g, state = g_and_state()
    holders: list[Holder] = []
    yield g, state, holders, tmp_path
    for h in holders:
        h.server.stop()


def fetcher(
    tmp_path: Path, g: dict[str, torch.Tensor], state: dict[str, torch.Tensor]
) -> tuple[ContentStore, StateCoding]:
    store = ContentStore(tmp_path / "fetcher", CHUNK)
    base = store.put_tensors(Kind.MODEL, g, "global")
    coding = StateCoding.of(store, base, specs_of(state), LAYOUT)
    assert coding is not None
    return store, coding


def test_a_state_comes_coded_against_g_and_decodes_to_its_canonical_chunks(setup: Setup) -> None:
    g, state, holders, tmp = setup
    holders.append(Holder(tmp / "host", g, state))
    store, coding = fetcher(tmp, g, state)
    policy = ObjectPolicy(CHUNK, {Kind.STATE: specs_of(state)}, 0)
    ref = policy.ref(Kind.STATE, holders[0].h)
    sink = TensorSink(specs_of(state))
    with BlobClient([], timeout=10, retries=0, backoff=0) as client:
        report = client.fetch(ref, sink, [holders[0].server.url], coding=coding)
    assert all(torch.equal(sink.tensors[n], t) for n, t in state.items())
    assert report.coded_raw == ref.length and report.bad_chunks == 0
    assert report.coded_bytes < ref.length  # the params' high bytes agree with G's
    assert sum(report.bytes_from.values()) == report.coded_bytes == holders[0].sent
    # θ_H's parameters alone, through a verifier's source: coded, and kept as a partial object
    reports: list[FetchReport] = []
    with BlobClient([], timeout=10, retries=0, backoff=0) as client:
        src = HttpSource(client, [holders[0].server.url], policy, store, reports.append, group="0",
                         keep=lambda *a: None, coding=coding)  # fmt: skip
        got = src.params(holders[0].h)
    assert all(torch.equal(t, state[n]) for n, t in got.items())
    (r,) = reports
    assert 0 < r.coded_bytes < r.coded_raw
    # the chunks it took are `param_chunks`' (what bench.statecode codes to measure θ_H's ratio):
    # the header's, and those from the first parameter byte's to the last's, moments not
    wanted = param_chunks(specs_of(state), CHUNK)
    spans = [s for n, s in data_offsets(specs_of(state)).items() if n.startswith("param/")]
    first, last = min(a for a, _ in spans), max(b for _, b in spans)
    assert wanted == {0, *range(first // CHUNK, (last - 1) // CHUNK + 1)} and len(wanted) < ref.n_chunks
    assert r.coded_raw == sum(b - a for a, b in map(ref.span, wanted))
    print(f"coded {r.coded_bytes} of {r.coded_raw} canonical bytes: ratio {r.coded_raw / r.coded_bytes:.2f}")


def test_holders_that_do_not_code_are_asked_for_bytes(setup: Setup) -> None:
    """No coder, or no G to code against: 404 `X-Coded: none`, and the same chunks as byte ranges."""
    g, state, holders, tmp = setup
    holders.append(Holder(tmp / "plain", g, state, coder=None))
    holders.append(Holder(tmp / "no-g", g, state, with_g=False))
    _, coding = fetcher(tmp, g, state)
    policy = ObjectPolicy(CHUNK, {Kind.STATE: specs_of(state)}, 0)
    h = holders[0].h
    for holder in holders:
        r = httpx.get(f"{holder.server.url}/blobs/state/{h}/coded/1", params={"base": coding.base})
        assert r.status_code == 404 and r.headers["x-coded"] == "none"
        sink = TensorSink(specs_of(state))
        with BlobClient([], timeout=10, retries=0, backoff=0) as client:
            report = client.fetch(policy.ref(Kind.STATE, h), sink, [holder.server.url], coding=coding)
        assert all(torch.equal(sink.tensors[n], t) for n, t in state.items())
        assert report.coded_raw == 0 and report.bad_chunks == 0
    r = httpx.get(f"{holders[0].server.url}/blobs/state/{h}/coded/99999", params={"base": coding.base})
    assert r.status_code == 416
    r = httpx.get(f"{holders[0].server.url}/blobs/state/{h}/coded/1", params={"base": "xyz"})
    assert r.status_code == 422


@pytest.mark.parametrize("liar", [WrongBaseCoder, OtherChunkCoder])
def test_a_holder_coding_against_another_base_or_another_chunk_is_caught_next_to_an_honest_one(
    setup: Setup, liar: type[StateCoder]
) -> None:
    """The liar listed first: every chunk it codes wrongly fails its digest once decoded, it gets
    no more work, and the state comes whole and exact from the honest holder; from the liar alone
    the fetch is refused."""
    g, state, holders, tmp = setup
    holders.append(Holder(tmp / "liar", g, state, coder=liar))
    holders.append(Holder(tmp / "honest", g, state))
    _, coding = fetcher(tmp, g, state)
    policy = ObjectPolicy(CHUNK, {Kind.STATE: specs_of(state)}, 0)
    ref = policy.ref(Kind.STATE, holders[0].h)
    liar_url, honest_url = (x.server.url for x in holders)
    sink = TensorSink(specs_of(state))
    with BlobClient([], timeout=10, retries=0, backoff=0) as client:
        report = client.fetch(ref, sink, [liar_url, honest_url], coding=coding)
        assert all(torch.equal(sink.tensors[n], t) for n, t in state.items())
        assert report.bad_chunks >= 1 and report.chunks_from.get(honest_url, 0) > 0
        assert report.coded_raw == ref.length  # every chunk accepted came coded, and decoded right
        with pytest.raises(BlobInvalid, match="does not match its digest"):
            client.fetch(ref, TensorSink(specs_of(state)), [liar_url], coding=coding)
