"""Sharded training state (`trainer.sharded`), ranks as threads: the sharded step trains the
unsharded trajectory bit for bit, each rank holding 1/W of the moments; the ranks' collective hash
of their parts is the hash of the whole state; per-rank shard files are one canonical object."""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nodekit.objects import Kind
from nodekit.store import ContentStore, StoreError, put_shard, seal_shards
from protocol import chunks
from protocol.tensors import StateKind, canonical_bytes, tensor_hash
from replay.step import (
    TrainJob,
    configure_determinism,
    optimizer_state,
    train_segment,
    training_hash,
    training_state,
)
from tests.support.replay import HOST, fresh, tiny_cfg, tiny_corpus
from trainer.sharded import (
    LocalGroup,
    ShardedState,
    ShardedStep,
    ShardError,
    ShardPlan,
    make_shard_optimizer,
    shard_ranges,
)


def test_shard_ranges_cover_every_tensor_once_in_order_none_empty() -> None:
    for numels, w in (([5, 1, 1, 9, 3], 2), ([4] * 7, 4), ([100, 1, 1], 3), ([1], 1), ([1, 1, 1000], 3)):
        ranges = shard_ranges(numels, w)
        assert len(ranges) == w and [i for r in ranges for i in r] == list(range(len(numels)))
        assert all(len(r) for r in ranges)
    assert [list(r) for r in shard_ranges([4] * 8, 4)] == [[0, 1], [2, 3], [4, 5], [6, 7]]


def on_ranks(world: int, fn: Callable[[int], Any]) -> list[Any]:
    """`fn(rank)` on `world` threads; the first failure aborts the others and is raised."""
    out: list[Any] = [None] * world
    errors: list[BaseException] = []
    groups: list[LocalGroup] = []

    def run(r: int) -> None:
        try:
            out[r] = fn(r)
        except BaseException as e:  # pragma: no cover - re-raised below
            errors.append(e)
            for g in groups:
                g.barrier.abort()

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    if errors:
        raise errors[0]
    return out


@pytest.mark.parametrize("moments", ["fp32", "int8"])
@pytest.mark.parametrize("world", [2, 3])
def test_sharded_ranks_train_hash_and_save_the_unsharded_state(
    world: int, moments: str, tmp_path: Path
) -> None:
    """Three steps with W slices: the ranks' collective hash (with 1 KiB chunks, so chunks straddle
    rank edges) is the unsharded state's, their shard files read back as its canonical bytes, and
    loading them gives every rank its part of it again, from which a fourth step is the unsharded
    one. With int8 moments (specs §6.2.1) the ranks hold, hash and save the codes and scales of
    their tensors, never `Int8AdamW`'s float32 working copies."""
    configure_determinism(1)
    cfg, data, steps, c = tiny_cfg(batch_size=2 * world, inner={"moments": moments}), tiny_corpus(), 3, 1024
    ref_model, ref_opt = fresh(cfg)
    train_segment(TrainJob(cfg, data, HOST, 0, micro_batches=world), ref_model, ref_opt, 0, steps)
    want = training_state(ref_model, ref_opt, copy=True)
    codes = [t for k, t in want.items() if k.startswith("exp_avg_code/")]
    assert bool(codes) == (moments == "int8") and all(bool(t.any()) for t in codes)  # nonzero codes
    train_segment(TrainJob(cfg, data, HOST, 0, micro_batches=world), ref_model, ref_opt, steps, 1)
    after = training_hash(training_state(ref_model, ref_opt), c)

    train, boundary = LocalGroup(world), LocalGroup(world)
    models = [fresh(cfg)[0] for _ in range(world)]
    plan = ShardPlan.of(models[0], world)
    store = ContentStore(tmp_path, c)

    def rank(r: int) -> tuple[str, str, int, str]:
        model = models[r]
        opt = make_shard_optimizer(model, plan, r, cfg.inner)
        step = ShardedStep(plan, train.member(r), bucket_elems=1000)  # several reduce-scatter rounds
        job = TrainJob(cfg, data, HOST, 0, micro_batches=world, exchange=step)
        train_segment(job, model, opt, 0, steps)
        state = ShardedState(plan, model, boundary.member(r), cfg.inner.moments)
        local = state.local(model, opt)
        assert {k.split("/", 1)[0] for k in local} <= {k.split("/", 1)[0] for k in want}  # canonical only
        h, digests = state.hash(local, StateKind.TRAINING, c)
        state.save(store, StateKind.TRAINING, "0", h, digests, local)
        olocal = state.local(model, opt, StateKind.OPTIMIZER)
        oh, odigests = state.hash(olocal, StateKind.OPTIMIZER, c)
        state.save(store, StateKind.OPTIMIZER, "opt", oh, odigests, olocal)
        # rank 0 seals an object after the others have written their shards and returned: wait for
        # it before reading the optimizer state back (on a loaded machine another rank got there first)
        state.comm.broadcast_bytes(b"sealed" if r == 0 else None)
        held = sum(t.numel() for k, t in local.items() if not k.startswith("param/"))
        # load back into a fresh replica: the params and this rank's moments and step
        again = fresh(cfg)[0]
        again_opt = make_shard_optimizer(again, plan, r, cfg.inner)
        state.load(store, StateKind.TRAINING, h, "0", again, again_opt)
        assert state.local(again, again_opt).keys() == local.keys()
        assert all(state.local(again, again_opt)[k].equal(v) for k, v in local.items())
        assert all(p.equal(want[f"param/{n}"]) for n, p in again.named_parameters())
        carried = make_shard_optimizer(again, plan, r, cfg.inner)  # the moments and step alone
        state.load(store, StateKind.OPTIMIZER, oh, "opt", again, carried)
        back = state.local(again, carried, StateKind.OPTIMIZER)
        assert back.keys() == olocal.keys() and all(back[k].equal(v) for k, v in olocal.items())
        train_segment(job, again, again_opt, steps, 1)  # from the loaded state: the unsharded step
        h_after, _ = state.hash(state.local(again, again_opt), StateKind.TRAINING, c)
        return h, oh, held, h_after

    results = on_ranks(world, rank)
    assert {h for h, *_ in results} == {training_hash(want, c)}  # every rank learns the hash
    assert {oh for _, oh, *_ in results} == {tensor_hash(optimizer_state(want), StateKind.OPTIMIZER, c)}
    assert {ha for *_, ha in results} == {after}
    all_moments = sum(t.numel() for t in optimizer_state(want).values()) - 1  # besides `step`
    held = [m for _, _, m, _ in results]
    assert sum(held) == all_moments + 1 and max(held) < all_moments / 1.5
    h = results[0][0]
    assert store.find(Kind.STATE, h, "0").name.endswith(".shards")  # type: ignore[union-attr]
    assert store.read_bytes(Kind.STATE, h, "0") == canonical_bytes(want)
    assert b"".join(store.read(Kind.STATE, h, 1000, 5000, "0")) == canonical_bytes(want)[1000:5000]
    for m in models[1:]:  # every replica holds the same parameters after the broadcasts
        assert all(a.equal(b) for a, b in zip(m.parameters(), models[0].parameters(), strict=True))


def test_sharded_int8_state_refuses_another_format_and_codes_no_quantization_makes(tmp_path: Path) -> None:
    """A sharded state and its rank's optimizer must keep one moment format (one-line error), and an
    int8 state with a code -128 does not load (specs §6.2.1), as unsharded."""
    cfg = tiny_cfg(inner={"moments": "int8"})
    model, opt = fresh(cfg)
    plan = ShardPlan.of(model, 1)
    fp32_opt = make_shard_optimizer(model, plan, 0, tiny_cfg(inner={"moments": "fp32"}).inner)
    with pytest.raises(ShardError, match="optimizer with fp32 moments, sharded state with int8"):
        ShardedState(plan, model, LocalGroup(1).member(0), "int8").local(model, fp32_opt)
    bad = {k: t.clone() for k, t in training_state(model, opt).items()}
    name = next(k for k in bad if k.startswith("exp_avg_code/"))
    bad[name].view(-1)[0] = -128
    store = ContentStore(tmp_path, 1024)
    h = store.put_tensors(Kind.STATE, bad, "0")
    state = ShardedState(plan, model, LocalGroup(1).member(0), "int8")
    with pytest.raises(ShardError, match="-128 is not a code"):
        state.load(store, StateKind.TRAINING, h, "0", model, make_shard_optimizer(model, plan, 0, cfg.inner))


def sharded_object(tmp_path: Path, data: bytes, cuts: list[int], c: int) -> tuple[ContentStore, str]:
    """`data` stored as shard files cut at `cuts` (rank q holds every W-th range, like a sharded
    state's runs), sealed with its digests."""
    store = ContentStore(tmp_path, c)
    h, digests = chunks.hash_stream(chunks.DELTA_DOMAIN, [data], c)
    edges = [0, *cuts, len(data)]
    world = 3
    layout: list[list[tuple[int, int]]] = [[] for _ in range(world)]
    for i, (a, b) in enumerate(itertools.pairwise(edges)):
        if b > a:
            layout[i % world].append((a, b))
    for q, ranges in enumerate(layout):
        put_shard(store, Kind.DELTA, h, "g", q, [data[a:b] for a, b in ranges])
    seal_shards(store, Kind.DELTA, h, "g", len(data), layout, digests)
    return store, h


@settings(max_examples=25, deadline=None)
@given(data=st.binary(min_size=1, max_size=3000), cuts=st.lists(st.integers(0, 3000), max_size=6))
def test_shard_files_serve_any_range_as_the_canonical_bytes(
    tmp_path_factory: Any, data: bytes, cuts: list[int]
) -> None:
    cuts = sorted({x for x in cuts if 0 < x < len(data)})
    store, h = sharded_object(tmp_path_factory.mktemp("s"), data, cuts, 256)
    assert store.length(Kind.DELTA, h, "g") == len(data)
    assert store.read_bytes(Kind.DELTA, h, "g") == data
    a, b = len(data) // 3, 2 * len(data) // 3 + 1
    assert b"".join(store.read(Kind.DELTA, h, a, b, "g")) == data[a:b]
    assert store.hashes(Kind.DELTA, "g") == [h]
    store.delete(Kind.DELTA, h, "g")
    assert not store.has(Kind.DELTA, h, "g") and not list((store.root / "g").glob(h + "*"))


def test_a_corrupted_or_missing_shard_file_is_an_error_never_wrong_bytes(tmp_path: Path) -> None:
    data = bytes(range(256)) * 12
    store, h = sharded_object(tmp_path, data, [700, 1500, 2200], 256)
    shard = next((tmp_path / "g").glob(f"{h}.delta.r1"))
    raw = bytearray(shard.read_bytes())
    raw[5] ^= 1
    shard.write_bytes(bytes(raw))
    with pytest.raises(StoreError, match="corrupted"):
        store.read_bytes(Kind.DELTA, h, "g")
    shard.write_bytes(bytes(raw[:-1]))
    with pytest.raises(StoreError, match="holds"):
        store.length(Kind.DELTA, h, "g")
    with pytest.raises(StoreError, match="gap or overlap"):  # a layout that does not tile
        seal_shards(store, Kind.DELTA, h, "h", len(data), [[(0, 10)], [(5, len(data))]], [])


@settings(max_examples=60, deadline=None)
@given(raw=st.binary(max_size=200))
def test_shard_digest_decoder_refuses_garbage_with_its_own_error(raw: bytes) -> None:
    for blob in (raw, b"GDSD" + raw):  # anything else escaping fails the test
        with contextlib.suppress(chunks.ChunkError):
            chunks.decode_shards(blob, 1000, 256)


def test_shard_digest_wire_form_round_trips_and_is_bounded() -> None:
    data = bytes(range(256)) * 5
    shards = [chunks.shard_digests(a, [data[a:b]], len(data), 256) for a, b in ((0, 300), (300, 1280))]
    raw = chunks.encode_shards(shards)
    back = chunks.decode_shards(raw, len(data), 256)
    assert chunks.combine_shards(back, len(data), 256) == chunks.hash_stream(b"", [data], 256)[1]
    with pytest.raises(chunks.ChunkError, match="outside"):  # claims bytes beyond the object
        chunks.decode_shards(raw, 1000, 256)
