"""The committed inner loop: H steps of `train_segment`, a trajectory leaf every k steps, then Δ.

Boundary work (hash the full training state on all cores, persist every m-th) runs on a worker
thread over the live state while the next step's forward and backward run; the training thread
waits only if the boundary is not done by that step's optimizer update, and no state is copied.
After the challenge, `materialize_openings` recomputes the opened boundaries that were not
persisted and deletes the rest. Everything a host later commits and reveals is in the returned `Contribution`.

A rank of a host with sharded training state (`trainer.sharded`, under `trainer.ddp`) runs the
same loop (`follow_committed` on ranks ≥ 1): each boundary is hashed collectively from every
rank's part and saved as per-rank shard files, so the leaves are the unsharded ones.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from nodekit.objects import Kind
from nodekit.store import FileSink, StateStore, StoredTensors, TensorSink
from protocol import chunks
from protocol.codecs import delta_hash, encode_pieces
from protocol.config import Codec, ReplayMode, RunConfig
from protocol.merkle import merkle_root, pair_proof
from protocol.messages import EnvFingerprint, MsgCommitPseudoGradient, SegmentOpening
from protocol.tensors import StateKind, canonical_pieces, domain, tensor_hash_and_digests
from replay.data import Corpus
from replay.device import host_view
from replay.model import lm_loss
from replay.step import (
    LossFn,
    SliceExchange,
    env_fingerprint,
    optimizer_state,
    snapshot_to_host,
    train_segment,
    training_state,
)
from trainer.sharded import ShardedState, ShardedStep


@dataclass(frozen=True)
class Contribution:
    """One host's outer step: what it commits now and what it can open later."""

    outer_step: int
    base_model_hash: str
    leaves: list[str]
    trajectory_root: str
    delta: dict[str, Tensor] = field(repr=False)
    payload: bytes = field(repr=False)
    delta_hash: str
    codec: Codec
    final_optimizer_hash: str
    tokens: int
    env: EnvFingerprint
    mean_loss: float
    losses: list[float] = field(repr=False)
    boundary_seconds: float = field(default=0.0, compare=False)
    """Time the training thread spent on boundaries (snapshots, waiting for the hasher/writer)."""
    boundary_waits: dict[str, float] = field(default_factory=dict, compare=False)
    """`boundary_seconds` by cause (`Boundaries.breakdown`)."""
    train_seconds: float = field(default=0.0, compare=False)
    """Time in the inner steps themselves (forward, backward, optimizer; boundary waits excluded)."""
    protocol_seconds: float = field(default=0.0, compare=False)
    """Everything else the training thread did for this outer step: loading G_n, boundary waits,
    encoding and hashing Δ, waiting for the last leaf and the optimizer hash."""
    optimizer_digests: tuple[bytes, ...] = field(default=(), compare=False, repr=False)
    """Chunk digests of the final optimizer state (so the node stores it without hashing again)."""

    @property
    def leaf_count(self) -> int:
        return len(self.leaves)

    def to_msg(self, creator: str, run_id: int) -> MsgCommitPseudoGradient:
        return MsgCommitPseudoGradient(
            creator=creator,
            run_id=run_id,
            outer_step=self.outer_step,
            base_model_hash=self.base_model_hash,
            trajectory_root=self.trajectory_root,
            leaf_count=self.leaf_count,
            delta_hash=self.delta_hash,
            final_optimizer_hash=self.final_optimizer_hash,
            codec=self.codec,
            tokens=self.tokens,
            env=self.env,
        )


def param_tensors(model: nn.Module) -> dict[str, Tensor]:
    """Parameters by name, as copies: the naming Δ and the global model use."""
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def pseudo_gradient(global_params: Mapping[str, Tensor], model: nn.Module) -> dict[str, Tensor]:
    """Δ = θ_global − θ_local (float32), name for name."""
    return {n: (global_params[n] - p.detach().to(global_params[n].device)).to(torch.float32)
            for n, p in model.named_parameters()}  # fmt: skip


def host_snapshot(
    model: nn.Module, opt: torch.optim.Optimizer, sharding: ShardedState | None = None
) -> tuple[Mapping[str, Tensor], bool]:
    """THE boundary snapshot: the training state as the boundary worker reads it (a sharded rank:
    its part), and whether it is the live state. On the CPU these are the live tensors themselves
    (no copy): only `opt.step` writes them, and `Boundaries` holds the next step until the
    boundary is hashed (and persisted). On a GPU it is `snapshot_to_host`: a copy into pinned host
    memory on a side stream (the next `opt.step` waits only for the copy, never for hashing or disk)."""
    state = sharding.local(model, opt) if sharding is not None else training_state(model, opt)
    if not any(t.is_cuda for t in state.values()):
        return state, True
    return snapshot_to_host(state, opt), False


WAIT_CAUSES = ("snapshot", "spill_wait", "copy", "reading_wait", "inflight", "last_leaf", "final_optimizer")
"""Where the training thread's boundary time goes (`Boundaries.breakdown`)."""


class _Spill:
    """The spill buffer of one size: faulted in once, off the training thread, then lent to one
    boundary at a time while any outer step of that size trains (`users`)."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes, self.lent, self.users = nbytes, False, 0
        self.ready: Future[Tensor] = Future()
        threading.Thread(target=self._fault, name="spill-fault", daemon=True).start()

    def _fault(self) -> None:
        try:  # zero-filled: every page touched here, by torch, which lets go of the GIL meanwhile
            self.ready.set_result(torch.zeros(self.nbytes, dtype=torch.uint8))  # (bytearray's holds it)
        except BaseException as e:  # MemoryError: re-raised by `take_spill`, where it is needed
            self.ready.set_exception(e)


_SPILLS: dict[int, _Spill] = {}  # size -> the buffer, while it is used
_SPILLS_COND = threading.Condition()


def _spill(nbytes: int) -> _Spill:
    spill = _SPILLS.get(nbytes)
    if spill is None:
        spill = _SPILLS[nbytes] = _Spill(nbytes)
    return spill


def _forget(spill: _Spill) -> None:
    if spill.users <= 0 and not spill.lent and _SPILLS.get(spill.nbytes) is spill:
        del _SPILLS[spill.nbytes]  # nothing of this size trains: its memory goes back


def warm_spill(nbytes: int) -> None:
    """An outer step will copy spills of `nbytes`: fault the buffer in now, off the training
    thread. A fresh buffer's first touch costs ~5x the copy into it (page faults: 0.44 s/GB against
    0.09 s/GB on this box) and the copy runs on the training thread, so it is made ahead and reused
    by every boundary of the step. It is the memory `release` may copy into anyway (a host's peak
    is while it trains); one per size, never more, so memory stays bounded."""
    with _SPILLS_COND:
        _spill(nbytes).users += 1


def cool_spill(nbytes: int) -> None:
    """The outer step that warmed it ended: with no other user the buffer is freed (it is not kept
    through reveal and aggregation, where other memory peaks)."""
    with _SPILLS_COND:
        spill = _SPILLS.get(nbytes)
        if spill is not None:
            spill.users -= 1
            _forget(spill)


def take_spill(nbytes: int) -> _Spill:
    """The spill buffer of `nbytes`, once the boundary that has it gave it back (`give_spill`).
    Never call it holding a lock the holder's chunks need: they must finish for it to come back."""
    with _SPILLS_COND:
        while (spill := _spill(nbytes)).lent:
            _SPILLS_COND.wait()
        spill.lent = True
    try:
        spill.ready.result()
    except BaseException:
        give_spill(spill)
        raise
    return spill


def give_spill(spill: _Spill) -> None:
    """Nobody reads the buffer any more: the next `take_spill` of its size gets it."""
    with _SPILLS_COND:
        spill.lent = False
        _forget(spill)
        _SPILLS_COND.notify_all()


def _spill_default(snap: Mapping[str, Tensor]) -> int:
    """A quarter of the state: what a live boundary may copy out at most (memory: the live state,
    its gradients and this), so a step waits for a short copy instead of the hashing and writing."""
    return sum(t.numel() * t.element_size() for t in snap.values()) // 4


class LiveBoundary:
    """One boundary read straight from the live CPU state: its chunks hashed (and, when it is
    persisted, written to a scratch file at their offsets) on the hash pool, in order.

    The next optimizer step must not change a byte still to be read. `release()` (that step's
    pre-hook) lets it go as soon as no chunk is read from the live tensors any more: the chunks not
    started yet are copied out (at most `spill` bytes of them: beyond that it waits for chunks to
    finish first), the chunks being read are waited for, and the rest of the work goes on from the
    copies while the step runs. So the training thread waits for a bounded copy, not for a whole
    boundary's hashing and writing; memory stays the live state plus `spill` bytes; the bytes
    hashed and written are the boundary's, whatever the step does after `release()` returns.
    """

    def __init__(
        self, snap: Mapping[str, Tensor], chunk_bytes: int, spill: int, sink: FileSink | None
    ) -> None:
        self.stream = chunks.Stream(canonical_pieces(snap))
        self.total = self.stream.total
        n = chunks.n_chunks(self.total, chunk_bytes)
        self.spans = [chunks.chunk_span(i, self.stream.total, chunk_bytes) for i in range(n)]
        self.spill, self.sink = min(spill, self.total), sink  # nothing to copy beyond the state
        self._cond = threading.Condition(threading.Lock())
        self._started = [False] * n  # chunk i taken by a pool thread (from the live state or a copy)
        self._copies: dict[int, memoryview] = {}
        self._spill: _Spill | None = None  # `take_spill`'s, while copies in it are unread
        self._reading = 0  # pool threads reading the live state right now
        self._next = 0  # every chunk below it was taken or copied
        self._released = False
        self.copied = 0  # bytes copied out by `release` (what the spill cost)
        self.waits = {"spill_wait": 0.0, "copy": 0.0, "reading_wait": 0.0}  # `release`'s seconds, by cause

    def _task(self, i: int) -> bytes:
        a, b = self.spans[i]
        with self._cond:
            self._started[i] = True
            copy = self._copies.pop(i, None)
            if copy is None:
                self._reading += 1
        try:
            data = [copy] if copy is not None else self.stream.read(a, b)
            digest = chunks.chunk_digest(data)
            if self.sink is not None:
                pos = a
                for piece in data:
                    self.sink.write_at(pos, piece)
                    pos += len(piece)
            return digest
        finally:
            if copy is None:
                with self._cond:
                    self._reading -= 1
                    self._cond.notify_all()

    def run(self) -> list[bytes]:
        """Every chunk's digest (on the boundary worker; the chunks on the hash pool)."""
        digests = list(chunks.hash_pool().map(self._task, range(len(self.spans))))
        with self._cond:  # every chunk is done: nothing reads the spill buffer any more
            spill, self._spill = self._spill, None
        if spill is not None:
            give_spill(spill)
        return digests

    def _todo(self) -> list[int]:
        """The chunks no pool thread took yet, once they are at most `spill` bytes (under the lock)."""
        while True:
            while self._next < len(self.spans) and self._started[self._next]:
                self._next += 1
            todo = [i for i in range(self._next, len(self.spans)) if not self._started[i]]
            if sum(self.spans[i][1] - self.spans[i][0] for i in todo) <= self.spill:
                return todo
            self._cond.wait()

    def release(self) -> None:
        """Return once nothing reads the live state any more (the training thread, before a step)."""
        t0 = time.perf_counter()
        buf: _Spill | None = None
        with self._cond:
            if self._released:
                return
            todo = self._todo()
        if todo:  # the spill buffer, taken without our lock: our chunks go on meanwhile, and the
            buf = take_spill(self.spill)  # boundary that still has it needs its own chunks to end
        with self._cond:
            todo = self._todo()  # the bytes fit in the buffer: at most `spill`
            t1 = time.perf_counter()
            if todo:
                assert buf is not None
                self._spill, buf = buf, None
                arena, at = memoryview(self._spill.ready.result().numpy()).cast("B"), 0
            for i in todo:  # a pool thread that takes one of these now finds its copy
                a, b = self.spans[i]
                view = arena[at : at + b - a]
                pos = 0
                for piece in self.stream.read(a, b):
                    view[pos : pos + len(piece)] = piece
                    pos += len(piece)
                self._copies[i] = view
                at += b - a
                self.copied += b - a
            t2 = time.perf_counter()
            while self._reading:
                self._cond.wait()
            self.waits["spill_wait"] += t1 - t0
            self.waits["copy"] += t2 - t1
            self.waits["reading_wait"] += time.perf_counter() - t2
            self._released = True
            self.stream = chunks.Stream([])  # no view of the live tensors is kept
        if buf is not None:  # taken, but every chunk started meanwhile: nothing to copy
            give_spill(buf)


class Boundaries:
    """Hash every boundary (all cores, `protocol.chunks`), persist every m-th and what is always
    opened (the last segment's start; its end, θ_H, only in tolerance mode, where verifiers
    compare claimed ends).

    At most one boundary is in flight, and none is ever copied on the CPU: the worker hashes the
    live state while the training thread runs the next step's forward and backward (which only
    write gradients), and an optimizer pre-step hook makes the training thread wait for the
    boundary before the step that would change it (backpressure, never a queue of snapshots).
    A GPU state is a host copy (`host_snapshot`): the next step waits only for the copy, and the
    next boundary for this one's hash and write. A persisted boundary holds the step only until
    its bytes are in the page cache; fsync and rename follow on the worker (`StateStore.pending`).
    The digests computed here are stored with the state, so it is never hashed again to be served.
    The last boundary's optimizer state is hashed on the worker too, while the training thread
    encodes Δ.
    """

    def __init__(
        self,
        store: StateStore | None,
        outer_step: int,
        cfg: RunConfig,
        opt: torch.optim.Optimizer,
        *,
        every: int = 1,
        sharding: ShardedState | None = None,
        spill: int | None = None,
    ) -> None:
        self.store, self.outer_step, self.cfg = store, outer_step, cfg
        self.every = max(1, every)
        self.spill = spill  # bytes a live boundary may copy out to let the next step go (`LiveBoundary`)
        self._release: Callable[[], None] | None = None
        self.copied = 0
        self.sharding = sharding  # every rank submits the same boundaries: their collectives pair up
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="boundary")
        self._futures: list[Future[tuple[str, list[bytes] | None]]] = []
        self._final_opt: Future[tuple[str, list[bytes] | None]] | None = None
        self._inflight: Future[Any] | None = None
        self._live = True  # the in-flight boundary reads the live state: the next update waits for it
        self._hook = opt.register_step_pre_hook(lambda *_: self._settle(in_step=True) if self._live else None)
        self.waits: dict[str, float] = dict.fromkeys(WAIT_CAUSES, 0.0)  # by cause; `release` keeps its own
        self._live_jobs: list[LiveBoundary] = []
        self._spills: set[int] = set()  # spill sizes this step warmed (`warm_spill`), cooled at the end
        self.step_seconds = 0.0  # the part of it spent inside optimizer steps (the pre-step hook)

    def persisted(self, j: int) -> bool:
        """Boundary j goes to disk: every m-th, the last segment's start (always opened) and, in
        tolerance mode, its end θ_H (verifiers fetch claimed ends there; in bitwise mode nobody
        does: the replay reproduces it). With m > 1 boundary 0 is not written: it is G_n and the
        carried optimizer state, both on disk already (`materialize_openings` rebuilds it)."""
        n = self.cfg.n_segments
        if j == n:
            return self.cfg.replay_mode is ReplayMode.TOLERANCE
        return j == n - 1 or (j % self.every == 0 and (j > 0 or self.every == 1))

    def _settle(self, in_step: bool = False) -> None:
        if self._inflight is not None or self._release is not None:
            t0 = time.perf_counter()
            try:
                if self._release is not None:
                    self._release()
                t1 = time.perf_counter()
                if self._inflight is not None:
                    self._inflight.result()
                self.waits["inflight"] += time.perf_counter() - t1
            finally:
                self._inflight = self._release = None
                if in_step:
                    self.step_seconds += time.perf_counter() - t0

    def submit(self, model: nn.Module, opt: torch.optim.Optimizer) -> None:
        self._settle()
        t0 = time.perf_counter()
        j = len(self._futures)
        snap, self._live = host_snapshot(model, opt, self.sharding)
        # the one-pass path writes a persisted boundary to a content-store scratch file; a store
        # without one (the simulator's in-memory `MemStore`) takes the copy path below
        if self._live and self.sharding is None and (self.store is None or hasattr(self.store, "content")):
            self._submit_live(j, snap)
            self.waits["snapshot"] += time.perf_counter() - t0
            return
        hashed = self._pool.submit(self._hash, snap)
        self._futures.append(hashed)
        self._inflight = hashed
        if j == self.cfg.n_segments and self.sharding is None:  # the carried optimizer state's hash,
            final_opt = optimizer_state(dict(snap))  # on the worker while Δ is encoded
            self._final_opt = self._pool.submit(self._hash, final_opt, StateKind.OPTIMIZER)
            self._inflight = self._final_opt
        if self.store is not None and self.persisted(j):
            released: Future[None] = Future()
            written = self._pool.submit(self._write, hashed, snap, released)  # same worker: after the hash
            self.store.pending.append(written)  # durable before anyone reads the store (store.flush)
            self._inflight = released  # the next optimizer step waits for the bytes, not the fsync
        self.waits["snapshot"] += time.perf_counter() - t0

    def _submit_live(self, j: int, snap: Mapping[str, Tensor]) -> None:
        """A boundary of the live CPU state (`LiveBoundary`): hashed and, if persisted, written in
        one pass on the hash pool; the next step waits only until no chunk is read from the live
        tensors (a copy of at most `spill` bytes of what is left)."""
        c = self.cfg.state_chunk_bytes
        spill = self.spill if self.spill is not None else max(c, _spill_default(snap))
        job = LiveBoundary(snap, c, spill, None)
        if job.spill not in self._spills:  # faulted in during this first boundary's hashing
            self._spills.add(job.spill)
            warm_spill(job.spill)
        self._live_jobs.append(job)
        persisted = self.store is not None and self.persisted(j)
        if persisted:
            assert self.store is not None
            job.sink = self.store.content.scratch(Kind.STATE, str(self.outer_step), job.total)
        sink = job.sink
        hashed: Future[tuple[str, list[bytes] | None]] = Future()

        def work() -> None:
            try:
                digests = job.run()
                h = chunks.content_hash(domain(StateKind.TRAINING), c, job.total, digests)
            except BaseException as e:
                if sink is not None:
                    assert self.store is not None
                    self.store.content.abort(sink)
                hashed.set_exception(e)
                raise
            finally:
                self.copied += job.copied
            hashed.set_result((h, digests))
            if sink is not None:
                assert self.store is not None
                content, group = self.store.content, str(self.outer_step)
                if content.has(Kind.STATE, h, group):
                    content.abort(sink)
                else:
                    content.commit(Kind.STATE, h, group, sink, digests)

        done = self._pool.submit(work)
        if j == self.cfg.n_segments:  # the carried optimizer state's hash, on the worker while Δ is
            opt_state = optimizer_state(dict(snap))  # encoded (nothing steps the state any more)
            self._final_opt = self._pool.submit(self._hash, opt_state, StateKind.OPTIMIZER)
        if persisted:
            assert self.store is not None
            self.store.pending.append(done)  # durable before anyone reads the store (store.flush)
        self._futures.append(hashed)
        self._release = job.release

    def _hash(
        self, snap: Mapping[str, Tensor], kind: StateKind = StateKind.TRAINING
    ) -> tuple[str, list[bytes] | None]:
        if self.sharding is not None:
            return self.sharding.hash(snap, kind, self.cfg.state_chunk_bytes)
        return tensor_hash_and_digests(snap, kind, self.cfg.state_chunk_bytes)

    def _write(
        self,
        hashed: Future[tuple[str, list[bytes] | None]],
        snap: Mapping[str, Tensor],
        released: Future[None],
    ) -> None:
        assert self.store is not None
        durable: Callable[[], None] = lambda: None  # noqa: E731
        try:
            h, digests = hashed.result()
            if self.sharding is not None:
                group = str(self.outer_step)
                self.sharding.save(self.store.content, StateKind.TRAINING, group, h, digests, snap)
            else:
                assert digests is not None
                durable = self.store.stage_hashed(snap, self.outer_step, h, digests)
        except BaseException as e:
            released.set_exception(e)
            raise
        released.set_result(None)
        durable()

    def optimizer(
        self, model: nn.Module, opt: torch.optim.Optimizer, keep: str | None
    ) -> Future[tuple[str, list[bytes] | None]]:
        """A sharded rank's final optimizer state: hashed collectively on the boundary worker (after
        the last boundary: one order of collectives on every rank), saved in content group `keep`."""
        assert self.sharding is not None
        sharding = self.sharding
        snap = host_view(sharding.local(model, opt, StateKind.OPTIMIZER))  # CPU: live (nothing steps it now)

        def run() -> tuple[str, list[bytes] | None]:
            h, digests = sharding.hash(snap, StateKind.OPTIMIZER, self.cfg.state_chunk_bytes)
            if keep is not None and self.store is not None:
                sharding.save(self.store.content, StateKind.OPTIMIZER, keep, h, digests, snap)
            return h, digests

        return self._pool.submit(run)

    def leaves(self) -> list[str]:
        """The leaves, once hashed: writes may still run (off the training thread, before the
        commit is needed); `StateStore.flush` waits for them."""
        t0 = time.perf_counter()
        try:
            return [f.result()[0] for f in self._futures]
        finally:
            self._inflight = self._release = None
            self._hook.remove()
            self._pool.shutdown(wait=False)  # queued writes still run
            for nbytes in self._spills:  # the last copies were read: every leaf is hashed
                cool_spill(nbytes)
            self._spills.clear()
            self.waits["last_leaf"] += time.perf_counter() - t0

    def final_optimizer(self) -> tuple[str, list[bytes] | None]:
        """The last boundary's optimizer state (unsharded): (hash, chunk digests)."""
        assert self._final_opt is not None, "the last boundary was not submitted"
        t0 = time.perf_counter()
        try:
            return self._final_opt.result()
        finally:
            self.waits["final_optimizer"] += time.perf_counter() - t0

    @property
    def seconds(self) -> float:
        """The training thread's time on boundaries (snapshots, waits): the sum of `breakdown`."""
        return sum(self.breakdown().values())

    def breakdown(self) -> dict[str, float]:
        """`seconds` by cause (the live boundaries' `release` split into its parts): where the
        training thread waited, for the benchmark that sizes the spill and the pools."""
        out = dict(self.waits)
        for job in self._live_jobs:
            for k, v in job.waits.items():
                out[k] += v
        return {k: round(v, 4) for k, v in out.items()}


def delta_items(global_params: Mapping[str, Tensor], model: nn.Module) -> Iterator[tuple[str, Tensor]]:
    """Δ = θ_global − θ_local (float32) one tensor at a time, in name order: what `encode_pieces`
    takes, so no fp32 Δ of the whole model is ever held (a stored G_n is read in one pass)."""
    params = dict(model.named_parameters())
    fresh = isinstance(global_params, StoredTensors)  # each read a new tensor: Δ is computed in it
    for n in sorted(params):
        g = global_params[n]
        if fresh and g.dtype == torch.float32:
            yield n, g.sub_(params[n].detach().to(g.device))  # the same op, no second tensor
        else:
            yield n, (g - params[n].detach().to(g.device)).to(torch.float32)


def load_params(model: nn.Module, global_params: Mapping[str, Tensor]) -> None:
    """G_n's parameters into the model, in name order: one pass over a G_n read from disk."""
    named = dict(model.named_parameters())
    read_into = global_params.read_into if isinstance(global_params, StoredTensors) else None
    with torch.no_grad():
        for n in sorted(named):
            p = named[n]
            if read_into is not None and p.device.type == "cpu" and p.is_contiguous():
                read_into(n, p)  # from the verified chunks straight into the parameter
            else:
                p.copy_(global_params[n])


@dataclass
class _Trajectory:
    leaves: list[str]
    losses: list[float]
    boundary_seconds: float
    boundary_waits: dict[str, float]
    train_seconds: float
    optimizer_hash: str
    optimizer_digests: list[bytes] | None
    out: Any


def _trajectory(
    model: nn.Module,
    opt: torch.optim.Optimizer,
    cfg: RunConfig,
    data: Corpus,
    host: str,
    outer_step: int,
    global_params: Mapping[str, Tensor],
    store: StateStore | None,
    micro_batches: int,
    loss_fn: LossFn,
    exchange: SliceExchange | ShardedStep | None,
    sharding: ShardedState | None,
    keep_optimizer: str | None,
    after: Callable[[], Any],
) -> _Trajectory:
    """The loop every rank runs: boundaries and segments; then `after()` (rank 0's Δ, encoded
    while the last boundary and the final optimizer state are hashed)."""
    if store is not None:
        store.flush()  # the previous step's last boundary is written from these very tensors
    load_params(model, global_params)
    k = cfg.segment_len
    losses: list[float] = []
    every = store.checkpoint_every if store is not None else 1
    boundaries = Boundaries(store, outer_step, cfg, opt, every=every, sharding=sharding)
    final_opt: Future[tuple[str, list[bytes] | None]] | None = None
    steps_s = 0.0
    try:
        for seg in range(cfg.n_segments + 1):
            boundaries.submit(model, opt)
            if seg < cfg.n_segments:
                t0 = time.perf_counter()
                losses += train_segment(
                    model, opt, cfg, data, host, outer_step, seg * k, k, micro_batches,
                    loss_fn=loss_fn, exchange=exchange,
                )  # fmt: skip
                steps_s += time.perf_counter() - t0
        if sharding is not None:
            final_opt = boundaries.optimizer(model, opt, keep_optimizer)
        out = after()
    finally:
        leaves = boundaries.leaves()
    opt_hash, opt_digests = final_opt.result() if final_opt is not None else boundaries.final_optimizer()
    train_s = steps_s - boundaries.step_seconds
    return _Trajectory(
        leaves, losses, boundaries.seconds, boundaries.breakdown(), train_s, opt_hash, opt_digests, out
    )


def run_committed(
    model: nn.Module,
    opt: torch.optim.Optimizer,
    cfg: RunConfig,
    data: Corpus,
    host: str,
    outer_step: int,
    global_params: Mapping[str, Tensor],
    base_model_hash: str,
    store: StateStore | None = None,
    *,
    micro_batches: int = 1,
    loss_fn: LossFn = lm_loss,
    exchange: SliceExchange | ShardedStep | None = None,
    sharding: ShardedState | None = None,
    keep_optimizer: str | None = None,
    keep_delta: bool = True,
) -> Contribution:
    """Train one outer step from the global params with the host's carried optimizer state.

    The store's `checkpoint_every` (m, a host setting) says which boundaries are persisted; the
    others are recomputed from the nearest persisted one if the challenge opens them
    (`materialize_openings`). With `sharding` (rank 0 of a sharded host; the others run
    `follow_committed`) the final optimizer state is also saved, in content group `keep_optimizer`.
    `global_params` may be read from disk (`StoredTensors`): it is read once at the start and once,
    tensor by tensor, for Δ. Without `keep_delta` the returned contribution has no fp32 Δ
    (`delta == {}`), only its payload: the honest node needs nothing else, and Δ is never held whole."""
    t_start = time.perf_counter()

    def delta() -> tuple[dict[str, Tensor], bytes]:
        layout = {n: tuple(p.shape) for n, p in model.named_parameters()}
        pieces = encode_pieces(delta_items(global_params, model), layout, cfg.codec, cfg.codec_block_size)
        payload = b"".join(pieces)
        del pieces
        return (pseudo_gradient(global_params, model) if keep_delta else {}), payload

    t = _trajectory(
        model, opt, cfg, data, host, outer_step, global_params, store, micro_batches, loss_fn, exchange,
        sharding, keep_optimizer, delta,
    )  # fmt: skip
    d, payload = t.out
    return Contribution(
        outer_step=outer_step,
        base_model_hash=base_model_hash,
        leaves=t.leaves,
        trajectory_root=merkle_root([bytes.fromhex(h) for h in t.leaves]).hex(),
        delta=d,
        payload=payload,
        delta_hash=delta_hash(payload, cfg.state_chunk_bytes),
        codec=cfg.codec,
        final_optimizer_hash=t.optimizer_hash,
        tokens=cfg.tokens_per_outer_step,
        env=env_fingerprint(micro_batches=micro_batches),
        mean_loss=sum(t.losses) / len(t.losses),
        losses=t.losses,
        boundary_seconds=t.boundary_seconds,
        boundary_waits=t.boundary_waits,
        train_seconds=t.train_seconds,
        protocol_seconds=time.perf_counter() - t_start - t.train_seconds,
        optimizer_digests=tuple(t.optimizer_digests or ()),
    )


def follow_committed(
    model: nn.Module,
    opt: torch.optim.Optimizer,
    cfg: RunConfig,
    data: Corpus,
    host: str,
    outer_step: int,
    global_params: Mapping[str, Tensor],
    store: StateStore | None,
    *,
    exchange: ShardedStep,
    sharding: ShardedState,
    loss_fn: LossFn = lm_loss,
    keep_optimizer: str | None = None,
) -> list[str]:
    """A rank ≥ 1 of a sharded host in rank 0's `run_committed`: the same boundaries (its part of
    each hash, its shard files) and steps; no Δ. Returns the leaves (every rank learns them)."""
    return _trajectory(
        model, opt, cfg, data, host, outer_step, global_params, store, exchange.world_size, loss_fn,
        exchange, sharding, keep_optimizer, lambda: None,
    ).leaves  # fmt: skip


def _save_recomputed(
    store: StateStore,
    outer_step: int,
    leaves: Sequence[str],
    j: int,
    model: nn.Module,
    opt: torch.optim.Optimizer,
    cfg: RunConfig,
    sharding: ShardedState | None = None,
) -> None:
    """Hash the recomputed boundary j, check it is the committed leaf, and persist it (a sharded
    rank: its part; every rank learns the hash, so all of them refuse a wrong one together)."""
    if sharding is not None:
        local = host_view(sharding.local(model, opt))
        h, digests = sharding.hash(local, StateKind.TRAINING, cfg.state_chunk_bytes)
    else:
        snap = training_state(model, opt)
        h, digests = tensor_hash_and_digests(snap, StateKind.TRAINING, cfg.state_chunk_bytes)
    if h != leaves[j]:
        raise ValueError(f"recomputed boundary {j} hashes to {h[:12]}, committed {leaves[j][:12]}")
    if sharding is not None:
        sharding.save(store.content, StateKind.TRAINING, str(outer_step), h, digests, local)
    else:
        store.put_hashed(snap, outer_step, h, digests)


def load_stored_state(
    store: StateStore, outer_step: int, leaf: str, model: nn.Module, opt: torch.optim.Optimizer
) -> None:
    """A persisted boundary read from disk straight into the model's and optimizer's own tensors
    (each chunk verified on the way, the header compared with the model's layout): no second
    training state in memory."""
    store.flush()
    live = training_state(model, opt)
    store.content.load_into(Kind.STATE, leaf, TensorSink(tensors=live), str(outer_step))
    for p in model.parameters():  # every parameter carries its own step counter
        opt.state[p]["step"].copy_(live["step"])


def needed_boundaries(segments: Sequence[int], mode: ReplayMode = ReplayMode.TOLERANCE) -> set[int]:
    """The boundaries a host keeps after the challenge: what a verifier may fetch. Tolerance mode:
    both ends of every sampled segment (claimed ends are compared). Bitwise mode: the starts,
    except segment 0's (G_n + the carried optimizer state, which verifiers rebuild); an end is
    never fetched there, the replay reproduces it (a mismatch is REPLAY_MISMATCH either way)."""
    if mode is ReplayMode.BITWISE:
        return {s for s in segments if s > 0}
    return {j for s in segments for j in (s, s + 1)}


@dataclass(frozen=True)
class OpeningPlan:
    """What `materialize_openings` will do: recompute `missing` from the persisted `on_disk`, then
    drop `sources` that are not needed themselves. Plain data: a sharded host sends it to its ranks."""

    needed: tuple[int, ...]
    on_disk: tuple[int, ...]
    missing: tuple[int, ...]
    sources: tuple[int, ...]

    def to_json(self) -> dict[str, list[int]]:
        return {k: list(getattr(self, k)) for k in ("needed", "on_disk", "missing", "sources")}

    @classmethod
    def from_json(cls, d: Mapping[str, Sequence[int]]) -> OpeningPlan:
        return cls(*(tuple(int(x) for x in d[k]) for k in ("needed", "on_disk", "missing", "sources")))


def plan_openings(
    store: StateStore,
    outer_step: int,
    leaves: Sequence[str],
    segments: Sequence[int],
    mode: ReplayMode = ReplayMode.TOLERANCE,
) -> OpeningPlan:
    """Decide what to recompute (`needed_boundaries` in the run's replay mode) and delete, at once,
    every persisted boundary that is neither needed nor the nearest source of a needed one."""
    store.flush()  # the last boundaries may still be being written
    needed = needed_boundaries(segments, mode)
    on_disk = {j for j, h in enumerate(leaves) if store.has(h, outer_step)}
    missing = sorted(needed - on_disk)
    sources = {max((q for q in on_disk if q <= j), default=0) for j in missing}
    keep = {leaves[j] for j in needed | sources}  # leaves may repeat (a host that did not train)
    for h in {leaves[j] for j in on_disk} - keep:
        store.delete(h, outer_step)
    return OpeningPlan(tuple(sorted(needed)), tuple(sorted(on_disk)), tuple(missing), tuple(sorted(sources)))


def recompute_openings(
    plan: OpeningPlan,
    store: StateStore,
    outer_step: int,
    leaves: Sequence[str],
    start: Callable[[], tuple[nn.Module, torch.optim.Optimizer]],
    cfg: RunConfig,
    data: Corpus,
    host: str,
    *,
    micro_batches: int = 1,
    loss_fn: LossFn = lm_loss,
    exchange: ShardedStep | None = None,
    sharding: ShardedState | None = None,
) -> list[int]:
    """Each missing opened boundary, recomputed bitwise from the nearest persisted one below it
    (boundary 0: `start()` rebuilds it from G_n and the carried optimizer) with the same step
    function, checked against its committed leaf, and saved. Every rank of a sharded host runs
    this with the same plan (its part of every load, step, hash and save)."""
    k = cfg.segment_len
    on_disk = set(plan.on_disk)
    done: list[int] = []
    at: int | None = None  # the boundary the model currently holds
    model: nn.Module | None = None
    opt: torch.optim.Optimizer | None = None
    for j in plan.missing:
        src = max((q for q in on_disk | set(done) if q <= j), default=0)  # 0: rebuilt by `start`
        if at is None or at > j or at < src:
            model = opt = None  # the previous optimizer goes before `start` makes the next
            model, opt = start()  # boundary 0; a persisted source is read over it, in place
            if src in on_disk or src in done:
                if sharding is not None:
                    sharding.load(store.content, StateKind.TRAINING, leaves[src], str(outer_step), model, opt)
                else:
                    load_stored_state(store, outer_step, leaves[src], model, opt)
            at = src
        assert model is not None and opt is not None
        while at < j:
            train_segment(
                model, opt, cfg, data, host, outer_step, at * k, k, micro_batches,
                loss_fn=loss_fn, exchange=exchange,
            )  # fmt: skip
            at += 1
            if at in plan.needed and at not in on_disk and at not in done and at != j:
                _save_recomputed(store, outer_step, leaves, at, model, opt, cfg, sharding)
                done.append(at)
        _save_recomputed(store, outer_step, leaves, j, model, opt, cfg, sharding)
        done.append(j)
    return done


def drop_sources(store: StateStore, outer_step: int, leaves: Sequence[str], plan: OpeningPlan) -> None:
    """The persisted sources that were only kept to recompute from."""
    for h in {leaves[j] for j in set(plan.sources) - set(plan.needed)} - {leaves[j] for j in plan.needed}:
        store.delete(h, outer_step)


def materialize_openings(
    store: StateStore,
    outer_step: int,
    leaves: Sequence[str],
    segments: Sequence[int],
    start: Callable[[], tuple[nn.Module, torch.optim.Optimizer]],
    cfg: RunConfig,
    data: Corpus,
    host: str,
    *,
    micro_batches: int = 1,
    loss_fn: LossFn = lm_loss,
) -> list[int]:
    """After the challenge: every boundary a verifier may fetch on disk (`needed_boundaries`),
    nothing else.

    Persisted boundaries that are neither opened nor the nearest source of an opened one go at
    once; each missing opened boundary is recomputed (`recompute_openings`); then the sources go.
    Returns the boundaries that were recomputed. Raises `ValueError` if a recomputed state does
    not hash to its leaf (the host could not reproduce its own trajectory).
    """
    plan = plan_openings(store, outer_step, leaves, segments, cfg.replay_mode)
    done = recompute_openings(
        plan, store, outer_step, leaves, start, cfg, data, host, micro_batches=micro_batches, loss_fn=loss_fn
    )
    drop_sources(store, outer_step, leaves, plan)
    return done


def openings(contribution: Contribution, segments: Sequence[int]) -> list[SegmentOpening]:
    """Both ends of each sampled segment with one pair proof against the trajectory root."""
    raw = [bytes.fromhex(h) for h in contribution.leaves]
    out = []
    for s in segments:
        if not 0 <= s < len(raw) - 1:
            raise ValueError(f"segment {s} outside 0..{len(raw) - 2}")
        proof = [p.hex() for p in pair_proof(raw, s)]
        out.append(
            SegmentOpening(
                segment=s, start_leaf=contribution.leaves[s], end_leaf=contribution.leaves[s + 1], proof=proof
            )
        )
    return out
