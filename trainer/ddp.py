"""Data-parallel inner loop inside one host, under `torchrun` (gloo on CPU, nccl on GPU).

Every rank holds the full model and optimizer. Rank r takes slice r of the PRF batch; the slice
gradients are all-*gathered* and summed in rank order by `trainer.step` itself, exactly as a
single process does with `micro_batches = world size`. An all-reduce would be cheaper but its
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
import json
import os
import signal
import sys
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from nodekit.store import StateStore
from protocol.config import RunConfig
from trainer.commit import Contribution, run_committed
from trainer.data import Corpus, shakespeare_corpus
from trainer.model import lm_loss
from trainer.spec import DEFAULT_ALLOW_LIST, BuiltModel, Factory, build
from trainer.step import (
    LossFn,
    configure_determinism,
    load_training_state,
    make_optimizer,
    train_segment,
    training_state,
)

FOLLOW_TIMEOUT = timedelta(days=30)
"""How long a collective may wait. Followers wait for rank 0's next training call through whole
outer steps (reveal, verification, aggregation), far past torch's 30-minute default; a crashed
rank is torchrun's to notice (it stops the others), not a timeout's."""
MAX_HEADER_BYTES = 1 << 20
PR_SET_PDEATHSIG = 1


class GatherExchange:
    """`trainer.step.SliceExchange` over a torch.distributed process group."""

    def __init__(self, group: dist.ProcessGroup | None = None) -> None:
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)

    def gather(self, flat: Tensor) -> list[Tensor]:
        out = [torch.empty_like(flat) for _ in range(self.world_size)]
        dist.all_gather(out, flat.contiguous(), group=self.group)
        return out


def init_from_env(backend: str | None = None, timeout: timedelta | None = None) -> GatherExchange:
    """Join the process group torchrun describes (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)."""
    missing = [v for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if v not in os.environ]
    if missing:
        raise RuntimeError(f"not launched by torchrun: {', '.join(missing)} unset")
    if not dist.is_initialized():
        dist.init_process_group(backend or ("nccl" if torch.cuda.is_available() else "gloo"), timeout=timeout)
    return GatherExchange()


def run_committed_ddp(
    model: nn.Module,
    opt: torch.optim.Optimizer,
    cfg: RunConfig,
    data: Corpus,
    host: str,
    outer_step: int,
    global_params: Mapping[str, Tensor],
    base_model_hash: str,
    store: StateStore | None,
    exchange: GatherExchange,
    *,
    loss_fn: LossFn = lm_loss,
    keep_delta: bool = True,
) -> Contribution | None:
    """One outer step on every rank; rank 0 returns the contribution, the others None."""
    if exchange.rank == 0:
        return run_committed(
            model, opt, cfg, data, host, outer_step, global_params, base_model_hash, store,
            micro_batches=exchange.world_size, loss_fn=loss_fn, exchange=exchange, keep_delta=keep_delta,
        )  # fmt: skip
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(global_params[n])
    train_segment(
        model, opt, cfg, data, host, outer_step, 0, cfg.inner_steps, exchange.world_size,
        loss_fn=loss_fn, exchange=exchange,
    )  # fmt: skip
    return None


# ---------------------------------------------------------------- the host node's ranks


class TeamError(RuntimeError):
    """A data-parallel training call failed part-way. The ranks may be out of step in their
    collectives, so the host process must end (torchrun then stops the others) and resume from disk."""


def launch() -> GatherExchange | None:
    """The process group when torchrun started more than one rank, else None (single process).

    gloo, whatever the hardware: the replayable step and its tensors live on the CPU (the committed
    environment says `device="cpu"`), and nccl only moves CUDA tensors.
    """
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return None
    _die_with_parent()
    return init_from_env("gloo", timeout=FOLLOW_TIMEOUT)


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


class Team:
    """Rank 0's handle on its follower ranks; the host node trains through it (`OuterContext.train`).

    Each `train` call is announced and starts from rank 0's state, so the followers take part in
    exactly the training calls rank 0 makes and in nothing else.
    """

    def __init__(self, exchange: GatherExchange) -> None:
        if exchange.rank != 0:
            raise ValueError("only rank 0 leads a team; other ranks `follow`")
        self.exchange = exchange
        self.closed = False

    @property
    def world_size(self) -> int:
        return self.exchange.world_size

    def train(
        self,
        model: nn.Module,
        opt: torch.optim.Optimizer,
        cfg: RunConfig,
        data: Corpus,
        host: str,
        outer_step: int,
        global_params: Mapping[str, Tensor],
        base_model_hash: str,
        store: StateStore | None,
        *,
        loss_fn: LossFn = lm_loss,
        keep_delta: bool = True,
    ) -> Contribution:
        """`run_committed` over all ranks, from the global params and rank 0's carried optimizer."""
        if self.closed:
            raise TeamError("the team was stopped or broke in an earlier call")
        if cfg.batch_size % self.world_size:
            raise ValueError(f"batch_size {cfg.batch_size} does not split over {self.world_size} ranks")
        named = dict(model.named_parameters())
        with torch.no_grad():
            for n in sorted(named):  # name order: one pass over a G_n read from disk
                named[n].copy_(global_params[n])
        state = training_state(model, opt)
        job = {"stop": False, "outer_step": outer_step, "host": host, "config": cfg.model_dump(mode="json")}
        group = self.exchange.group
        try:
            _send_header({**job, **_state_header(state)}, group)
            for name in sorted(state):
                dist.broadcast(state[name].contiguous(), 0, group=group)
            c = run_committed_ddp(
                model, opt, cfg, data, host, outer_step, global_params, base_model_hash, store, self.exchange,
                loss_fn=loss_fn, keep_delta=keep_delta,
            )  # fmt: skip
        except Exception as e:
            self.closed = True
            why = f"{type(e).__name__}: {e}"
            raise TeamError(f"data-parallel training failed ({why}); restart the host") from e
        assert c is not None  # rank 0 always gets the contribution
        return c

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
    jobs = 0
    while True:
        header = _recv_header(exchange.group)
        if header.get("stop"):
            return jobs
        cfg = RunConfig.model_validate(header["config"])
        configure_determinism(cfg.threads)
        if data is None or data.manifest_hash != cfg.dataset_manifest_hash:
            data = corpus()
            if data.manifest_hash != cfg.dataset_manifest_hash:
                raise TeamError(f"local dataset {data.manifest_hash[:12]} is not the run's")
        spec = cfg.model.model_dump_json()
        if spec not in built:
            built = {spec: build(cfg.model, allow_list)}
        model, loss_fn = built[spec].module, built[spec].loss_fn
        opt = make_optimizer(model, cfg.inner)
        state = training_state(model, opt, copy=True)
        want = {k: header.get(k) for k in ("tensors", "numel")}
        if _state_header(state) != want:
            raise TeamError(f"rank 0's state {want} does not fit this rank's model {_state_header(state)}")
        for name in sorted(state):
            dist.broadcast(state[name], 0, group=exchange.group)
        load_training_state(model, opt, state)
        params = {k.removeprefix("param/"): v for k, v in state.items() if k.startswith("param/")}
        run_committed_ddp(
            model, opt, cfg, data, str(header["host"]), int(header["outer_step"]), params, "", None, exchange,
            loss_fn=loss_fn,
        )  # fmt: skip
        jobs += 1
