"""Sharded training state inside one host: ZeRO by whole tensors, bit for bit the unsharded step.

A data-parallel host (`trainer.ddp`) with `shard_state` keeps, on each of its W ranks, the full
parameters (a replica, as before) but only 1/W of the AdamW moments, and each rank hashes and
saves only its part of every boundary state. The trajectory stays exactly the one a verifier
replays in one process with `micro_batches = W`, because every floating-point operation of the
unsharded step (`replay.step._compute_grads` + `clip_grad_norm_` + AdamW) is repeated on the
same bits:

1. each rank computes the flat gradient of its slice of the batch (full replica), laid out in
   the plan's tensor order;
2. ordered reduce-scatter (`ShardedStep._reduce_scatter`, in buckets so no rank ever holds W
   gradients): rank r receives every rank's piece of the span that covers its own tensors and
   adds them in rank order, then divides once — the unsharded left fold, element for element;
3. clipping: each rank computes its tensors' norms (the kernel `clip_grad_norm_` uses), all ranks
   all-gather them, put them back in `clip_grad_norm_`'s order and form the total norm from that;
4. AdamW over its own tensors only (element-wise: the same bits as over the whole model);
5. each rank broadcasts its updated tensors into every replica.

Ownership (`ShardPlan`) is by whole tensors, contiguous runs of the parameter names in canonical
(UTF-8 byte) order, balanced by element count. Whole tensors because a tensor's norm is one
reduction whose order would change if the tensor were split; canonical order because then each
rank's part of a canonical state (`protocol.tensors`) is a few contiguous byte ranges: one run per
moment tensor group, its `param/…` run (rank 0 also the header and `step`). The moment groups are
the run's `InnerOptim.moments` format's (`protocol.moments.optimizer_names`): `exp_avg/…` and
`exp_avg_sq/…` (fp32), or the block-wise codes and scales `exp_avg_code/…`, `exp_avg_scale/…`,
`exp_avg_sq_code/…`, `exp_avg_sq_scale/…` (int8, specs §6.2.1), whose blocks cut one tensor's own
elements, so owning whole tensors keeps the quantization exactly the unsharded one; an int8 rank
holds, hashes and saves the codes and scales only (`Int8AdamW`'s float32 working copies are not state).
Each rank hashes the chunks wholly inside its ranges and sends rank 0 only those digests and the
bytes of chunks that straddle a range edge (`protocol.chunks.shard_digests`, specs §3), and saves
its ranges as its own shard file of the content store (`nodekit.store.put_shard`);
the commitment is the same whatever the sharding, and the store serves the state in canonical
order from the shard files. Parameters stay replicated (ZeRO-1/2); sharding them between steps too
(ZeRO-3 / FSDP2, needed at 30B on 80 GB devices) keeps the same ownership rule.

Collectives go through `Collectives`: `DistCollectives` (torch.distributed: gloo on CPU, NCCL for
CUDA tensors; boundary bytes on a separate gloo group so hashing overlaps training) or
`LocalGroup` (ranks as threads of one process, for tests).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch
from torch import Tensor, nn
from torch.utils._foreach_utils import _group_tensors_by_device_and_dtype, _has_foreach_support

from protocol import chunks
from protocol import moments as qm
from protocol.inner import PARAM, Moments
from protocol.tensors import StateKind, TensorSpec, canonical_header, canonical_size, data_offsets, domain
from replay.step import LossFn, _flat_grad, make_optimizer, moments_of

if TYPE_CHECKING:
    import torch.distributed as dist

    from nodekit.store import ContentStore
    from protocol.config import InnerOptim

BUCKET_ELEMS = 1 << 24
"""Elements per rank pair and round of the reduce-scatter (64 MiB of float32): what bounds its memory."""


class ShardError(RuntimeError):
    """A sharded collective or shard file failed on some rank."""


SUPPORTED_MOMENTS = (Moments.FP32, Moments.INT8)
"""`InnerOptim.moments` formats a sharded state lays out (both per tensor: int8's blocks cut a
tensor's own flattened elements, so ownership by whole tensors keeps them exact)."""


def _supported(moments: Moments | str) -> Moments:
    """The moment format, or one clear error for a format the sharded path does not lay out."""
    fmt = Moments(moments)
    if fmt not in SUPPORTED_MOMENTS:
        raise ValueError(f"shard_state does not support inner.moments {fmt.value!r}")
    return fmt


# ---------------------------------------------------------------- who owns what


def shard_ranges(numels: Sequence[int], world_size: int) -> list[range]:
    """Contiguous runs of tensor indices, one per rank, balanced by element count; every rank gets
    at least one tensor when there are at least `world_size` of them."""
    n, total = len(numels), sum(numels)
    bounds, acc, r = [0], 0, 1
    for i, k in enumerate(numels):
        acc += k
        while r < world_size and acc * world_size >= total * r:
            bounds.append(i + 1)
            r += 1
    bounds += [n] * (world_size + 1 - len(bounds))
    if n >= world_size:  # a huge tensor must not leave a rank without any
        for q in range(1, world_size):
            bounds[q] = min(max(bounds[q], bounds[q - 1] + 1), n - (world_size - q))
    return [range(bounds[q], bounds[q + 1]) for q in range(world_size)]


@dataclass(frozen=True)
class ShardPlan:
    """Parameter tensors by owner rank: contiguous runs of the names in canonical order."""

    names: tuple[str, ...]
    numels: tuple[int, ...]
    world_size: int
    owners: tuple[range, ...]

    @classmethod
    def of(cls, model: nn.Module, world_size: int) -> ShardPlan:
        named = sorted(((n, p.numel()) for n, p in model.named_parameters()), key=lambda e: e[0].encode())
        if len(named) < world_size:
            raise ValueError(f"{len(named)} parameter tensors cannot be sharded over {world_size} ranks")
        numels = tuple(k for _, k in named)
        return cls(tuple(n for n, _ in named), numels, world_size, tuple(shard_ranges(numels, world_size)))

    def owned(self, rank: int) -> list[str]:
        return [self.names[i] for i in self.owners[rank]]

    def spans(self) -> list[tuple[int, int]]:
        """[start, end) of each rank's tensors in the flat gradient (plan order)."""
        offsets = [0]
        for k in self.numels:
            offsets.append(offsets[-1] + k)
        return [(offsets[r.start], offsets[r.stop]) for r in self.owners]

    def held(self, rank: int, kind: StateKind, moments: Moments = Moments.FP32) -> list[str]:
        """The state tensors a rank holds, hashes and saves (rank 0 also `step`): its parameters'
        moment tensors in format `moments` (`protocol.moments.optimizer_names`), and for a
        training state the parameters themselves."""
        out: list[str] = []
        for n in self.owned(rank):
            if kind is StateKind.TRAINING:
                out.append(f"{PARAM}/{n}")
            out += qm.optimizer_names(moments, n)
        return out + (["step"] if rank == 0 else [])


def state_specs(model: nn.Module, kind: StateKind, moments: Moments = Moments.FP32) -> list[TensorSpec]:
    """The full (unsharded) state's specs: training state or optimizer state, with the moments in
    format `moments` (`protocol.moments.optimizer_specs`: what `replay.step.training_state` holds)."""
    named = list(model.named_parameters())
    out: list[TensorSpec] = list(qm.optimizer_specs({n: tuple(p.shape) for n, p in named}, moments))
    if kind is StateKind.TRAINING:
        out += [(f"{PARAM}/{n}", p.dtype, tuple(p.shape)) for n, p in named]
    return sorted(out, key=lambda s: s[0].encode())


def held_ranges(specs: Sequence[TensorSpec], names: Sequence[str], header: bool) -> list[tuple[int, int]]:
    """The canonical byte ranges of `names` (and the header), merged where adjacent, in order."""
    offsets = data_offsets(specs)
    spans = sorted(offsets[n] for n in names)
    if header:
        spans.insert(0, (0, len(canonical_header(specs))))
    out: list[tuple[int, int]] = []
    for a, b in spans:
        if b == a:
            continue
        if out and out[-1][1] == a:
            out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


# ---------------------------------------------------------------- collectives


class Collectives(Protocol):
    """What the sharded step and the sharded hash need from the ranks (torch.distributed or threads)."""

    rank: int
    world_size: int

    def all_to_all(self, send: Tensor, send_splits: list[int], recv_splits: list[int]) -> Tensor:
        """`send`'s q-th split goes to rank q; returns what every rank sent here, in rank order."""
        ...

    def all_gather(self, t: Tensor) -> list[Tensor]:
        """Every rank's `t` (same shape everywhere), in rank order."""
        ...

    def broadcast(self, t: Tensor, src: int) -> None:
        """`t` becomes rank `src`'s `t` (in place)."""
        ...

    def gather_bytes(self, data: bytes) -> list[bytes] | None:
        """Every rank's bytes on rank 0 (in rank order); None elsewhere."""
        ...

    def broadcast_bytes(self, data: bytes | None) -> bytes:
        """Rank 0's bytes on every rank."""
        ...


class LocalGroup:
    """W ranks as threads of one process: collectives through shared slots and a barrier (tests)."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self.barrier = threading.Barrier(world_size)
        self._slots: list[Any] = [None] * world_size

    def member(self, rank: int) -> LocalMember:
        return LocalMember(self, rank)


class LocalMember:
    def __init__(self, group: LocalGroup, rank: int) -> None:
        self.group, self.rank, self.world_size = group, rank, group.world_size

    def _exchange(self, value: Any) -> list[Any]:
        self.group._slots[self.rank] = value
        self.group.barrier.wait()
        out = list(self.group._slots)
        self.group.barrier.wait()  # nobody overwrites a slot before everyone has read it
        return out

    def all_to_all(self, send: Tensor, send_splits: list[int], recv_splits: list[int]) -> Tensor:
        rows = self._exchange(list(send.split(send_splits)))
        got = [row[self.rank] for row in rows]
        if [t.numel() for t in got] != recv_splits:
            raise ShardError("all_to_all: split sizes disagree between ranks")
        return torch.cat(got) if got else send[:0]

    def all_gather(self, t: Tensor) -> list[Tensor]:
        return [x.clone() for x in self._exchange(t)]

    def broadcast(self, t: Tensor, src: int) -> None:
        got = self._exchange(t)[src]
        if got is not t:
            t.copy_(got)
        self._exchange(None)  # the source's tensor may change only after everyone copied it

    def gather_bytes(self, data: bytes) -> list[bytes] | None:
        rows = self._exchange(bytes(data))
        return rows if self.rank == 0 else None

    def broadcast_bytes(self, data: bytes | None) -> bytes:
        return self._exchange(data)[0]


class DistCollectives:
    """`Collectives` over a torch.distributed process group. Tensors travel on their device's
    backend (gloo for CPU, NCCL for CUDA in a `cpu:gloo,cuda:nccl` group); bytes as CPU tensors,
    so the boundary group is gloo. Nothing pickled crosses a process boundary."""

    def __init__(self, group: dist.ProcessGroup | None = None) -> None:
        import torch.distributed as dist

        self.dist, self.group = dist, group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)

    def _global(self, rank: int) -> int:
        return rank if self.group is None else self.dist.get_global_rank(self.group, rank)

    def all_to_all(self, send: Tensor, send_splits: list[int], recv_splits: list[int]) -> Tensor:
        out = send.new_empty(sum(recv_splits))
        self.dist.all_to_all_single(out, send.contiguous(), recv_splits, send_splits, group=self.group)
        return out

    def all_gather(self, t: Tensor) -> list[Tensor]:
        out = [torch.empty_like(t) for _ in range(self.world_size)]
        self.dist.all_gather(out, t.contiguous(), group=self.group)
        return out

    def broadcast(self, t: Tensor, src: int) -> None:
        self.dist.broadcast(t, self._global(src), group=self.group)

    def gather_bytes(self, data: bytes) -> list[bytes] | None:
        size = torch.tensor([len(data)], dtype=torch.int64)
        sizes = (
            [torch.zeros(1, dtype=torch.int64) for _ in range(self.world_size)] if self.rank == 0 else None
        )
        self.dist.gather(size, sizes, dst=self._global(0), group=self.group)
        if self.rank != 0:
            if data:
                self.dist.send(
                    torch.frombuffer(bytearray(data), dtype=torch.uint8), self._global(0), self.group
                )
            return None
        assert sizes is not None
        out = [bytes(data)]
        for q in range(1, self.world_size):
            buf = torch.empty(int(sizes[q]), dtype=torch.uint8)
            if buf.numel():
                self.dist.recv(buf, self._global(q), self.group)
            out.append(buf.numpy().tobytes())
        return out

    def broadcast_bytes(self, data: bytes | None) -> bytes:
        size = torch.tensor([len(data) if data is not None else 0], dtype=torch.int64)
        self.dist.broadcast(size, self._global(0), group=self.group)
        buf = (
            torch.frombuffer(bytearray(data), dtype=torch.uint8)
            if self.rank == 0 and data
            else torch.empty(int(size), dtype=torch.uint8)
        )
        if buf.numel():
            self.dist.broadcast(buf, self._global(0), group=self.group)
        return buf.numpy().tobytes()


# ---------------------------------------------------------------- the step


class ShardedStep:
    """One rank's side of the sharded inner step; `replay.step.train_steps` calls `update` (it is
    a `ShardedUpdate`). `opt` is the rank's AdamW over its own tensors (`make_shard_optimizer`)."""

    def __init__(self, plan: ShardPlan, comm: Collectives, *, bucket_elems: int = BUCKET_ELEMS) -> None:
        if comm.world_size != plan.world_size:
            raise ValueError(f"plan for {plan.world_size} ranks, group of {comm.world_size}")
        self.plan, self.comm, self.bucket = plan, comm, max(1, bucket_elems)
        self.rank, self.world_size = comm.rank, comm.world_size

    def _reduce_scatter(self, flat: Tensor) -> Tensor:
        """This rank's span of Σ_q flat_q (summed in rank order), divided by W, in bounded rounds."""
        spans, w, b = self.plan.spans(), self.world_size, self.bucket
        lo, hi = spans[self.rank]
        total = flat.new_empty(hi - lo)
        rounds = max(-(-(e - s) // b) for s, e in spans)
        for t in range(rounds):
            parts = [flat[min(s + t * b, e) : min(s + (t + 1) * b, e)] for s, e in spans]
            mine = parts[self.rank].numel()
            got = self.comm.all_to_all(torch.cat(parts), [p.numel() for p in parts], [mine] * w)
            if mine:
                acc = total[t * b : t * b + mine]
                acc.copy_(got[:mine])
                for q in range(1, w):
                    acc += got[q * mine : (q + 1) * mine]
        total /= w
        return total

    def _total_norm(self, model: nn.Module, mine: list[nn.Parameter]) -> Tensor:
        """`clip_grad_norm_`'s total norm from the ranks' per-tensor norms, in its order."""
        grads = [p.grad for p in mine if p.grad is not None]
        if len(grads) != len(mine):
            raise RuntimeError("a parameter of this rank has no gradient to clip")
        device = mine[0].device
        if _has_foreach_support(grads, device):
            norms = list(torch._foreach_norm(grads, 2.0))
        else:
            norms = [torch.linalg.vector_norm(g, 2.0) for g in grads]
        width = max(len(r) for r in self.plan.owners)
        mine_t = torch.zeros(width, dtype=torch.float32, device=device)
        if norms:
            mine_t[: len(norms)] = torch.stack(norms).to(torch.float32)
        by_name: dict[str, Tensor] = {}
        for q, got in enumerate(self.comm.all_gather(mine_t)):
            for i, name in enumerate(self.plan.owned(q)):
                by_name[name] = got[i]
        return torch.linalg.vector_norm(torch.stack([by_name[n] for n in _norm_order(model)]), 2.0)

    def update(
        self,
        model: nn.Module,
        opt: torch.optim.Optimizer,
        inner: InnerOptim,
        x: Tensor,
        y: Tensor,
        loss_fn: LossFn,
        precision: str,
    ) -> Tensor:
        """One inner step on batch (x, y) split into W slices; returns the batch loss (0-d)."""
        w, r = self.world_size, self.rank
        if x.shape[0] % w:
            raise ValueError(f"batch of {x.shape[0]} does not split into {w} equal slices")
        by_name = dict(model.named_parameters())
        ordered = [by_name[n] for n in self.plan.names]
        flat = _flat_grad(model, loss_fn, x.chunk(w)[r], y.chunk(w)[r], precision, ordered)
        total = self._reduce_scatter(flat[:-1])
        losses = self.comm.all_gather(flat[-1:])
        loss = losses[0].clone()
        for piece in losses[1:]:
            loss += piece
        loss /= w
        del flat
        mine = [by_name[n] for n in self.plan.owned(r)]
        offset = 0
        for p in mine:
            p.grad = total[offset : offset + p.numel()].view_as(p)
            offset += p.numel()
        total_norm = self._total_norm(model, mine)
        torch.nn.utils.clip_grads_with_norm_(mine, inner.grad_clip, total_norm)
        opt.step()
        for p in mine:
            p.grad = None
        del total
        with torch.no_grad():
            for q in range(w):
                theirs = [by_name[n] for n in self.plan.owned(q)]
                if q == r:
                    buf = torch.cat([p.detach().reshape(-1) for p in theirs])
                else:
                    buf = theirs[0].new_empty(sum(p.numel() for p in theirs))
                self.comm.broadcast(buf, q)
                if q != r:
                    offset = 0
                    for p in theirs:
                        p.copy_(buf[offset : offset + p.numel()].view_as(p))
                        offset += p.numel()
        return loss[0]


def _norm_order(model: nn.Module) -> list[str]:
    """The order in which `clip_grad_norm_` stacks per-tensor norms: grouped by (device, dtype)."""
    names = [n for n, _ in model.named_parameters()]
    params = [p for _, p in model.named_parameters()]
    groups = _group_tensors_by_device_and_dtype([params], with_indices=True)  # type: ignore[list-item]
    return [names[i] for _, (_, indices) in groups.items() for i in indices]


def make_shard_optimizer(
    model: nn.Module, plan: ShardPlan, rank: int, inner: InnerOptim
) -> torch.optim.AdamW:
    """AdamW over this rank's own tensors (its 1/W of the moments), zero state up front; with
    `inner.moments = int8` an `Int8AdamW` (block-wise codes per tensor: whole tensors keep it exact)."""
    _supported(inner.moments)
    by_name = dict(model.named_parameters())
    return make_optimizer([by_name[n] for n in plan.owned(rank)], inner)


# ---------------------------------------------------------------- the state: hash, save, load


class ShardedState:
    """One rank's part of a sharded state: which tensors, which canonical byte ranges; the
    collective hash (rank 0 combines, every rank learns the hash) and per-rank shard files.
    `moments` is the run's `InnerOptim.moments`: the state's moment tensors are named and laid
    out as the unsharded state's (`protocol.moments`), and the rank's optimizer must keep them so."""

    def __init__(
        self, plan: ShardPlan, model: nn.Module, comm: Collectives, moments: Moments | str = Moments.FP32
    ) -> None:
        if comm.world_size != plan.world_size:
            raise ValueError(f"plan for {plan.world_size} ranks, group of {comm.world_size}")
        self.plan, self.comm, self.rank = plan, comm, comm.rank
        self.moments = _supported(moments)
        kinds = (StateKind.TRAINING, StateKind.OPTIMIZER)
        self.specs = {k: state_specs(model, k, self.moments) for k in kinds}

    def _check_format(self, opt: torch.optim.Optimizer) -> Moments:
        got = moments_of(opt)
        if got is not self.moments:
            raise ShardError(f"optimizer with {got.value} moments, sharded state with {self.moments.value}")
        return got

    def length(self, kind: StateKind) -> int:
        return canonical_size(self.specs[kind])

    def ranges(self, kind: StateKind, rank: int | None = None) -> list[tuple[int, int]]:
        rank = self.rank if rank is None else rank
        return held_ranges(self.specs[kind], self.plan.held(rank, kind, self.moments), header=rank == 0)

    def local(
        self, model: nn.Module, opt: torch.optim.Optimizer, kind: StateKind = StateKind.TRAINING
    ) -> dict[str, Tensor]:
        """This rank's tensors of the state (live: no copy), by canonical name. With int8 moments
        these are the codes and scales (`Int8AdamW`'s float32 working copies are not state)."""
        fmt = self._check_format(opt)
        by_name = dict(model.named_parameters())
        out: dict[str, Tensor] = {}
        step: Tensor | None = None
        for n in self.plan.owned(self.rank):
            p = by_name[n]
            st = opt.state[p]
            if kind is StateKind.TRAINING:
                out[f"{PARAM}/{n}"] = p.detach()
            for key in qm.optimizer_names(fmt, n):
                out[key] = st[key.split("/", 1)[0]]
            step = st["step"]
        if self.rank == 0:
            assert step is not None
            out["step"] = step
        return out

    def pieces(self, local: Mapping[str, Tensor], kind: StateKind) -> list[tuple[int, list[memoryview]]]:
        """(start, buffers) per byte range this rank holds: tensor memory in canonical order."""
        specs = self.specs[kind]
        offsets = data_offsets(specs)
        items: list[tuple[int, memoryview]] = []
        if self.rank == 0:
            items.append((0, memoryview(canonical_header(specs))))
        for name in sorted(local, key=str.encode):
            arr = _bytes_of(local[name])
            if arr.nbytes:
                if arr.nbytes != offsets[name][1] - offsets[name][0]:
                    raise ShardError(f"{name}: {arr.nbytes} bytes, the layout says {offsets[name]}")
                items.append((offsets[name][0], arr.data.cast("B")))
        runs: list[tuple[int, list[memoryview]]] = []
        end = -1
        for start, view in sorted(items, key=lambda e: e[0]):
            if start == end:
                runs[-1][1].append(view)
            else:
                runs.append((start, [view]))
            end = start + len(view)
        return runs

    def hash(
        self, local: Mapping[str, Tensor], kind: StateKind, chunk_bytes: int
    ) -> tuple[str, list[bytes] | None]:
        """The content hash of the whole state (on every rank) and its chunk digests (rank 0)."""
        total = self.length(kind)
        mine = [chunks.shard_digests(a, views, total, chunk_bytes) for a, views in self.pieces(local, kind)]
        got = self.comm.gather_bytes(chunks.encode_shards(mine))
        digests: list[bytes] | None = None
        h = b""
        if got is not None:
            shards = [s for raw in got for s in chunks.decode_shards(raw, total, chunk_bytes)]
            digests = chunks.combine_shards(shards, total, chunk_bytes)
            h = bytes.fromhex(chunks.content_hash(domain(kind), chunk_bytes, total, digests))
        return self.comm.broadcast_bytes(h if self.rank == 0 else None).hex(), digests

    def save(
        self,
        store: ContentStore,
        kind: StateKind,
        group: str,
        h: str,
        digests: Sequence[bytes] | None,
        local: Mapping[str, Tensor],
    ) -> None:
        """Every rank writes its ranges as its shard file; rank 0 then seals the object (the chunk
        digests and the shard index), which makes it visible. A rank's failure fails the save."""
        from nodekit.store import put_shard, seal_shards  # here: the step's core needs no nodekit

        store_kind = _store_kind(kind)
        error = b""
        try:
            if not store.has(store_kind, h, group):
                pieces = [v for _, vs in self.pieces(local, kind) for v in vs]
                put_shard(store, store_kind, h, group, self.rank, pieces)
        except Exception as e:  # reported to rank 0, which raises
            error = f"rank {self.rank}: {type(e).__name__}: {e}".encode()[:1000]
        reports = self.comm.gather_bytes(b"\x01" if not error else b"\x00" + error)
        if reports is None:
            if error:
                raise ShardError(error.decode())
            return
        failed = [r[1:].decode(errors="replace") for r in reports if r[:1] != b"\x01"]
        if failed:
            raise ShardError("; ".join(failed))
        assert digests is not None
        layout = [self.ranges(kind, q) for q in range(self.plan.world_size)]
        seal_shards(store, store_kind, h, group, self.length(kind), layout, digests)

    def load(
        self,
        store: ContentStore,
        kind: StateKind,
        h: str,
        group: str | None,
        model: nn.Module,
        opt: torch.optim.Optimizer,
    ) -> None:
        """Read this rank's part of a stored state (sharded or not) into its tensors: all the
        parameters (a training state: the replica), its own moments, the step counter. Int8
        moments go into the codes and scales (checked as `replay.step.load_training_state` does);
        `Int8AdamW` decodes them before its next step."""
        fmt = self._check_format(opt)
        specs = self.specs[kind]
        store_kind = _store_kind(kind)
        if store.length(store_kind, h, group) != self.length(kind):
            raise ShardError(f"{store_kind} {h[:12]} does not fit this model's layout")
        header = canonical_header(specs)
        if b"".join(store.read(store_kind, h, 0, len(header), group)) != header:
            raise ShardError(f"{store_kind} {h[:12]}: header does not match this model's layout")
        offsets = data_offsets(specs)
        by_name = dict(model.named_parameters())
        targets: dict[str, Tensor] = {}
        if kind is StateKind.TRAINING:
            targets.update({f"{PARAM}/{n}": p.detach() for n, p in by_name.items()})
        for n in self.plan.owned(self.rank):
            st = opt.state[by_name[n]]
            targets.update({key: st[key.split("/", 1)[0]] for key in qm.optimizer_names(fmt, n)})
        step = torch.zeros((), dtype=torch.float32)
        targets["step"] = step
        with torch.no_grad():
            for name, t in targets.items():
                a, b = offsets[name]
                in_place = t.device.type == "cpu" and t.is_contiguous()
                host = t if in_place else torch.empty(t.shape, dtype=t.dtype)
                view = _bytes_of(host)
                pos = 0
                for piece in store.read(store_kind, h, a, b, group):
                    view[pos : pos + len(piece)] = np.frombuffer(piece, dtype=np.uint8)
                    pos += len(piece)
                if t is not host:
                    t.copy_(host)
        if not bool(torch.isfinite(step)) or float(step) < 0:
            raise ShardError("state 'step' must be a finite non-negative float32 scalar")
        if fmt is Moments.INT8:  # codes no quantization produces do not load (specs §6.2.1)
            for n in self.plan.owned(self.rank):
                for m, (code, scale) in qm.INT8_GROUPS.items():
                    c = targets[f"{code}/{n}"]
                    try:
                        qm.check_codes(m, c, targets[f"{scale}/{n}"], tuple(c.shape))
                    except qm.MomentCodeError as e:
                        raise ShardError(f"{store_kind} {h[:12]}: {n}: {e}") from e
        for n in self.plan.owned(self.rank):  # every parameter carries its own step counter
            opt.state[by_name[n]]["step"].copy_(step)


def _bytes_of(t: Tensor) -> np.ndarray:
    """A tensor's bytes as a flat uint8 array (host memory; CUDA tensors must be copied first)."""
    t = t.detach()
    if t.device.type != "cpu":
        raise ShardError("shard bytes come from host memory (snapshot_to_host first)")
    return t.contiguous().reshape(-1).view(torch.uint8).numpy()


def _store_kind(kind: StateKind) -> Any:
    """The content store's kind of a state kind (imported here: the step's core needs no nodekit)."""
    from nodekit.objects import Kind

    return {StateKind.TRAINING: Kind.STATE, StateKind.OPTIMIZER: Kind.OPTIMIZER}[kind]
