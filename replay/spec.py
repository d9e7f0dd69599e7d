"""Resolve a chain's `ModelSpec` against the node's OWN allow-list.

A chain may name any "module:callable"; a node must never import code because a chain said so.
Only factories the operator listed are instantiated. Users bring their own model by adding
their factory to the allow-list they pass in; the factory returns an `nn.Module` whose
`forward(idx)` gives logits, or a `(module, loss_fn)` pair when next-byte cross-entropy is not
the right loss.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import torch
from torch import Tensor, nn

from nodekit.node import NodeError
from protocol.config import ModelSpec, ReplayMode, RunConfig
from protocol.inner import FP32_BYTES, GRAD_BYTES_PER_PARAM, STATE_BYTES_PER_PARAM
from protocol.modelsize import ModelSize, ModelSizeError, factory_config, model_size
from replay import hf
from replay.model import lm_loss, small_gpt

LossFn = Callable[[Tensor, Tensor], Tensor]
Factory = Callable[..., nn.Module | tuple[nn.Module, LossFn]]

DEFAULT_ALLOW_LIST: Mapping[str, Factory] = {
    "trainer.model:small_gpt": small_gpt,
    "trainer.hf:llama": hf.llama,  # transformers is imported only when one is built
    "trainer.hf:qwen2": hf.qwen2,
}


class ModelNotAllowed(ValueError):
    """The spec names a factory that is not on this node's allow-list."""


class BadModelSpec(ValueError):
    """The factory is allowed but rejected the config or returned something that is not a model."""


@dataclass(frozen=True)
class BuiltModel:
    module: nn.Module
    loss_fn: LossFn


def build(spec: ModelSpec, allow_list: Mapping[str, Factory] = DEFAULT_ALLOW_LIST) -> BuiltModel:
    """Instantiate the model and its loss; the loss defaults to next-byte cross-entropy."""
    factory = allow_list.get(spec.factory)
    if factory is None:
        raise ModelNotAllowed(f"model factory {spec.factory!r} is not on this node's allow-list")
    try:
        made = factory(**factory_config(spec))  # without the reserved `param_count`
    except (TypeError, ValueError) as e:
        raise BadModelSpec(f"{spec.factory}: {e}") from e
    module, loss_fn = made if isinstance(made, tuple) else (made, lm_loss)
    if not isinstance(module, nn.Module) or not callable(loss_fn):
        raise BadModelSpec(f"{spec.factory} must return an nn.Module or (nn.Module, loss_fn)")
    return BuiltModel(module, loss_fn)


def build_model(spec: ModelSpec, allow_list: Mapping[str, Factory] = DEFAULT_ALLOW_LIST) -> nn.Module:
    """The contract entry point: just the module (see `build` for the loss too)."""
    return build(spec, allow_list).module


# ---- how big a model is, and whether this machine can hold it (before anything is allocated) ----


class Holder(StrEnum):
    """What a process builds the model for, which decides the bytes per parameter it holds."""

    BUILD = "build"  # G_0 for `run create`: params + zero outer momentum
    HOST = "host"  # trains: params, grads and both AdamW moments, all float32
    VERIFIER = "verifier"  # the same per replay worker (`workers` models at once)


BYTES_PER_PARAM: dict[Holder, int] = {
    Holder.BUILD: FP32_BYTES + FP32_BYTES,
    Holder.HOST: STATE_BYTES_PER_PARAM + GRAD_BYTES_PER_PARAM,
    Holder.VERIFIER: STATE_BYTES_PER_PARAM + GRAD_BYTES_PER_PARAM,
}
"""Bytes per parameter resident on the training device at once, from what the node holds there:
float32 parameters (4) and, for an inner step, their gradients (4) and AdamW's exp_avg and
exp_avg_sq (4 + 4); G_0 is the parameters and a zero outer momentum (4 + 4). A floor, not the
peak: the global model G (8 B/param) is memory-mapped from disk, and spill buffers and fetched
states come on top (bench.scale measures peaks of 1.84x / 2.00x the 12 B/param training state for
host / verifier), so a node that passes may still need more, while one that fails cannot run."""


CUMULATIVE_BYTES_PER_PARAM = 2 * FP32_BYTES
"""A tolerance-mode verification that sums its opened segments' residuals (specs §6.4,
`verifier.tolerance.Cumulative`) keeps two float32 vectors of the parameters' size for the whole
verification, per replay worker, in host memory whatever the replay device."""


def sums_residuals(cfg: RunConfig) -> bool:
    """Whether a verification of this run keeps the summed-residual accumulators: tolerance mode
    with a summed-residual threshold set (unset, the checks and their 8 B/param are skipped)."""
    return cfg.replay_mode is ReplayMode.TOLERANCE and any(
        math.isfinite(t) for t in cfg.cumulative_tolerances.values()
    )


class ModelTooLarge(NodeError):
    """This machine cannot hold the run's model; nothing was allocated."""


def activation_floor(cfg: RunConfig, size: ModelSize) -> int:
    """Bytes a training step's forward must hold at least, for an architecture the chain counts:
    the float32 logits (batch·seq_len·vocab) and one saved residual stream per layer for backward
    (batch·seq_len·hidden each). 0 when the shape is unknown (a declared count)."""
    if size.vocab is None or size.hidden is None or size.layers is None:
        return 0
    return 4 * cfg.batch_size * cfg.seq_len * (size.vocab + size.layers * size.hidden)


def available_memory(device: torch.device | str = "cpu") -> int | None:
    """Bytes this process may still allocate on `device`: on CUDA the free device memory
    (`torch.cuda.mem_get_info`), on CPU the least of /proc/meminfo's MemAvailable and the cgroup's
    limit minus its usage (a container's limit is what the kernel enforces). None when unknown."""
    dev = torch.device(device)
    if dev.type == "cuda":
        try:
            return int(torch.cuda.mem_get_info(dev)[0])
        except (RuntimeError, AssertionError):
            return None
    if dev.type != "cpu":
        return None
    known = [v for v in (_meminfo_available(), _cgroup_room()) if v is not None]
    if not known:
        try:
            known.append(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
        except (ValueError, OSError, AttributeError):
            return None
    return min(known)


def _meminfo_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_room() -> int | None:
    """cgroup v2 (memory.max / memory.current) or v1 (limit_in_bytes / usage_in_bytes)."""
    for limit, usage in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
    ):
        try:
            text = Path(limit).read_text().strip()
            if text == "max":
                return None
            cap, used = int(text), int(Path(usage).read_text().strip())
        except (OSError, ValueError):
            continue
        if cap >= 1 << 60:  # v1 writes "no limit" as a huge number
            return None
        return max(0, cap - used)
    return None


def meta_param_count(spec: ModelSpec, allow_list: Mapping[str, Factory] = DEFAULT_ALLOW_LIST) -> int:
    """The model built on torch's meta device (shapes only, nothing allocated): the numel of
    `named_parameters()`, shared tensors once, exactly what a training state holds."""
    return sum(torch.Size(shape).numel() for shape in meta_layout(spec, allow_list).values())


def meta_layout(
    spec: ModelSpec, allow_list: Mapping[str, Factory] = DEFAULT_ALLOW_LIST
) -> dict[str, tuple[int, ...]]:
    """Parameter name -> shape of the model built on the meta device: the layout of a run's global
    model, known before a byte of it is allocated or fetched (whatever the model's size)."""
    factory = allow_list.get(spec.factory)
    if factory is None:
        raise ModelNotAllowed(f"model factory {spec.factory!r} is not on this node's allow-list")
    try:
        with torch.device("meta"):
            made = factory(**factory_config(spec))
    except (TypeError, ValueError, RuntimeError, NotImplementedError) as e:
        raise BadModelSpec(f"{spec.factory}: cannot build on the meta device: {e}") from e
    module = made[0] if isinstance(made, tuple) else made
    if not isinstance(module, nn.Module):
        raise BadModelSpec(f"{spec.factory} must return an nn.Module or (nn.Module, loss_fn)")
    return {n: tuple(p.shape) for n, p in module.named_parameters()}


def check_fits(
    cfg: RunConfig | ModelSpec,
    device: torch.device | str,
    holder: Holder,
    *,
    workers: int = 1,
    allow_list: Mapping[str, Factory] = DEFAULT_ALLOW_LIST,
    available: int | None = None,
) -> ModelSize:
    """Refuse, in one line naming the numbers, a run whose model this machine cannot hold, before
    anything is allocated; both nodes call it before building (`NodeError`). The count comes from
    the spec (`protocol.modelsize`: the chain's own count, or the declared `param_count`), is
    checked against memory, and then against a build on the meta device: they must agree. Needed:
    `BYTES_PER_PARAM[holder]` per parameter per model (`workers` replay models for a verifier) plus
    the activation floor, on `device`; off CPU each model is first built in host memory (4 B/param).
    A verifier of a run that sums residuals (`sums_residuals`) also holds its accumulators
    (`CUMULATIVE_BYTES_PER_PARAM` per worker) in host memory. `available` overrides the memory
    probe (tests). Given a bare `ModelSpec`, no activations and no accumulators count.
    """
    spec = cfg.model if isinstance(cfg, RunConfig) else cfg
    try:
        if spec.factory not in allow_list:
            raise ModelNotAllowed(f"model factory {spec.factory!r} is not on this node's allow-list")
        size = model_size(spec)
    except (ModelSizeError, ModelNotAllowed) as e:
        raise NodeError(f"run model {spec.factory}: {e}") from None
    dev = torch.device(device)
    models = max(1, workers) if holder is Holder.VERIFIER else 1
    floor = activation_floor(cfg, size) if isinstance(cfg, RunConfig) and holder is not Holder.BUILD else 0
    cpu = dev.type == "cpu"
    summed = holder is Holder.VERIFIER and isinstance(cfg, RunConfig) and sums_residuals(cfg)
    acc = CUMULATIVE_BYTES_PER_PARAM if summed else 0  # in host memory, on the device or not
    sums = f" + {acc} B/param summed residuals" if acc else ""
    held = BYTES_PER_PARAM[holder] + (acc if cpu else 0)
    gib = f"{floor / 2**30:,.1f} GiB activations"
    per = f"{models} x ({BYTES_PER_PARAM[holder]} B/param{sums if cpu else ''} + {gib})"
    _require(models * (held * size.params + floor), dev, size, holder, per, available)
    if not cpu:  # each model is built in host memory first, then moved; the sums stay there
        host = (FP32_BYTES + models * acc) * size.params
        why = f"{FP32_BYTES} B/param to build it" + (f", {models} x ({sums[3:]})" if acc else "")
        _require(host, torch.device("cpu"), size, holder, why, available)
    try:
        counted = meta_param_count(spec, allow_list)
    except (BadModelSpec, ModelNotAllowed) as e:
        raise NodeError(f"run model: {e}") from None
    if counted != size.params:
        what = "declares" if size.declared else "is counted at"
        raise NodeError(f"run model {spec.factory} {what} {size.params:,} parameters but builds {counted:,}")
    return size


def _require(
    needed: int, device: torch.device, size: ModelSize, holder: Holder, why: str, available: int | None
) -> None:
    room = available if available is not None else available_memory(device)
    if room is not None and needed > room:
        raise ModelTooLarge(
            f"run model {size.factory} has {size.params:,} parameters: a {holder.value} needs "
            f"{needed / 2**30:,.1f} GiB on {device} ({why}); this machine has "
            f"{room / 2**30:,.1f} GiB available"
        )


# ---- a model `gonka-diloco model export` wrote, loaded back (the built-in GPT has no other loader)

EXPORT_FORMAT = "gonka-diloco/model/v1"
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
EXPORT_KEY = "gonka_diloco"
"""config.json's section that says what the folder is: the format, the run's `ModelSpec`, provenance."""
MAX_EXPORT_CONFIG_BYTES = 1 << 20


class ExportedModelError(ValueError):
    """An exported model folder that cannot be loaded; the message names the file and why."""


def export_name(factory: str, name: str) -> str:
    """The name a parameter has in an exported model.safetensors: a `transformers` model's own
    (`model.layers.0…`, so `from_pretrained` loads it), else the project's."""
    return name.removeprefix("lm.") if factory in hf.FACTORIES else name


def exported_section(folder: Path | str) -> dict[str, object]:
    """config.json's `gonka_diloco` section, checked to be one this version reads."""
    path = Path(folder) / CONFIG_FILE
    if not Path(folder).is_dir():
        raise ExportedModelError(f"{folder}: no such model folder")
    try:
        if path.stat().st_size > MAX_EXPORT_CONFIG_BYTES:
            raise ExportedModelError(f"{path} is larger than {MAX_EXPORT_CONFIG_BYTES} bytes")
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        what = "is it a `gonka-diloco model export` folder?"
        raise ExportedModelError(f"{folder}: no {CONFIG_FILE} ({what})") from None
    except (OSError, ValueError) as e:
        raise ExportedModelError(f"{path}: not readable JSON ({e})") from None
    section = data.get(EXPORT_KEY) if isinstance(data, dict) else None
    if not isinstance(section, dict) or section.get("format") != EXPORT_FORMAT:
        raise ExportedModelError(f"{path}: no {EXPORT_KEY} section of format {EXPORT_FORMAT} (not an export)")
    return section


def load_exported(folder: Path | str, allow_list: Mapping[str, Factory] = DEFAULT_ALLOW_LIST) -> nn.Module:
    """The model of an exported folder in eval mode: built from its `ModelSpec` by a factory on
    `allow_list` (a folder never makes us import code), then filled tensor by tensor from
    model.safetensors (float32 whatever the file's dtype; names and shapes checked; no second copy
    of the model; never unpickled). Its forward is the training forward: `model(idx) -> logits`."""
    from safetensors import SafetensorError, safe_open

    section = exported_section(folder)
    config = Path(folder) / CONFIG_FILE
    try:
        spec = ModelSpec.model_validate(section.get("model_spec"))
    except ValueError as e:
        raise ExportedModelError(f"{config}: {EXPORT_KEY}.model_spec is not a model spec ({e})") from None
    try:
        model = build_model(spec, allow_list)
    except (ModelNotAllowed, BadModelSpec) as e:
        raise ExportedModelError(f"{config}: {e}") from None
    params = {export_name(spec.factory, n): p for n, p in model.named_parameters()}
    weights = Path(folder) / WEIGHTS_FILE
    try:
        with safe_open(str(weights), framework="pt") as f, torch.no_grad():
            keys = set(f.keys())
            if keys != set(params):
                odd = sorted(keys ^ set(params))
                raise ExportedModelError(
                    f"{weights}: its tensors are not the model's ({len(odd)} differ, e.g. {odd[:3]})"
                )
            for name in sorted(params):
                t = f.get_tensor(name)
                if tuple(t.shape) != tuple(params[name].shape) or not t.is_floating_point():
                    raise ExportedModelError(
                        f"{weights}: {name} is {t.dtype}{list(t.shape)}, the model needs "
                        f"float{list(params[name].shape)}"
                    )
                params[name].copy_(t)
                del t
    except FileNotFoundError:
        raise ExportedModelError(f"{folder}: no {WEIGHTS_FILE}") from None
    except (SafetensorError, OSError) as e:
        raise ExportedModelError(f"{weights}: not a readable safetensors file ({e})") from None
    return model.eval()
