"""Data-parallel inner loop inside one host, under `torchrun` (gloo on CPU, nccl on GPU).

Every rank holds the full model and optimizer, on its own device (`cuda:LOCAL_RANK` on a GPU
host). Rank r takes slice r of the PRF batch; the slice gradients are all-*gathered* and summed
in rank order by `replay.step` itself, exactly as a single process does with
`micro_batches = world size`. An all-reduce would be cheaper but its
summation order is up to the backend, and then the host's trajectory could not be replayed
bitwise by a verifier on one machine. Rank 0 speaks for the host: it hashes, saves and encodes.

The host node (`gonka-diloco host run` under torchrun) uses this through a `Team` on rank 0 and
`follow` on every other rank: before each training call rank 0 announces it (a small JSON header)
and broadcasts its whole starting training state, so a follower never drifts from whatever rank 0
decided (a fresh optimizer after a rejection, a state reloaded from disk after a restart). Only
rank 0 talks to the chain, binds ports and writes the data dir; followers just train.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import json
import os
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from nodekit.statestore import StateStore
from nodekit.store import ContentStore
from protocol.config import RunConfig
from protocol.inner import Moments
from protocol.tensors import StateKind
from replay.data import Corpus, shakespeare_corpus
from replay.device import resolve_device
from replay.spec import DEFAULT_ALLOW_LIST, BuiltModel, Factory, build
from replay.step import (
    LossFn,
    configure_determinism,
    load_training_state,
    make_optimizer,
    train_segment,
    training_state,
)
from trainer.commit import CommitJob, TrainedStep, follow_committed, run_committed
from trainer.recompute import OpeningPlan, drop_sources, plan_openings, recompute_openings
from trainer.sharded import DistCollectives, ShardedState, ShardedStep, ShardPlan, make_shard_optimizer

FOLLOW_TIMEOUT = timedelta(days=30)
"""How long a collective may wait. Followers wait for rank 0's next training call through whole
outer steps (reveal, verification, aggregation), far past torch's 30-minute default; a crashed
rank is torchrun's to notice (it stops the others), not a timeout's."""
MAX_HEADER_BYTES = 1 << 20
PR_SET_PDEATHSIG = 1


class GatherExchange:
    """`replay.step.SliceExchange` over a torch.distributed process group; `device` is this rank's.

    `boundary` is a second (gloo) group over the same ranks for the boundary worker's collectives
    (sharded hashing and saving), so they never interleave with the training thread's."""

    def __init__(
        self,
        group: dist.ProcessGroup | None = None,
        device: torch.device | None = None,
        boundary: dist.ProcessGroup | None = None,
    ) -> None:
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.device = device if device is not None else torch.device("cpu")
        self.boundary = boundary

    def gather(self, flat: Tensor) -> list[Tensor]:
        out = [torch.empty_like(flat) for _ in range(self.world_size)]
        dist.all_gather(out, flat.contiguous(), group=self.group)
        return out


def backend_for(device: torch.device) -> str:
    """gloo for CPU tensors; on a GPU host NCCL for CUDA tensors (gradient slices, states) and gloo
    for the small CPU ones (job headers, the step counter), in one process group."""
    return "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"


def init_from_env(
    backend: str | None = None, timeout: timedelta | None = None, device: torch.device | None = None
) -> GatherExchange:
    """Join the process group torchrun describes (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)."""
    missing = [v for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if v not in os.environ]
    if missing:
        raise RuntimeError(f"not launched by torchrun: {', '.join(missing)} unset")
    dev = device if device is not None else torch.device("cpu")
    if not dist.is_initialized():
        dist.init_process_group(backend or backend_for(dev), timeout=timeout)
    boundary = dist.new_group(backend="gloo", timeout=timeout)  # every rank, in the same order
    return GatherExchange(device=dev, boundary=boundary)


def run_committed_ddp(
    job: CommitJob, model: nn.Module, opt: torch.optim.Optimizer, *, keep_delta: bool = True
) -> TrainedStep | None:
    """One outer step on every rank (the job's `exchange`: this rank's, its slices the world size);
    rank 0 returns the contribution, the others None."""
    exchange = job.exchange
    if exchange is None:
        raise ValueError("run_committed_ddp needs the job's exchange (this rank's GatherExchange)")
    job = dataclasses.replace(job, micro_batches=exchange.world_size)
    if exchange.rank == 0:
        return run_committed(job, model, opt, keep_delta=keep_delta)
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(job.start_params[n])
    train_segment(job, model, opt, 0, job.config.inner_steps)
    return None


# ---------------------------------------------------------------- the host node's ranks


class TeamError(RuntimeError):
    """A data-parallel training call failed part-way. The ranks may be out of step in their
    collectives, so the host process must end (torchrun then stops the others) and resume from disk."""


def launch(device: str = "cpu") -> GatherExchange | None:
    """The process group when torchrun started more than one rank, else None (single process).

    `device` is the node setting: `cuda` puts each rank on `cuda:LOCAL_RANK` and its CUDA tensors
    on NCCL (`backend_for`); `cpu` is gloo alone.
    """
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return None
    _die_with_parent()
    dev = resolve_device(device)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    return init_from_env(timeout=FOLLOW_TIMEOUT, device=dev)


def _die_with_parent() -> None:
    """torchrun starts each rank in its own session, so stopping torchrun's process group does not
    reach them; if torchrun itself is killed, its ranks go too (Linux), instead of a rank 0 that
    keeps acting for the host unsupervised. Its state is on disk: the host resumes like after kill -9.
    """
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() == 1:  # the parent was already gone before we asked
        os._exit(1)


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def _send_header(header: dict[str, Any], group: dist.ProcessGroup | None) -> None:
    """JSON bytes as a length and a uint8 tensor: nothing pickled crosses the process boundary."""
    data = json.dumps(header).encode()
    dist.broadcast(torch.tensor([len(data)], dtype=torch.int64), 0, group=group)
    dist.broadcast(torch.frombuffer(bytearray(data), dtype=torch.uint8), 0, group=group)


def _recv_header(group: dist.ProcessGroup | None) -> dict[str, Any]:
    size = torch.zeros(1, dtype=torch.int64)
    dist.broadcast(size, 0, group=group)
    n = int(size)
    if not 0 < n <= MAX_HEADER_BYTES:
        raise TeamError(f"job header of {n} bytes (limit {MAX_HEADER_BYTES})")
    buf = torch.empty(n, dtype=torch.uint8)
    dist.broadcast(buf, 0, group=group)
    header = json.loads(buf.numpy().tobytes())
    if not isinstance(header, dict):
        raise TeamError("job header is not a JSON object")
    return header


def _state_header(state: Mapping[str, Tensor]) -> dict[str, int]:
    """Enough of the state's shape for a follower to notice it built a different model."""
    return {"tensors": len(state), "numel": sum(t.numel() for t in state.values())}


@dataclass
class ShardedRank:
    """This rank's pieces of a sharded team for one model: who owns what, the step, the state."""

    plan: ShardPlan
    step: ShardedStep
    state: ShardedState

    @classmethod
    def of(cls, model: nn.Module, exchange: GatherExchange, moments: Moments | str) -> ShardedRank:
        """`moments`: the run's `InnerOptim.moments` (the state's moment tensors: fp32 or int8)."""
        plan = ShardPlan.of(model, exchange.world_size)
        step = ShardedStep(plan, DistCollectives(exchange.group))
        return cls(plan, step, ShardedState(plan, model, DistCollectives(exchange.boundary), moments))

    def broadcast_params(self, model: nn.Module, group: dist.ProcessGroup | None) -> None:
        """Rank 0's parameters (G_n, or what it loaded) into every replica, in canonical order."""
        by_name = dict(model.named_parameters())
        with torch.no_grad():
            for name in self.plan.names:
                dist.broadcast(by_name[name].detach(), 0, group=group)

    def optimizer(
        self, model: nn.Module, inner: Any, store: ContentStore | None, carried: str | None, group: str
    ) -> torch.optim.Optimizer:
        """This rank's AdamW over its own tensors: fresh, or its part of the carried state `carried`."""
        opt = make_shard_optimizer(model, self.plan, self.step.rank, inner)
        if carried:
            if store is None:
                raise TeamError("a carried optimizer state needs the host's store")
            self.state.load(store, StateKind.OPTIMIZER, carried, group, model, opt)
        return opt


class Team:
    """Rank 0's handle on its follower ranks; the host node trains through it (`OuterContext.train`).

    Each `train` call is announced and starts from rank 0's state, so the followers take part in
    exactly the training calls rank 0 makes and in nothing else.

    With `shard_state` each rank keeps only its 1/W of the AdamW moments (`trainer.sharded`): rank 0
    builds its part with `shard_optimizer` (fresh, or its part of the carried state in the store),
    the followers theirs when `train` announces the call; every rank hashes and saves its part of
    every boundary into the host's store (shard files: the data dir must be shared by the ranks,
    as it is on one machine), and `materialize` recomputes opened boundaries with all ranks.
    """

    def __init__(self, exchange: GatherExchange, *, shard_state: bool = False) -> None:
        if exchange.rank != 0:
            raise ValueError("only rank 0 leads a team; other ranks `follow`")
        self.exchange = exchange
        self.shard_state = shard_state
        self.closed = False
        self._sharded: tuple[int, Moments, ShardedRank] | None = None
        self._carried: tuple[str | None, str] = (None, "optimizer")

    def _rank(self, model: nn.Module, cfg: RunConfig) -> ShardedRank:
        moments = Moments(cfg.inner.moments)
        if self._sharded is None or self._sharded[:2] != (id(model), moments):
            self._sharded = (id(model), moments, ShardedRank.of(model, self.exchange, moments))
        return self._sharded[2]

    def carry(self, carried: str | None, group: str) -> None:
        """The optimizer state the next calls start from (None: fresh) and the content group where
        it is, and where `train` keeps its final state (a sharded team)."""
        self._carried = (carried or None, group)

    def shard_optimizer(self, model: nn.Module, cfg: RunConfig, store: ContentStore) -> torch.optim.Optimizer:
        """Rank 0's part of a sharded team's optimizer state for the next `train` (`carry`)."""
        if not self.shard_state:
            raise ValueError("shard_optimizer is for a team with shard_state")
        carried, group = self._carried
        return self._rank(model, cfg).optimizer(model, cfg.inner, store, carried, group)

    def _header(self, op: str, job: CommitJob) -> dict[str, Any]:
        """What a follower needs to take part in `op` of `job` (its own data, model and loss)."""
        store = job.store
        header: dict[str, Any] = {
            "stop": False, "op": op, "outer_step": job.outer_step, "host": job.host,
            "config": job.config.model_dump(mode="json"), "device": self.exchange.device.type,
            "sharded": self.shard_state,
        }  # fmt: skip
        if self.shard_state:
            carried, group = self._carried
            header["carried_optimizer"], header["optimizer_group"] = carried, group
            header["store"] = None if store is None else {
                "root": str(store.root), "chunk_bytes": store.chunk_bytes,
                "checkpoint_every": store.checkpoint_every,
            }  # fmt: skip
        return header

    @property
    def world_size(self) -> int:
        return self.exchange.world_size

    def train(
        self, job: CommitJob, model: nn.Module, opt: torch.optim.Optimizer, *, keep_delta: bool = True
    ) -> TrainedStep:
        """`run_committed` over all ranks, from the job's start params and rank 0's carried
        optimizer: the job as rank 0's, with the team's slices, exchange and (sharded) state."""
        if self.closed:
            raise TeamError("the team was stopped or broke in an earlier call")
        cfg = job.config
        if cfg.batch_size % self.world_size:
            raise ValueError(f"batch_size {cfg.batch_size} does not split over {self.world_size} ranks")
        named = dict(model.named_parameters())
        with torch.no_grad():
            for n in sorted(named):  # name order: one pass over a G_n read from disk
                named[n].copy_(job.start_params[n])
        header = self._header("train", job)
        group = self.exchange.group
        c: TrainedStep | None
        try:
            if self.shard_state:
                rank = self._rank(model, cfg)
                _send_header(header, group)
                rank.broadcast_params(model, group)
                keep = self._carried[1] if job.store is not None else None
                ranked = dataclasses.replace(
                    job, micro_batches=self.world_size, exchange=rank.step, sharding=rank.state,
                    keep_optimizer=keep,
                )  # fmt: skip
                c = run_committed(ranked, model, opt, keep_delta=keep_delta)
            else:
                state = training_state(model, opt)
                _send_header({**header, **_state_header(state)}, group)
                for name in sorted(state):
                    dist.broadcast(state[name].contiguous(), 0, group=group)
                ddp = dataclasses.replace(job, exchange=self.exchange)
                c = run_committed_ddp(ddp, model, opt, keep_delta=keep_delta)
        except Exception as e:
            self.closed = True
            why = f"{type(e).__name__}: {e}"
            raise TeamError(f"data-parallel training failed ({why}); restart the host") from e
        assert c is not None  # rank 0 always gets the contribution
        return c

    def materialize(
        self, job: CommitJob, model: nn.Module, leaves: list[str], segments: list[int],
        windows: Sequence[int] = (),
    ) -> list[int]:
        """`trainer.recompute.materialize_openings` for a sharded team: rank 0 plans (and deletes what
        is not needed); every rank recomputes its part of the missing opened boundaries from the
        persisted ones (or from the job's start params, which rank 0 broadcasts, and the carried
        optimizer state)."""
        if self.closed:
            raise TeamError("the team was stopped or broke in an earlier call")
        store = job.store
        if store is None:
            raise ValueError("opened boundaries are recomputed into the host's store: the job has none")
        plan = plan_openings(store, job.outer_step, leaves, segments, job.config.replay_mode, windows)
        done: list[int] = []
        if plan.missing:
            rank = self._rank(model, job.config)
            carried, group = self._carried

            def start() -> tuple[nn.Module, torch.optim.Optimizer]:
                with torch.no_grad():
                    for n, p in model.named_parameters():
                        p.copy_(job.start_params[n])
                rank.broadcast_params(model, self.exchange.group)
                return model, rank.optimizer(model, job.config.inner, store.content, carried, group)

            header = self._header("recompute", job)
            header.update(leaves=leaves, plan=plan.to_json())
            ranked = dataclasses.replace(
                job, micro_batches=self.world_size, exchange=rank.step, sharding=rank.state
            )
            try:
                _send_header(header, self.exchange.group)
                done = recompute_openings(ranked, plan, leaves, start)
            except ValueError:
                raise  # every rank saw the same wrong hash and stopped at the same point
            except Exception as e:
                self.closed = True
                why = f"{type(e).__name__}: {e}"
                raise TeamError(f"sharded recompute failed ({why}); restart the host") from e
        drop_sources(store, job.outer_step, leaves, plan)
        return done

    def close(self) -> None:
        """Tell the followers to exit (idempotent). A follower already gone is torchrun's business."""
        if self.closed:
            return
        self.closed = True
        with contextlib.suppress(Exception):  # the peers died first: nobody is left to tell
            _send_header({"stop": True}, self.exchange.group)


def follow(
    exchange: GatherExchange,
    *,
    corpus: Callable[[], Corpus] = shakespeare_corpus,
    allow_list: Mapping[str, Factory] = DEFAULT_ALLOW_LIST,
) -> int:
    """A rank >= 1 of a DDP host: train whenever rank 0 says so, until it says stop.

    Everything comes from rank 0's header and state (run config, host address, outer step,
    parameters and moments); the follower only brings its own copy of the data and the model code,
    both checked against the run config. Returns the number of training calls taken part in.
    """
    if exchange.rank == 0:
        raise ValueError("rank 0 leads (`Team`), it does not follow")
    data: Corpus | None = None
    built: dict[str, BuiltModel] = {}  # the last run config's model, built once
    sharded: ShardedRank | None = None  # and its sharded parts
    jobs = 0
    while True:
        header = _recv_header(exchange.group)
        if header.get("stop"):
            return jobs
        cfg = RunConfig.model_validate(header["config"])
        if header.get("device") != exchange.device.type:
            raise TeamError(f"rank 0 trains on {header.get('device')}, this rank on {exchange.device.type}")
        configure_determinism(cfg.threads, exchange.device)
        if data is None or data.manifest_hash != cfg.dataset_manifest_hash:
            data = corpus()
            if data.manifest_hash != cfg.dataset_manifest_hash:
                raise TeamError(f"local dataset {data.manifest_hash[:12]} is not the run's")
        spec = cfg.model.model_dump_json()
        if spec not in built:
            sharded = None
            made = build(cfg.model, allow_list)
            built = {spec: BuiltModel(made.module.to(exchange.device), made.loss_fn)}
        model, loss_fn = built[spec].module, built[spec].loss_fn
        if header.get("sharded"):
            if sharded is None or sharded.state.moments != cfg.inner.moments:
                sharded = ShardedRank.of(model, exchange, cfg.inner.moments)
            _follow_sharded(exchange, header, cfg, model, loss_fn, data, sharded)
            jobs += 1
            continue
        opt = make_optimizer(model, cfg.inner)
        # receive buffers on rank 0's devices (CUDA tensors travel by NCCL, the step counter by gloo)
        state = {k: v.detach().clone() for k, v in training_state(model, opt).items()}
        want = {k: header.get(k) for k in ("tensors", "numel")}
        if _state_header(state) != want:
            raise TeamError(f"rank 0's state {want} does not fit this rank's model {_state_header(state)}")
        for name in sorted(state):
            dist.broadcast(state[name], 0, group=exchange.group)
        load_training_state(model, opt, state)
        params = {k.removeprefix("param/"): v for k, v in state.items() if k.startswith("param/")}
        job = CommitJob(
            cfg, data, str(header["host"]), int(header["outer_step"]), loss_fn=loss_fn, exchange=exchange,
            start_params=params,
        )  # fmt: skip
        run_committed_ddp(job, model, opt)
        jobs += 1


def _follow_sharded(
    exchange: GatherExchange,
    header: dict[str, Any],
    cfg: RunConfig,
    model: nn.Module,
    loss_fn: LossFn,
    data: Corpus,
    rank: ShardedRank,
) -> None:
    """One call of a sharded team on a follower: its part of rank 0's `train` or `materialize`."""
    where = header.get("store")
    store = None
    if where:
        every = int(where["checkpoint_every"])
        store = StateStore(where["root"], chunk_bytes=int(where["chunk_bytes"]), checkpoint_every=every)
    carried, group = header.get("carried_optimizer"), str(header.get("optimizer_group"))
    params = {n: p.detach() for n, p in model.named_parameters()}  # the live ones: G_n once `start` ran
    job = CommitJob(
        cfg, data, str(header["host"]), int(header["outer_step"]), micro_batches=exchange.world_size,
        loss_fn=loss_fn, exchange=rank.step, start_params=params, store=store, sharding=rank.state,
    )  # fmt: skip

    def start() -> tuple[nn.Module, torch.optim.Optimizer]:
        rank.broadcast_params(model, exchange.group)
        return model, rank.optimizer(model, cfg.inner, store.content if store else None, carried, group)

    if header.get("op") == "train":
        model, opt = start()
        keep = group if store is not None else None
        follow_committed(dataclasses.replace(job, keep_optimizer=keep), model, opt)
    elif header.get("op") == "recompute":
        if store is None:
            raise TeamError("recompute needs the host's store")
        plan = OpeningPlan.from_json(header["plan"])
        with contextlib.suppress(ValueError):  # a wrong hash: rank 0 saw it too and reports it
            recompute_openings(job, plan, [str(h) for h in header["leaves"]], start)
    else:
        raise TeamError(f"unknown job {header.get('op')!r}")
    if store is not None:
        store.flush()  # this rank's last shard file is written before the next call
