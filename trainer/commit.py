"""The committed inner loop: H steps of `train_segment`, a trajectory leaf every k steps, then Δ.

Boundary work (hash the full training state on all cores, persist every m-th) runs on a worker
thread over the live state while the next step's forward and backward run; the training thread
waits only if the boundary is not done by that step's optimizer update, and no state is copied.
After the challenge, `materialize_openings` recomputes the opened boundaries that were not
persisted and deletes the rest. Everything a host later commits and reveals is in the returned `Contribution`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from nodekit.objects import Kind
from nodekit.store import StateStore, TensorSink
from protocol.codecs import delta_hash, encode_pieces
from protocol.config import Codec, ReplayMode, RunConfig
from protocol.merkle import merkle_root, pair_proof
from protocol.messages import EnvFingerprint, MsgCommitPseudoGradient, SegmentOpening
from protocol.tensors import StateKind, tensor_hash_and_digests
from trainer.data import Corpus
from trainer.model import lm_loss
from trainer.step import (
    LossFn,
    SliceExchange,
    env_fingerprint,
    optimizer_state,
    train_segment,
    training_state,
)


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
    return {n: (global_params[n] - p.detach()).to(torch.float32) for n, p in model.named_parameters()}


def host_snapshot(model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, Tensor]:
    """THE boundary snapshot: the training state as the boundary worker reads it. On the CPU these
    are the live tensors themselves (no copy): only `opt.step` writes them, and `Boundaries` holds
    the next step until the boundary is hashed (and persisted). The one place a device backend
    changes: a GPU host returns a copy in (pinned) host memory here."""
    return training_state(model, opt)


class Boundaries:
    """Hash every boundary (all cores, `protocol.chunks`), persist every m-th and what is always
    opened (the last segment's start; its end, θ_H, only in tolerance mode, where verifiers
    compare claimed ends).

    At most one boundary is in flight, and none is ever copied on the CPU: the worker hashes the
    live state while the training thread runs the next step's forward and backward (which only
    write gradients), and an optimizer pre-step hook makes the training thread wait for the
    boundary before the step that would change it (backpressure, never a queue of snapshots). A
    persisted boundary holds the step only until its bytes are in the page cache; fsync and rename
    follow on the worker (`StateStore.pending`). The digests computed here are stored with the
    state, so it is never hashed again to be served. The last boundary's optimizer state is
    hashed on the worker too, while the training thread encodes Δ.
    """

    def __init__(
        self,
        store: StateStore | None,
        outer_step: int,
        cfg: RunConfig,
        opt: torch.optim.Optimizer,
        *,
        every: int = 1,
    ) -> None:
        self.store, self.outer_step, self.cfg = store, outer_step, cfg
        self.every = max(1, every)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="boundary")
        self._futures: list[Future[tuple[str, list[bytes]]]] = []
        self._optimizer: Future[tuple[str, list[bytes]]] | None = None
        self._inflight: Future[Any] | None = None
        self._hook = opt.register_step_pre_hook(lambda *_: self._settle(in_step=True))
        self.seconds = 0.0  # the training thread's time on boundaries (snapshots, waits)
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
        if self._inflight is not None:
            t0 = time.perf_counter()
            try:
                self._inflight.result()
            finally:
                self._inflight = None
                waited = time.perf_counter() - t0
                self.seconds += waited
                if in_step:
                    self.step_seconds += waited

    def submit(self, model: nn.Module, opt: torch.optim.Optimizer) -> None:
        self._settle()
        t0 = time.perf_counter()
        j = len(self._futures)
        snap = host_snapshot(model, opt)
        hashed = self._pool.submit(self._hash, snap, StateKind.TRAINING)
        self._futures.append(hashed)
        self._inflight = hashed
        if j == self.cfg.n_segments:  # the carried optimizer state's hash, while Δ is encoded
            self._optimizer = self._pool.submit(self._hash, optimizer_state(snap), StateKind.OPTIMIZER)
            self._inflight = self._optimizer
        if self.store is not None and self.persisted(j):
            released: Future[None] = Future()
            written = self._pool.submit(self._write, hashed, snap, released)  # same worker: after the hash
            self.store.pending.append(written)  # durable before anyone reads the store (store.flush)
            self._inflight = released  # the next optimizer step waits for the bytes, not the fsync
        self.seconds += time.perf_counter() - t0

    def _hash(self, tensors: dict[str, Tensor], kind: StateKind) -> tuple[str, list[bytes]]:
        return tensor_hash_and_digests(tensors, kind, self.cfg.state_chunk_bytes)

    def _write(
        self, hashed: Future[tuple[str, list[bytes]]], snap: dict[str, Tensor], released: Future[None]
    ) -> None:
        assert self.store is not None
        try:
            h, digests = hashed.result()
            durable = self.store.stage_hashed(snap, self.outer_step, h, digests)
        except BaseException as e:
            released.set_exception(e)
            raise
        released.set_result(None)
        durable()

    def leaves(self) -> list[str]:
        """The leaves, once hashed: writes may still run (off the training thread, before the
        commit is needed); `StateStore.flush` waits for them."""
        t0 = time.perf_counter()
        try:
            return [f.result()[0] for f in self._futures]
        finally:
            self._inflight = None
            self._hook.remove()
            self._pool.shutdown(wait=False)  # queued writes still run
            self.seconds += time.perf_counter() - t0

    def optimizer(self) -> tuple[str, list[bytes]]:
        """The last boundary's optimizer state: (hash, chunk digests)."""
        assert self._optimizer is not None, "the last boundary was not submitted"
        t0 = time.perf_counter()
        try:
            return self._optimizer.result()
        finally:
            self.seconds += time.perf_counter() - t0


def delta_items(global_params: Mapping[str, Tensor], model: nn.Module) -> Iterator[tuple[str, Tensor]]:
    """Δ = θ_global − θ_local (float32) one tensor at a time, in name order: what `encode_pieces`
    takes, so no fp32 Δ of the whole model is ever held (a stored G_n is read in one pass)."""
    params = dict(model.named_parameters())
    for n in sorted(params):
        yield n, (global_params[n] - params[n].detach()).to(torch.float32)


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
    exchange: SliceExchange | None = None,
    keep_delta: bool = True,
) -> Contribution:
    """Train one outer step from the global params with the host's carried optimizer state.

    The store's `checkpoint_every` (m, a host setting) says which boundaries are persisted; the
    others are recomputed from the nearest persisted one if the challenge opens them
    (`materialize_openings`). `global_params` may be read from disk (`StoredTensors`): it is read
    once at the start and once, tensor by tensor, for Δ. Without `keep_delta` the returned
    contribution has no fp32 Δ (`delta == {}`), only its payload: the honest node needs nothing
    else, and Δ is never held whole."""
    t_start = time.perf_counter()
    if store is not None:
        store.flush()  # the previous step's last boundary is written from these very tensors
    named = dict(model.named_parameters())
    with torch.no_grad():
        for n in sorted(named):  # name order: one pass over a stored G_n
            named[n].copy_(global_params[n])
    k = cfg.segment_len
    losses: list[float] = []
    every = store.checkpoint_every if store is not None else 1
    boundaries = Boundaries(store, outer_step, cfg, opt, every=every)
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
        # Δ is encoded tensor by tensor while the worker hashes θ_H and its optimizer state
        layout = {n: tuple(p.shape) for n, p in named.items()}
        pieces = encode_pieces(delta_items(global_params, model), layout, cfg.codec, cfg.codec_block_size)
        payload = b"".join(pieces)
        del pieces
        delta = pseudo_gradient(global_params, model) if keep_delta else {}
    finally:
        leaves = boundaries.leaves()
    opt_hash, opt_digests = boundaries.optimizer()
    train_s = steps_s - boundaries.step_seconds
    return Contribution(
        outer_step=outer_step,
        base_model_hash=base_model_hash,
        leaves=leaves,
        trajectory_root=merkle_root([bytes.fromhex(h) for h in leaves]).hex(),
        delta=delta,
        payload=payload,
        delta_hash=delta_hash(payload, cfg.state_chunk_bytes),
        codec=cfg.codec,
        final_optimizer_hash=opt_hash,
        tokens=cfg.tokens_per_outer_step,
        env=env_fingerprint(micro_batches=micro_batches),
        mean_loss=sum(losses) / len(losses),
        losses=losses,
        boundary_seconds=boundaries.seconds,
        train_seconds=train_s,
        protocol_seconds=time.perf_counter() - t_start - train_s,
        optimizer_digests=tuple(opt_digests),
    )


def _save_recomputed(
    store: StateStore,
    outer_step: int,
    leaves: Sequence[str],
    j: int,
    model: nn.Module,
    opt: torch.optim.Optimizer,
    cfg: RunConfig,
) -> None:
    """Hash the recomputed boundary j, check it is the committed leaf, and persist it."""
    snap = training_state(model, opt)
    h, digests = tensor_hash_and_digests(snap, StateKind.TRAINING, cfg.state_chunk_bytes)
    if h != leaves[j]:
        raise ValueError(f"recomputed boundary {j} hashes to {h[:12]}, committed {leaves[j][:12]}")
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
    once; each missing opened boundary is recomputed bitwise from the nearest persisted one below
    it (boundary 0: `start()` rebuilds it from G_n and the carried optimizer) with the same step
    function, checked against its committed leaf, and saved; then the sources go. Returns the
    boundaries that were recomputed. Raises `ValueError` if a recomputed state does not hash to
    its leaf (the host could not reproduce its own trajectory).
    """
    store.flush()  # the last boundaries may still be being written
    needed = needed_boundaries(segments, cfg.replay_mode)
    on_disk = {j for j, h in enumerate(leaves) if store.has(h, outer_step)}
    missing = sorted(needed - on_disk)
    sources = {max((q for q in on_disk if q <= j), default=0) for j in missing}
    keep = {leaves[j] for j in needed | sources}  # leaves may repeat (a host that did not train)
    for h in {leaves[j] for j in on_disk} - keep:
        store.delete(h, outer_step)
    k = cfg.segment_len
    done: list[int] = []
    at: int | None = None  # the boundary the model currently holds
    model: nn.Module | None = None
    opt: torch.optim.Optimizer | None = None
    for j in missing:
        src = max((q for q in on_disk | set(done) if q <= j), default=0)  # 0: rebuilt by `start`
        if at is None or at > j or at < src:
            model = opt = None  # the previous optimizer goes before `start` makes the next
            model, opt = start()  # boundary 0; a persisted source is read over it, in place
            if src in on_disk or src in done:
                load_stored_state(store, outer_step, leaves[src], model, opt)
            at = src
        assert model is not None and opt is not None
        while at < j:
            train_segment(model, opt, cfg, data, host, outer_step, at * k, k, micro_batches, loss_fn=loss_fn)
            at += 1
            if at in needed and at not in on_disk and at not in done and at != j:
                _save_recomputed(store, outer_step, leaves, at, model, opt, cfg)
                done.append(at)
        _save_recomputed(store, outer_step, leaves, j, model, opt, cfg)
        done.append(j)
    for h in {leaves[j] for j in sources - needed} - {leaves[j] for j in needed}:
        store.delete(h, outer_step)
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
