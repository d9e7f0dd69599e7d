"""PROTOTYPE (phase 2; not wired into the node, the commitments or `trainer.ddp`): a ZeRO-style
sharded AdamW step whose trajectory is bit for bit the unsharded one.

The unsharded data-parallel step (`trainer.step._compute_grads` with W slices) sums the W slice
gradients in slice order, divides once, clips by the norm of the per-tensor norms, and runs AdamW
over every tensor. Sharding by *whole parameter tensors* keeps every one of those operations
identical per element:

1. each rank computes the flat gradient of its slice of the batch (`_flat_grad`, full replica);
2. ordered reduce-scatter: rank r receives every rank's piece of the flat vector that covers its
   own tensors and adds them in rank order, then divides once — the unsharded additions, element
   for element;
3. clipping: each rank computes its tensors' norms (the same kernel on the same bits), all ranks
   all-gather them in parameter order and form the total norm exactly as `clip_grad_norm_` does;
4. AdamW over its own tensors only (element-wise, so the same bits as over the whole model), with
   moments for 1/W of the model: 8 B/param of moments become 8/W;
5. all-gather of the updated tensors into every replica.

So the commitment can stay the hash of the canonical full state whatever the sharding; each rank
would hash and store its own tensors as chunks of it once the chunked commitments land. Parameters
stay replicated here (ZeRO-1/2); sharding them too (ZeRO-3 / FSDP2) keeps the same rule.

`LocalGroup` runs W ranks as threads of one process (the test); a torch.distributed version needs
an all-to-all with per-peer sizes (NCCL has it; gloo's list all_to_all is the open question).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import Tensor, nn

from trainer.step import LossFn, _flat_grad, lr_at, make_optimizer

if TYPE_CHECKING:
    from protocol.config import InnerOptim


class ShardExchange(Protocol):
    rank: int
    world_size: int

    def all_to_all(self, pieces: list[Tensor]) -> list[Tensor]:
        """`pieces[q]` goes to rank q; returns what every rank sent to this one, in rank order."""
        ...

    def all_gather(self, t: Tensor) -> list[Tensor]:
        """Every rank's `t` (sizes may differ), in rank order."""
        ...


class LocalGroup:
    """W ranks as threads of one process: collectives through shared slots and a barrier."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self._barrier = threading.Barrier(world_size)
        self._slots: list[Any] = [None] * world_size

    def member(self, rank: int) -> LocalMember:
        return LocalMember(self, rank)


class LocalMember:
    def __init__(self, group: LocalGroup, rank: int) -> None:
        self.group, self.rank, self.world_size = group, rank, group.world_size

    def _exchange(self, value: Any) -> list[Any]:
        self.group._slots[self.rank] = value
        self.group._barrier.wait()
        out = list(self.group._slots)
        self.group._barrier.wait()  # nobody overwrites a slot before everyone has read it
        return out

    def all_to_all(self, pieces: list[Tensor]) -> list[Tensor]:
        return [row[self.rank] for row in self._exchange(pieces)]

    def all_gather(self, t: Tensor) -> list[Tensor]:
        return self._exchange(t)


def shard_ranges(numels: Sequence[int], world_size: int) -> list[range]:
    """Contiguous runs of tensor indices, one per rank, balanced by element count (a rank may get none)."""
    total = sum(numels)
    bounds, acc, r = [0], 0, 1
    for i, n in enumerate(numels):
        acc += n
        while r < world_size and acc * world_size >= total * r:
            bounds.append(i + 1)
            r += 1
    bounds += [len(numels)] * (world_size + 1 - len(bounds))
    return [range(bounds[q], bounds[q + 1]) for q in range(world_size)]


class ShardedAdamW:
    """One rank's side of the sharded step over its replica `model`."""

    def __init__(self, model: nn.Module, inner: InnerOptim, exchange: ShardExchange) -> None:
        self.model, self.inner, self.ex = model, inner, exchange
        self.params = list(model.parameters())
        self.ranges = shard_ranges([p.numel() for p in self.params], exchange.world_size)
        offsets = [0]
        for p in self.params:
            offsets.append(offsets[-1] + p.numel())
        self.spans = [(offsets[r.start], offsets[r.stop]) for r in self.ranges]
        self.mine = [self.params[i] for i in self.ranges[exchange.rank]]
        self.opt = make_optimizer(self.mine, inner) if self.mine else None

    def step(self, x: Tensor, y: Tensor, loss_fn: LossFn, precision: str = "fp32") -> Tensor:
        """One inner step on batch (x, y) split into W slices; returns the batch loss."""
        w, r = self.ex.world_size, self.ex.rank
        flat = _flat_grad(self.model, loss_fn, x.chunk(w)[r], y.chunk(w)[r], precision)
        received = self.ex.all_to_all([flat[a:b] for a, b in self.spans])
        total = received[0].clone()
        for piece in received[1:]:
            total += piece
        total /= w
        losses = self.ex.all_gather(flat[-1:])
        loss = losses[0].clone()
        for piece in losses[1:]:
            loss += piece
        loss /= w
        offset = 0
        for p in self.mine:
            p.grad = total[offset : offset + p.numel()].view_as(p).clone()
            offset += p.numel()
        norms = torch.stack(torch._foreach_norm([p.grad for p in self.mine], 2.0)) if self.mine else flat[:0]
        total_norm = torch.linalg.vector_norm(torch.cat(self.ex.all_gather(norms)), 2.0)
        if self.opt is not None:
            torch.nn.utils.clip_grads_with_norm_(self.mine, self.inner.grad_clip, total_norm)
            lr = lr_at(self.inner, int(self.opt.state[self.mine[0]]["step"]))
            for g in self.opt.param_groups:
                g["lr"] = lr
            self.opt.step()
            for p in self.mine:
                p.grad = None
        mine_flat = torch.cat([p.detach().reshape(-1) for p in self.mine]) if self.mine else flat[:0]
        with torch.no_grad():
            for q, theirs in enumerate(self.ex.all_gather(mine_flat)):
                if q == r:
                    continue
                offset = 0
                for i in self.ranges[q]:
                    p = self.params[i]
                    p.copy_(theirs[offset : offset + p.numel()].view_as(p))
                    offset += p.numel()
        return loss[0]

    def shard_state(self, names: dict[nn.Parameter, str]) -> dict[str, Tensor]:
        """This rank's moments (`exp_avg/<n>`, `exp_avg_sq/<n>`) and step: its part of the training state."""
        out: dict[str, Tensor] = {}
        if self.opt is None:
            return out
        for p in self.mine:
            st = self.opt.state[p]
            out[f"exp_avg/{names[p]}"] = st["exp_avg"]
            out[f"exp_avg_sq/{names[p]}"] = st["exp_avg_sq"]
            out["step"] = st["step"]
        return out
