"""THE replayable step: the one code path a host trains with and a verifier replays with.

A segment is a pure function of (training state, run config, data, host, outer step, inner
steps, number of gradient slices) under a fixed environment (torch version, thread count,
deterministic algorithms); `TrainJob` holds what of that is fixed for one outer step. There is
deliberately no second implementation anywhere.

Data-parallel hosts (`trainer.ddp`) plug in a `SliceExchange`: each rank computes the gradient
of its slice of the PRF batch and the slices are gathered and summed in slice order, exactly as
a single process with `micro_batches = world size` does it, so a DDP trajectory replays bitwise
in one process.

Devices (`replay.device`): the model, its optimizer state and the batches live on the model's
device (cpu or cuda); the run's numerics (fp32 or bf16 autocast over float32 master state, TF32,
the attention kernel) are pinned at the start of every call. States cross to the host only to be
hashed or stored. This module's import needs torch and numpy alone (pydantic models are imported
where used), so bench/gpu_check.py runs the real step on a bare GPU machine.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch
from torch import Tensor, nn

from protocol import moments as qm
from protocol.chunks import DEFAULT_CHUNK_BYTES
from protocol.inner import MOMENTS, PARAM, Moments
from protocol.tensors import StateKind, tensor_hash
from replay.device import DeviceError as DeviceError  # re-exported
from replay.device import configure_determinism as configure_determinism  # re-exported
from replay.device import env_facts, forward_context, host_state, pin_numerics, to_device
from replay.device import pin_device as pin_device  # re-exported
from replay.device import snapshot_to_host as snapshot_to_host  # re-exported
from replay.model import lm_loss

if TYPE_CHECKING:  # pydantic models; at run time only `train_segment`/`env_fingerprint` import them
    from protocol.config import InnerOptim, Numerics, RunConfig
    from protocol.messages import EnvFingerprint
    from replay.data import Corpus

LossFn = Callable[[Tensor, Tensor], Tensor]
State = dict[str, Tensor]


class StateError(ValueError):
    """A training state does not fit this model (missing/extra names, shapes, dtypes)."""


def env_fingerprint(
    threads: int | None = None, micro_batches: int = 1, device: str | torch.device | None = None
) -> EnvFingerprint:
    """What a bitwise replay must reproduce, on `device` (default: `configure_determinism`'s);
    `micro_batches` is the data-parallel slice count."""
    from protocol.messages import EnvFingerprint

    facts = env_facts(device)
    if threads is not None:
        facts["threads"] = threads
    return EnvFingerprint(**facts, micro_batches=micro_batches)


class Int8AdamW(torch.optim.AdamW):
    """AdamW whose moments live between steps as block-wise 8-bit codes (`protocol.moments`,
    `InnerOptim.moments = int8`). The codes and scales in `state[p]` are the state (what is
    hashed, stored, served and loaded, in place too); `exp_avg`/`exp_avg_sq` are torch's float32
    working copies, decoded from the codes before every step and encoded into them after it, so
    a state written into the codes from outside (a verifier's in-place fetch) is what the next
    step uses."""

    moments = Moments.INT8

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        stepped = [p for g in self.param_groups for p in g["params"] if p.grad is not None]
        for p in stepped:
            st = self.state[p]
            for m in MOMENTS:
                code, scale = qm.INT8_GROUPS[m]
                qm.dequantize(st[code], st[scale], out=st[m])
        loss = super().step(closure)
        for p in stepped:  # as torch: a parameter without a gradient keeps its state
            st = self.state[p]
            got = qm.quantize_pair(st[qm.M_NAME], st[qm.V_NAME])
            names = [n for m in MOMENTS for n in qm.INT8_GROUPS[m]]
            for name, t in zip(names, got, strict=True):
                st[name].copy_(t)  # in place: a training state's views see it
        return loss


def moments_of(opt: torch.optim.Optimizer) -> Moments:
    """The moment format an optimizer keeps (`make_optimizer` chose it from `InnerOptim.moments`)."""
    return Moments(getattr(opt, "moments", Moments.FP32))


def _int8_entries(p: Tensor) -> dict[str, Tensor]:
    out: dict[str, Tensor] = {}
    for m in MOMENTS:
        code, scale = qm.INT8_GROUPS[m]
        out[code] = torch.zeros(p.shape, dtype=qm.CODE_DTYPES[m], device=p.device)
        out[scale] = torch.zeros(qm.n_blocks(p.numel()), dtype=torch.float32, device=p.device)
    return out


def make_optimizer(model: nn.Module | Iterable[nn.Parameter], inner: InnerOptim) -> torch.optim.AdamW:
    """AdamW (decay on matrices only, as nanoGPT) with its state created up front as zeros.

    PyTorch creates moments lazily on the first step; creating them here means a fresh optimizer
    and one loaded from an all-zero state are the same object, bit for bit, for hashing and replay.
    Given parameters instead of a model it covers only those (a rank's shard, `trainer.sharded`).

    On the CPU `foreach=False`: the per-tensor update runs the same kernels in the same order as
    the multi-tensor one (there `_foreach_*` loops over those kernels), so the bits are the same
    (`tests/test_step_replay.py::test_foreach_and_per_tensor_adamw_agree`), but its temporaries
    (√v̂ + ε) are one tensor's, not the whole model's: 4 B/param less at every step's peak. On an
    accelerator the multi-tensor kernels stay (launch count; a replay class pins the device kind).
    With `inner.moments = int8` it is an `Int8AdamW`: the same update, with the moments kept as
    8-bit codes between steps.
    """
    params = list(model.parameters()) if isinstance(model, nn.Module) else list(model)
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": inner.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    cls = Int8AdamW if Moments(inner.moments) is Moments.INT8 else torch.optim.AdamW
    opt = cls(
        [g for g in groups if g["params"]],
        lr=inner.lr,
        betas=(inner.beta1, inner.beta2),
        eps=inner.eps,
        foreach=bool(params) and params[0].device.type != "cpu",
    )
    for p in params:
        opt.state[p] = {
            "step": torch.tensor(0.0, dtype=torch.float32),
            "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
            "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format),
        }
        if cls is Int8AdamW:
            opt.state[p].update(_int8_entries(p))
    return opt


def training_state(model: nn.Module, opt: torch.optim.Optimizer, *, copy: bool = False) -> State:
    """The flat state of DEVELOPERS.md: `param/<n>`, `exp_avg/<n>`, `exp_avg_sq/<n>`, `step`; with
    int8 moments `exp_avg_code/<n>`, `exp_avg_scale/<n>`, `exp_avg_sq_code/<n>`,
    `exp_avg_sq_scale/<n>` in place of the moments (specs §6.2.1).

    Without `copy` the tensors alias the live ones (on the model's device): hash them before the
    next step. With `copy`, a host (CPU) copy, made now: what is hashed and stored. The hot path
    (a boundary every k steps) uses `snapshot_to_host` instead, which does not wait for the copy.
    """
    out: State = {}
    step: Tensor | None = None
    fmt = moments_of(opt)
    for name, p in model.named_parameters():
        st = opt.state[p]
        out[f"{PARAM}/{name}"] = p.detach()
        for key in qm.optimizer_names(fmt, name):
            out[key] = st[key.split("/", 1)[0]]
        step = st["step"] if step is None else step
    if step is None:
        raise StateError("model has no parameters")
    out["step"] = step
    return host_state(out) if copy else out


def optimizer_state(state: Mapping[str, Tensor]) -> State:
    """The part of a training state a host carries to its next outer step (moments + step)."""
    return {k: v for k, v in state.items() if not k.startswith(f"{PARAM}/")}


def training_hash(state: Mapping[str, Tensor], chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> str:
    """A trajectory leaf (hex): the chunked content hash with the run's `state_chunk_bytes`."""
    return tensor_hash(state, StateKind.TRAINING, chunk_bytes)


def optimizer_hash(state: Mapping[str, Tensor], chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> str:
    return tensor_hash(optimizer_state(state), StateKind.OPTIMIZER, chunk_bytes)


def load_training_state(model: nn.Module, opt: torch.optim.Optimizer, state: Mapping[str, Tensor]) -> None:
    """Copy a (verified) state into a model and its optimizer, refusing anything that does not fit."""
    fmt = moments_of(opt)
    layout = {n: tuple(p.shape) for n, p in model.named_parameters()}
    specs = {n: (d, s) for n, d, s in qm.optimizer_specs(layout, fmt)}
    specs.update({f"{PARAM}/{n}": (p.dtype, tuple(p.shape)) for n, p in model.named_parameters()})
    if set(state) != set(specs):
        missing, extra = sorted(set(specs) - set(state)), sorted(set(state) - set(specs))
        raise StateError(f"state names do not match the model: missing {missing[:3]}, extra {extra[:3]}")
    step = state["step"]
    if step.dim() != 0 or step.dtype != torch.float32 or not bool(torch.isfinite(step)) or float(step) < 0:
        raise StateError("state 'step' must be a finite non-negative float32 scalar")
    for key, (dtype, shape) in specs.items():
        t = state[key]
        if tuple(t.shape) != shape or t.dtype != dtype:
            raise StateError(f"{key}: {t.dtype}{list(t.shape)} != {dtype}{list(shape)}")
    if fmt is Moments.INT8:
        for name in layout:
            try:
                qm.dequantized(state, name)
            except qm.MomentCodeError as e:
                raise StateError(f"{name}: {e}") from e
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(state[f"{PARAM}/{name}"])
            entries = {
                "step": step.detach().to("cpu", copy=True),  # AdamW (not capturable) keeps it on the CPU
                **{k.split("/", 1)[0]: state[k].detach().to(p.device, copy=True)
                   for k in qm.optimizer_names(fmt, name)},
            }  # fmt: skip
            if fmt is Moments.INT8:  # torch's working copies, decoded again before every step
                entries.update({m: torch.zeros_like(p) for m in MOMENTS})
            opt.state[p] = entries


def lr_at(inner: InnerOptim, step: int) -> float:
    """Linear warm-up, then optional cosine decay, over the host's global step counter (it
    persists across outer steps, so the schedule spans the whole run as in the DiLoCo paper)."""
    if inner.warmup_steps > 0 and (step < inner.warmup_steps or inner.decay_steps <= 0):
        return inner.lr * min(1.0, (step + 1) / inner.warmup_steps)
    if inner.decay_steps <= inner.warmup_steps:
        return inner.lr
    progress = min(1.0, (step - inner.warmup_steps) / (inner.decay_steps - inner.warmup_steps))
    cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
    return inner.lr * (inner.min_lr_fraction + (1.0 - inner.min_lr_fraction) * cosine)


class SliceExchange(Protocol):
    """How the gradient slices of one batch meet: in-process, or across DDP ranks."""

    rank: int
    world_size: int

    def gather(self, flat: Tensor) -> list[Tensor]:
        """Every rank's `flat` tensor, in rank order."""
        ...


@runtime_checkable
class ShardedUpdate(Protocol):
    """A rank of a host whose optimizer state is sharded (`trainer.sharded.ShardedStep`): it does
    the whole update of one batch (its slice's gradient, the ordered reduce-scatter, clipping,
    AdamW on its own tensors, the parameter broadcast), bit for bit the unsharded step."""

    rank: int
    world_size: int

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
        """One inner step on (x, y); the batch loss (a 0-d tensor on the device)."""
        ...


def _flat_grad(
    model: nn.Module,
    loss_fn: LossFn,
    x: Tensor,
    y: Tensor,
    precision: str,
    params: list[nn.Parameter] | None = None,
) -> Tensor:
    """Gradient of one slice as one flat vector (in `params` order, default the model's), with the
    slice loss appended at the end."""
    params = list(model.parameters()) if params is None else params
    with forward_context(precision, x.device):
        loss = loss_fn(model(x), y)
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    parts = [
        (g if g is not None else torch.zeros_like(p)).reshape(-1) for g, p in zip(grads, params, strict=True)
    ]
    return torch.cat([*parts, loss.detach().float().reshape(1)])


def _compute_grads(
    model: nn.Module,
    loss_fn: LossFn,
    x: Tensor,
    y: Tensor,
    slices: int,
    exchange: SliceExchange | None,
    precision: str,
) -> Tensor:
    """Set `.grad` and return the loss (a 0-d tensor: reading it would wait for the device).

    Slices are summed in slice order, then divided once."""
    if slices == 1 and exchange is None:
        with forward_context(precision, x.device):
            loss = loss_fn(model(x), y)
        loss.backward()
        return loss.detach().float()
    if x.shape[0] % slices:
        raise ValueError(f"batch of {x.shape[0]} does not split into {slices} equal slices")
    xs, ys = x.chunk(slices), y.chunk(slices)
    if exchange is None:
        flats = [_flat_grad(model, loss_fn, xs[i], ys[i], precision) for i in range(slices)]
    else:
        flats = exchange.gather(_flat_grad(model, loss_fn, xs[exchange.rank], ys[exchange.rank], precision))
    total = flats[0].clone()
    for f in flats[1:]:
        total += f
    total /= slices
    offset = 0
    for p in model.parameters():
        n = p.numel()
        p.grad = total[offset : offset + n].view_as(p).clone()
        offset += n
    return total[-1].clone()  # not a view: it would keep the whole flat gradient alive


def train_steps(
    model: nn.Module,
    opt: torch.optim.Optimizer,
    inner: InnerOptim,
    numerics: Numerics,
    batches: Iterable[tuple[Tensor, Tensor]],
    micro_batches: int = 1,
    *,
    loss_fn: LossFn = lm_loss,
    exchange: SliceExchange | ShardedUpdate | None = None,
) -> list[float]:
    """One inner step per (x, y) batch, on the model's device; returns the losses.

    The core of `train_segment`, with the batches given: it needs torch alone, so bench/gpu_check
    runs this very code on a machine with nothing but torch and numpy. With a `ShardedUpdate`
    exchange `opt` covers this rank's own tensors only."""
    if micro_batches < 1:
        raise ValueError("micro_batches must be >= 1")
    if exchange is not None and exchange.world_size != micro_batches:
        raise ValueError("micro_batches must equal the DDP world size")
    params = list(model.parameters())
    device = params[0].device
    first = opt.param_groups[0]["params"][0]  # every parameter carries the same step counter
    pin_numerics(numerics.tf32, str(numerics.attention))
    precision = str(numerics.precision)
    model.train()
    losses: list[Tensor] = []
    for x, y in batches:
        x, y = to_device(x, device), to_device(y, device)
        lr = lr_at(inner, int(opt.state[first]["step"]))  # a CPU tensor: no device sync
        for g in opt.param_groups:
            g["lr"] = lr
        opt.zero_grad(set_to_none=True)
        if isinstance(exchange, ShardedUpdate):
            losses.append(exchange.update(model, opt, inner, x, y, loss_fn, precision))
            continue
        losses.append(_compute_grads(model, loss_fn, x, y, micro_batches, exchange, precision))
        torch.nn.utils.clip_grad_norm_(params, inner.grad_clip)
        opt.step()
    opt.zero_grad(set_to_none=True)  # the next step sets them anew: 4 B/param free between segments
    return torch.stack(losses).tolist() if losses else []  # one device sync per call, not per step


@dataclass(frozen=True, eq=False)
class TrainJob:
    """What one host's training in one outer step is a function of, besides its training state:
    the run config, the data, the host and outer step (its PRF batches), the number of gradient
    slices (`EnvFingerprint.micro_batches`), the loss, and how a rank's slice meets the others'.

    One value for every call that trains or replays the step: the host's committed loop (its
    host-side extension is `trainer.commit.CommitJob`), its recompute after the challenge, a
    verifier's replay. The model and its optimizer are not in it: they are the state the job
    moves, rebuilt for each replay and recompute (`dataclasses.replace` gives a variant job)."""

    config: RunConfig
    data: Corpus
    host: str
    outer_step: int
    micro_batches: int = 1
    loss_fn: LossFn = lm_loss
    exchange: SliceExchange | ShardedUpdate | None = None
    """A data-parallel rank's: its slice's gradient meets the others' (None: one process)."""


def train_segment(
    job: TrainJob, model: nn.Module, opt: torch.optim.Optimizer, start_inner: int, n_steps: int
) -> list[float]:
    """Run inner steps `start_inner .. start_inner + n_steps - 1` on their PRF batches; their losses."""
    from replay.data import batch  # imported here so that the step's core needs no pydantic

    if job.micro_batches < 1 or n_steps < 0 or start_inner < 0:
        raise ValueError("micro_batches must be >= 1 and steps non-negative")
    cfg, steps = job.config, range(start_inner, start_inner + n_steps)
    batches = (batch(cfg, job.data, job.host, job.outer_step, i) for i in steps)
    return train_steps(
        model, opt, cfg.inner, cfg.numerics, batches, job.micro_batches,
        loss_fn=job.loss_fn, exchange=job.exchange,
    )  # fmt: skip
