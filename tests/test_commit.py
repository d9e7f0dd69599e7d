"""The committed inner loop and the state store: leaves that open, states that replay, Δ that decodes."""

from __future__ import annotations

import dataclasses
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from nodekit.objects import Kind
from nodekit.statestore import StateStore, state_from_bytes, state_to_bytes
from nodekit.store import StoreError
from protocol import chunks
from protocol.codecs import decode, delta_hash
from protocol.config import Codec, ReplayMode, Sampling
from protocol.merkle import merkle_root, verify_pair
from protocol.tensors import StateKind, domain, tensor_hash
from replay.step import TrainJob, load_training_state, train_segment, training_hash, training_state
from tests.support.replay import HOST, fresh, tiny_cfg, tiny_corpus
from trainer.boundaries import Boundaries, LiveBoundary, SpillPool
from trainer.commit import CommitJob, TrainedStep, openings, param_tensors, run_committed
from trainer.recompute import materialize_openings

CREATOR = HOST


def _outer(tmp_path: Path, codec: Codec = Codec.FP32) -> tuple[StateStore, list[TrainedStep], dict]:
    cfg = tiny_cfg(codec=codec, inner_steps=10, segment_len=5)
    store = StateStore(tmp_path / "states")
    model, opt = fresh(cfg)
    g0 = param_tensors(model)
    job = CommitJob(cfg, tiny_corpus(), HOST, 0, start_params=g0, base_model_hash="a" * 64, store=store)
    c0 = run_committed(job, model, opt)
    c1 = run_committed(dataclasses.replace(job, outer_step=1, base_model_hash="b" * 64), model, opt)
    return store, [c0, c1], {"cfg": cfg, "g0": g0}


def test_leaves_open_and_replay(tmp_path: Path) -> None:
    store, (c0, c1), ctx = _outer(tmp_path)
    cfg = ctx["cfg"]
    assert c0.leaf_count == cfg.n_segments + 1 == 3
    raw = [bytes.fromhex(h) for h in c0.leaves]
    assert merkle_root(raw).hex() == c0.trajectory_root
    ops = openings(c0, [0, 1])
    for op in ops:
        root = bytes.fromhex(c0.trajectory_root)
        proof = [bytes.fromhex(p) for p in op.proof]
        left, right = bytes.fromhex(op.start_leaf), bytes.fromhex(op.end_leaf)
        assert verify_pair(left, right, op.segment, c0.leaf_count, proof, root)
        assert not verify_pair(right, left, op.segment, c0.leaf_count, proof, root)
    with pytest.raises(ValueError, match="outside"):
        openings(c0, [2])

    # the first leaf is the global params with a zero optimizer state
    start = store.get(c0.leaves[0], 0)
    assert all(torch.equal(start[f"param/{n}"], t) for n, t in ctx["g0"].items())
    assert float(start["step"]) == 0
    # replaying segment 1 from its stored start lands on the committed end leaf
    model, opt = fresh(cfg)
    load_training_state(model, opt, store.get(c0.leaves[1]))
    train_segment(TrainJob(cfg, tiny_corpus(), HOST, 0), model, opt, 5, 5)
    assert training_hash(training_state(model, opt)) == c0.leaves[2]
    # the optimizer state carries into the next outer step: its first leaf has step = H
    assert float(store.get(c1.leaves[0], 1)["step"]) == cfg.inner_steps
    assert c1.leaves[0] != c0.leaves[0]


def test_delta_and_commit_message(tmp_path: Path) -> None:
    _, (c0, _), ctx = _outer(tmp_path)
    assert delta_hash(c0.payload) == c0.delta_hash
    layout = {n: tuple(t.shape) for n, t in c0.delta.items()}
    decoded = decode(c0.payload, layout)
    assert all(torch.equal(decoded[n], c0.delta[n]) for n in layout)  # fp32 is lossless
    end = training_state(*fresh(ctx["cfg"]))  # shape donor only
    assert set(layout) == {k.removeprefix("param/") for k in end if k.startswith("param/")}
    assert any(t.abs().sum() > 0 for t in c0.delta.values())
    msg = c0.to_msg(CREATOR, run_id=1)
    assert msg.leaf_count == 3 and msg.tokens == ctx["cfg"].tokens_per_outer_step
    assert msg.trajectory_root == c0.trajectory_root and msg.env.deterministic in (True, False)
    assert c0.mean_loss == pytest.approx(sum(c0.losses) / 10)


def test_int8_payload_is_smaller_and_close(tmp_path: Path) -> None:
    _, (c0, _), _ = _outer(tmp_path, Codec.INT8)
    layout = {n: tuple(t.shape) for n, t in c0.delta.items()}
    decoded = decode(c0.payload, layout)
    fp32_bytes = sum(t.numel() * 4 for t in c0.delta.values())
    assert len(c0.payload) < fp32_bytes / 3
    for n in layout:
        assert torch.allclose(decoded[n], c0.delta[n], atol=float(c0.delta[n].abs().max()) / 100 + 1e-12)


def test_store_verifies_reads_and_prunes(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    state = {"param/w": torch.arange(6, dtype=torch.float32).view(2, 3), "step": torch.tensor(2.0)}
    h = store.put(state, 3)
    assert h == tensor_hash(state, StateKind.TRAINING)
    assert torch.equal(store.get(h)["param/w"], state["param/w"])
    assert state_from_bytes(store.get_bytes(h, 3), h)["step"] == 2
    store.put({"step": torch.tensor(1.0)}, 5)
    assert not list(tmp_path.rglob(".tmp-*"))

    path = store.find(h)
    data = bytearray(path.read_bytes())
    data[-1] ^= 1  # flip one bit of the last float
    path.write_bytes(bytes(data))
    with pytest.raises(StoreError, match="corrupted"):
        store.get(h)
    with pytest.raises(StoreError, match="not in the store"):
        store.get("0" * 64)
    with pytest.raises(ValueError, match="64 lower-case hex"):
        store.get("../../etc/passwd")
    assert store.prune(before=5) == [3]
    assert store.outer_steps() == [5]


def test_state_bytes_are_bounded_and_parsed_safely() -> None:
    state = {"param/w": torch.ones(100)}
    data = state_to_bytes(state)
    assert torch.equal(state_from_bytes(data)["param/w"], state["param/w"])
    with pytest.raises(StoreError, match="exceeds"):
        state_from_bytes(data, max_bytes=len(data) - 1)
    with pytest.raises(StoreError, match="not a canonical"):
        state_from_bytes(b"\xff" * 64)
    with pytest.raises(StoreError, match="does not match"):
        state_from_bytes(data, "0" * 64)


def test_sparse_checkpoints_recompute_openings_bitwise(tmp_path: Path) -> None:
    """Persist every 3rd boundary plus what is always opened, recompute the opened ones after the
    challenge: the recomputed files are byte for byte the ones a host persisting everything wrote,
    and every unneeded boundary is gone. Tolerance mode keeps both ends of each opened segment
    (claimed ends are compared); bitwise mode only the starts but segment 0's (verifiers rebuild
    that one and reproduce every end), and does not even persist θ_H."""
    tol = {"tolerance": 0.1, "tolerance_exp_avg": 0.1, "tolerance_exp_avg_sq": 0.1}
    tol["replay_mode"] = ReplayMode.TOLERANCE
    cfg = tiny_cfg(inner_steps=12, segment_len=2, sampled_segments=3, state_chunk_bytes=4096,
                   sampling=Sampling.SEGMENTS)  # fmt: skip
    # tolerance runs sample windows (RunConfig refuses segments): the host's persistence of a
    # challenge's openings is the same code whatever drew them
    cfg = cfg.model_copy(update=tol)
    full = StateStore(tmp_path / "full", chunk_bytes=4096)
    sparse = StateStore(tmp_path / "sparse", chunk_bytes=4096, checkpoint_every=3)
    model, opt = fresh(cfg)
    g0 = param_tensors(model)
    job = CommitJob(cfg, tiny_corpus(), HOST, 0, start_params=g0, base_model_hash="a" * 64, store=full)
    c_full = run_committed(job, model, opt)
    assert len(full.hashes(0)) == 7  # m = 1 and tolerance mode: every boundary
    model, opt = fresh(cfg)
    c = run_committed(dataclasses.replace(job, store=sparse), model, opt)
    assert c.leaves == c_full.leaves and len(c.leaves) == 7
    assert sorted(sparse.hashes(0)) == sorted({c.leaves[j] for j in (3, 5, 6)})  # 0 = G_n + optimizer
    bitwise_cfg = cfg.model_copy(update={"replay_mode": ReplayMode.BITWISE})
    assert [Boundaries(None, 0, bitwise_cfg, opt, every=3).persisted(j) for j in range(7)] == [
        False, False, False, True, False, True, False,
    ]  # fmt: skip
    bitwise = StateStore(tmp_path / "bitwise", chunk_bytes=4096, checkpoint_every=3)
    for j in (3, 5):  # what a bitwise host persisted: the same trajectory, fewer files
        for path in (full.find(c.leaves[j], 0), full.find(c.leaves[j], 0).with_suffix(".state.chunks")):
            target = bitwise.root / "0" / path.name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(path.read_bytes())

    def start() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        m, o = fresh(cfg)
        with torch.no_grad():
            for n, p in m.named_parameters():
                p.copy_(g0[n])
        return m, o

    segments = [0, 3, 5]  # opens boundaries 0, 1, 3, 4, 5, 6
    done = materialize_openings(dataclasses.replace(job, store=sparse), c.leaves, segments, start)
    assert done == [0, 1, 4]
    assert sorted(sparse.hashes(0)) == sorted({c.leaves[j] for j in (0, 1, 3, 4, 5, 6)})
    for j in (0, 1, 4):
        assert sparse.find(c.leaves[j], 0).read_bytes() == full.find(c.leaves[j], 0).read_bytes()

    segments = [1, 2, 5]  # bitwise: starts 1, 2 (recomputed from boundary 0) and 5 (persisted)
    bitwise_job = dataclasses.replace(job, config=bitwise_cfg, store=bitwise)
    done = materialize_openings(bitwise_job, c.leaves, segments, start)
    assert done == [1, 2]
    assert sorted(bitwise.hashes(0)) == sorted({c.leaves[j] for j in (1, 2, 5)})  # 3 went
    for j in (1, 2):
        assert bitwise.find(c.leaves[j], 0).read_bytes() == full.find(c.leaves[j], 0).read_bytes()


@pytest.mark.parametrize("spill", [0, 1 << 14, 1 << 30])
def test_live_boundary_hashes_and_writes_the_boundary_not_what_the_step_made_of_it(
    tmp_path: Path, spill: int
) -> None:
    """A live boundary lets the next step go once nothing reads the live tensors (the rest copied
    out, at most `spill` bytes, or waited for): the step then overwrites the state at once, and
    the leaf and the persisted file are still the boundary's own bytes."""
    g = torch.Generator().manual_seed(0)
    live = {f"param/{i}": torch.randn(3000, generator=g) for i in range(8)}
    want = {k: v.clone() for k, v in live.items()}
    store = StateStore(tmp_path / "s", chunk_bytes=4096)
    job = LiveBoundary(live, 4096, spill, None, SpillPool())
    job.sink = store.content.scratch(Kind.STATE, "0", job.total)
    with ThreadPoolExecutor(1) as worker:  # where the boundary worker runs it: off this thread
        fut = worker.submit(job.run)
        job.release()
        for v in live.values():  # the optimizer step, right after the release
            v.mul_(-3.0)
        digests = fut.result()
    h = chunks.content_hash(domain(StateKind.TRAINING), 4096, job.total, digests)
    assert h == tensor_hash(want, StateKind.TRAINING, 4096)
    store.content.commit(Kind.STATE, h, "0", job.sink, digests)
    assert all(torch.equal(store.get(h, 0)[k], want[k]) for k in want)
    assert job.copied <= spill


def test_live_boundaries_copy_into_one_reused_spill_buffer_and_still_hash_their_own_bytes() -> None:
    """The spill copies go into one buffer, faulted in once and reused by the next boundary (a new
    buffer's page faults cost ~5x the copy, on the training thread); reusing it never mixes one
    boundary's bytes into another's leaf; once the outer step ends, the buffer is freed."""
    g = torch.Generator().manual_seed(1)
    live = {f"param/{i}": torch.randn(3000, generator=g) for i in range(8)}
    pool = SpillPool()  # a `Boundaries`' own, for its outer step
    size = LiveBoundary(live, 4096, 1 << 30, None, pool).spill
    pool.warm(size)  # what `Boundaries` does at its first live boundary
    bufs, leaves = [], []
    for step in range(3):
        want = tensor_hash(live, StateKind.TRAINING, 4096)
        job = LiveBoundary(live, 4096, 1 << 30, None, pool)
        job.release()  # before any chunk is taken: the whole boundary is copied out
        assert job.copied == job.total and job._spill is not None
        bufs.append(job._spill.ready.result())
        for v in live.values():  # the step overwrites the live state before the chunks are hashed
            v.add_(float(step + 1))
        digests = job.run()
        assert job._spill is None  # given back once every chunk is done
        leaves.append(chunks.content_hash(domain(StateKind.TRAINING), 4096, job.total, digests))
        assert leaves[-1] == want
    assert bufs[0] is bufs[1] is bufs[2] and len(set(leaves)) == 3
    assert size in pool
    pool.cool(size)
    assert size not in pool  # freed: not held through reveal and aggregation


def test_a_second_boundary_waits_for_the_spill_buffer_instead_of_making_another() -> None:
    """One spill buffer per size and pool (an outer step's): a boundary whose release comes while the previous
    one's copies are still unread waits for them (memory stays bounded), and gets the buffer as
    soon as that boundary's chunks are done; both leaves are their own boundary's."""
    g = torch.Generator().manual_seed(2)
    live = {f"param/{i}": torch.randn(2000, generator=g) for i in range(6)}
    first_want = tensor_hash(live, StateKind.TRAINING, 4096)
    pool = SpillPool()
    first = LiveBoundary(live, 4096, 1 << 30, None, pool)
    first.release()  # everything copied out; its chunks not hashed yet
    for v in live.values():
        v.mul_(2.0)
    second_want = tensor_hash(live, StateKind.TRAINING, 4096)
    second = LiveBoundary(live, 4096, 1 << 30, None, pool)
    waiter = threading.Thread(target=second.release)
    waiter.start()
    waiter.join(0.3)
    assert waiter.is_alive()  # the buffer is lent to `first`: no second one is made
    digests = first.run()
    waiter.join(10)
    assert not waiter.is_alive() and second.copied == second.total
    for v in live.values():
        v.zero_()
    assert chunks.content_hash(domain(StateKind.TRAINING), 4096, first.total, digests) == first_want
    digests = second.run()
    assert chunks.content_hash(domain(StateKind.TRAINING), 4096, second.total, digests) == second_want
