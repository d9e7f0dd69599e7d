"""Data-parallel inner loop inside one host, under `torchrun` (gloo on CPU, nccl on GPU).

Every rank holds the full model and optimizer. Rank r takes slice r of the PRF batch; the slice
gradients are all-*gathered* and summed in rank order by `trainer.step` itself, exactly as a
single process does with `micro_batches = world size`. An all-reduce would be cheaper but its
summation order is up to the backend, and then the host's trajectory could not be replayed
bitwise by a verifier on one machine. Rank 0 speaks for the host: it hashes, saves and encodes.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import torch
import torch.distributed as dist
from torch import Tensor, nn

from protocol.config import RunConfig
from trainer.commit import Contribution, run_committed
from trainer.data import Corpus
from trainer.model import lm_loss
from trainer.step import LossFn, train_segment
from trainer.store import StateStore


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


def init_from_env(backend: str | None = None) -> GatherExchange:
    """Join the process group torchrun describes (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)."""
    missing = [v for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if v not in os.environ]
    if missing:
        raise RuntimeError(f"not launched by torchrun: {', '.join(missing)} unset")
    if not dist.is_initialized():
        dist.init_process_group(backend or ("nccl" if torch.cuda.is_available() else "gloo"))
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
) -> Contribution | None:
    """One outer step on every rank; rank 0 returns the contribution, the others None."""
    if exchange.rank == 0:
        return run_committed(
            model, opt, cfg, data, host, outer_step, global_params, base_model_hash, store,
            micro_batches=exchange.world_size, loss_fn=loss_fn, exchange=exchange,
        )  # fmt: skip
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(global_params[n])
    train_segment(
        model, opt, cfg, data, host, outer_step, 0, cfg.inner_steps, exchange.world_size,
        loss_fn=loss_fn, exchange=exchange,
    )  # fmt: skip
    return None
