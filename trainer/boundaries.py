"""Boundary work off the training thread: every k steps the full training state is hashed on all
cores (and every m-th one persisted) from the live tensors while the next step's forward and
backward run; the training thread waits only if that is not done by the next optimizer update.
GPU states go through a pinned host copy; live CPU boundaries let the next step go by copying what
is left of them into a spill buffer, lent from the outer step's pool of one buffer per size.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch
from torch import Tensor, nn

from nodekit.objects import Kind
from nodekit.statestore import StateStore
from nodekit.store import FileSink
from protocol import chunks
from protocol.config import ReplayMode, RunConfig
from protocol.tensors import StateKind, canonical_pieces, domain, tensor_hash_and_digests
from replay.device import host_view
from replay.step import (
    optimizer_state,
    snapshot_to_host,
    training_state,
)
from trainer.sharded import ShardedState


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
        except BaseException as e:  # MemoryError: re-raised by `SpillPool.take`, where it is needed
            self.ready.set_exception(e)


class SpillPool:
    """The spill buffers of one outer step's live boundaries (`Boundaries` owns one): one per size,
    never more, so memory stays bounded; a boundary that finds its size lent waits for it.

    `warm` says an outer step will copy spills of `nbytes`: the buffer is faulted in now, off the
    training thread. A fresh buffer's first touch costs ~5x the copy into it (page faults: 0.44 s/GB
    against 0.09 s/GB on this box) and the copy runs on the training thread, so it is made ahead and
    reused by every boundary of the step. It is the memory `release` may copy into anyway (a host's
    peak is while it trains). `cool`: the step ended; with no other user the buffer is freed (it is
    not kept through reveal and aggregation, where other memory peaks)."""

    def __init__(self) -> None:
        self._spills: dict[int, _Spill] = {}  # size -> the buffer, while it is used
        self._cond = threading.Condition()

    def __contains__(self, nbytes: int) -> bool:
        with self._cond:
            return nbytes in self._spills

    def _spill(self, nbytes: int) -> _Spill:
        spill = self._spills.get(nbytes)
        if spill is None:
            spill = self._spills[nbytes] = _Spill(nbytes)
        return spill

    def _forget(self, spill: _Spill) -> None:
        if spill.users <= 0 and not spill.lent and self._spills.get(spill.nbytes) is spill:
            del self._spills[spill.nbytes]  # nothing of this size trains: its memory goes back

    def warm(self, nbytes: int) -> None:
        with self._cond:
            self._spill(nbytes).users += 1

    def cool(self, nbytes: int) -> None:
        with self._cond:
            spill = self._spills.get(nbytes)
            if spill is not None:
                spill.users -= 1
                self._forget(spill)

    def take(self, nbytes: int) -> _Spill:
        """The spill buffer of `nbytes`, once the boundary that has it gave it back (`give`).
        Never call it holding a lock the holder's chunks need: they must finish for it to come back."""
        with self._cond:
            while (spill := self._spill(nbytes)).lent:
                self._cond.wait()
            spill.lent = True
        try:
            spill.ready.result()
        except BaseException:
            self.give(spill)
            raise
        return spill

    def give(self, spill: _Spill) -> None:
        """Nobody reads the buffer any more: the next `take` of its size gets it."""
        with self._cond:
            spill.lent = False
            self._forget(spill)
            self._cond.notify_all()


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
        self, snap: Mapping[str, Tensor], chunk_bytes: int, spill: int, sink: FileSink | None, pool: SpillPool
    ) -> None:
        self.stream = chunks.Stream(canonical_pieces(snap))
        self.total = self.stream.total
        n = chunks.n_chunks(self.total, chunk_bytes)
        self.spans = [chunks.chunk_span(i, self.stream.total, chunk_bytes) for i in range(n)]
        self.spill, self.sink = min(spill, self.total), sink  # nothing to copy beyond the state
        self.pool = pool  # where the spill buffer of `spill` bytes is lent from
        self._cond = threading.Condition(threading.Lock())
        self._started = [False] * n  # chunk i taken by a pool thread (from the live state or a copy)
        self._copies: dict[int, memoryview] = {}
        self._spill: _Spill | None = None  # `pool.take`'s, while copies in it are unread
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
            self.pool.give(spill)
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
            buf = self.pool.take(self.spill)  # boundary that still has it needs its own chunks to end
        with self._cond:
            todo = self._todo()  # the bytes fit in the buffer: at most `spill`
            t1 = time.perf_counter()
            if todo:
                assert buf is not None
                self._spill, buf = buf, None
                arena, at = self._spill.ready.result().numpy().data.cast("B"), 0
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
            self.pool.give(buf)


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
        spills: SpillPool | None = None,
    ) -> None:
        self.store, self.outer_step, self.cfg = store, outer_step, cfg
        self.every = max(1, every)
        self.spill = spill  # bytes a live boundary may copy out to let the next step go (`LiveBoundary`)
        self.spills = spills if spills is not None else SpillPool()  # this step's spill buffers
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
        self._warmed: set[int] = set()  # spill sizes this step warmed (`SpillPool.warm`), cooled at the end
        self.step_seconds = 0.0  # the part of it spent inside optimizer steps (the pre-step hook)

    def persisted(self, j: int) -> bool:
        """Boundary j goes to disk: every m-th, and what is always fetched. Sampling windows: θ_H,
        the last boundary (every checker whose window ends short of it fetches its parameters).
        Sampling segments: the last segment's start (always opened) and, in tolerance mode, its end
        θ_H (verifiers fetch claimed ends there; in bitwise mode nobody does: the replay
        reproduces it). With m > 1 boundary 0 is not written: it is G_n and the carried optimizer
        state, both on disk already (`materialize_openings` rebuilds it)."""
        n = self.cfg.n_segments
        if self.cfg.windowed and j in (n - 1, n):
            return j == n or j % self.every == 0
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
        job = LiveBoundary(snap, c, spill, None, self.spills)
        if job.spill not in self._warmed:  # faulted in during this first boundary's hashing
            self._warmed.add(job.spill)
            self.spills.warm(job.spill)
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
            for nbytes in self._warmed:  # the last copies were read: every leaf is hashed
                self.spills.cool(nbytes)
            self._warmed.clear()
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
