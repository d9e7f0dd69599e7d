"""The committed inner loop: H steps of `train_segment`, a trajectory leaf every k steps, then Δ.

Boundary work (hash the full training state on all cores, persist every m-th) runs on a worker
thread over the live state while the next step's forward and backward run; the training thread
waits only if the boundary is not done by that step's optimizer update, and no state is copied.
After the challenge, `materialize_openings` recomputes the opened boundaries that were not
persisted and deletes the rest. Everything a host later commits and reveals is in the returned `TrainedStep`.

A rank of a host with sharded training state (`trainer.sharded`, under `trainer.ddp`) runs the
same loop (`follow_committed` on ranks ≥ 1): each boundary is hashed collectively from every
rank's part and saved as per-rank shard files, so the leaves are the unsharded ones.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from nodekit.statestore import StateStore
from nodekit.storefiles import StoredTensors
from protocol.codecs import delta_hash, encode_pieces
from protocol.config import Codec
from protocol.merkle import merkle_root, pair_proof
from protocol.messages import EnvFingerprint, MsgCommitPseudoGradient, SegmentOpening
from replay.step import TrainJob, env_fingerprint, train_segment
from trainer.boundaries import Boundaries
from trainer.errorfeedback import CarriedEF
from trainer.sharded import ShardedState


@dataclass(frozen=True)
class TrainedStep:
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
    final_ef_hash: str = ""
    """Codec sparse: the hash of the error-feedback accumulator e_next carried on (specs §4.1; the
    tensors are in the node's store); empty for the other codecs."""

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
            final_ef_hash=self.final_ef_hash,
        )


def param_tensors(model: nn.Module) -> dict[str, Tensor]:
    """Parameters by name, as copies: the naming Δ and the global model use."""
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def pseudo_gradient(global_params: Mapping[str, Tensor], model: nn.Module) -> dict[str, Tensor]:
    """Δ = θ_global − θ_local (float32), name for name."""
    return {n: (global_params[n] - p.detach().to(global_params[n].device)).to(torch.float32)
            for n, p in model.named_parameters()}  # fmt: skip


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


@dataclass(frozen=True, eq=False, kw_only=True)
class CommitJob(TrainJob):
    """One outer step as a host's committed loop trains it: the replayable `TrainJob` plus what
    the host commits from and keeps. Built per outer step (`OuterContext.job`; reveal builds the
    same for its recompute) and handed whole to every call that trains the step; a team's ranks
    get variants of it (`dataclasses.replace`: their slices, exchange and sharded state), so no
    call can be given a context that drifts from another's."""

    start_params: Mapping[str, Tensor] = field(repr=False)
    """What the step trains from and Δ is measured against: G_n, or an eager run's start. May be
    read from disk (`StoredTensors`): it is read once at the start and once, tensor by tensor, for Δ."""
    base_model_hash: str = ""
    """The committed base model (G_n's hash)."""
    store: StateStore | None = None
    """Where boundaries are persisted: every `checkpoint_every`-th (a host setting) and what is
    always opened. None: only hashed (a DDP follower, a benchmark)."""
    sharding: ShardedState | None = None
    """A rank of a host with sharded training state (`trainer.sharded`): its part of each boundary."""
    keep_optimizer: str | None = None
    """A sharded rank: the content group its part of the final optimizer state is saved in."""
    ef: CarriedEF | None = None
    """Codec sparse: the host's carried error-feedback accumulator, which encodes the payload."""


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
    job: CommitJob, model: nn.Module, opt: torch.optim.Optimizer, after: Callable[[], Any]
) -> _Trajectory:
    """The loop every rank runs: boundaries and segments; then `after()` (rank 0's Δ, encoded
    while the last boundary and the final optimizer state are hashed)."""
    cfg, store, sharding = job.config, job.store, job.sharding
    if store is not None:
        store.flush()  # the previous step's last boundary is written from these very tensors
    load_params(model, job.start_params)
    k = cfg.segment_len
    losses: list[float] = []
    every = store.checkpoint_every if store is not None else 1
    boundaries = Boundaries(store, job.outer_step, cfg, opt, every=every, sharding=sharding)
    final_opt: Future[tuple[str, list[bytes] | None]] | None = None
    steps_s = 0.0
    try:
        for seg in range(cfg.n_segments + 1):
            boundaries.submit(model, opt)
            if seg < cfg.n_segments:
                t0 = time.perf_counter()
                losses += train_segment(job, model, opt, seg * k, k)
                steps_s += time.perf_counter() - t0
        if sharding is not None:
            final_opt = boundaries.optimizer(model, opt, job.keep_optimizer)
        out = after()
    finally:
        leaves = boundaries.leaves()
    opt_hash, opt_digests = final_opt.result() if final_opt is not None else boundaries.final_optimizer()
    train_s = steps_s - boundaries.step_seconds
    return _Trajectory(
        leaves, losses, boundaries.seconds, boundaries.breakdown(), train_s, opt_hash, opt_digests, out
    )


def run_committed(
    job: CommitJob, model: nn.Module, opt: torch.optim.Optimizer, *, keep_delta: bool = True
) -> TrainedStep:
    """Train one outer step from the job's start params with the host's carried optimizer state.

    The store's `checkpoint_every` (m, a host setting) says which boundaries are persisted; the
    others are recomputed from the nearest persisted one if the challenge opens them
    (`materialize_openings`). With `sharding` (rank 0 of a sharded host; the others run
    `follow_committed`) the final optimizer state is also saved, in content group `keep_optimizer`.
    Without `keep_delta` the returned contribution has no fp32 Δ (`delta == {}`), only its
    payload: the honest node needs nothing else, and Δ is never held whole. With the job's `ef`
    (codec sparse) the payload is C(β·e + Δ) and e_next goes to the store (specs §4.1)."""
    t_start = time.perf_counter()
    cfg, start = job.config, job.start_params

    def delta() -> tuple[dict[str, Tensor], bytes]:
        layout = {n: tuple(p.shape) for n, p in model.named_parameters()}
        pieces = (
            encode_pieces(delta_items(start, model), layout, cfg.codec, cfg.codec_block_size)
            if job.ef is None
            else [job.ef.encode(delta_items(start, model), layout)]
        )
        payload = b"".join(pieces)
        del pieces
        return (pseudo_gradient(start, model) if keep_delta else {}), payload

    t = _trajectory(job, model, opt, delta)
    d, payload = t.out
    return TrainedStep(
        outer_step=job.outer_step,
        base_model_hash=job.base_model_hash,
        leaves=t.leaves,
        trajectory_root=merkle_root([bytes.fromhex(h) for h in t.leaves]).hex(),
        delta=d,
        payload=payload,
        delta_hash=delta_hash(payload, cfg.state_chunk_bytes),
        codec=cfg.codec,
        final_optimizer_hash=t.optimizer_hash,
        tokens=cfg.tokens_per_outer_step,
        env=env_fingerprint(micro_batches=job.micro_batches),
        mean_loss=sum(t.losses) / len(t.losses),
        losses=t.losses,
        boundary_seconds=t.boundary_seconds,
        boundary_waits=t.boundary_waits,
        train_seconds=t.train_seconds,
        protocol_seconds=time.perf_counter() - t_start - t.train_seconds,
        optimizer_digests=tuple(t.optimizer_digests or ()),
        final_ef_hash="" if job.ef is None else job.ef.final_hash,
    )


def follow_committed(job: CommitJob, model: nn.Module, opt: torch.optim.Optimizer) -> list[str]:
    """A rank ≥ 1 of a sharded host in rank 0's `run_committed`: the same boundaries (its part of
    each hash, its shard files) and steps; no Δ. Returns the leaves (every rank learns them).
    The job's `exchange` and `sharding` are this rank's; its slices are the world size."""
    if job.exchange is None or job.sharding is None:
        raise ValueError("follow_committed is for a rank of a sharded host: exchange and sharding")
    job = dataclasses.replace(job, micro_batches=job.exchange.world_size)
    return _trajectory(job, model, opt, lambda: None).leaves


def openings(contribution: TrainedStep, segments: Sequence[int]) -> list[SegmentOpening]:
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
