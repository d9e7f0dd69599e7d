"""Start a run from a checkpoint: a safetensors file or a local Hugging Face model folder → G_0.

G_0 is the checkpoint's parameters as float32 with zero outer momentum; its hash is the run's
`initial_model_hash`. The conversion is deterministic, so every node that holds the checkpoint
computes the same bytes, and nodes that do not fetch G_0 from peers by that hash like any
global model. Accepted forms, matched by name and shape against the run's model:
- a global model file (`param/<n>`, `momentum/<n>`: what every node keeps in `global/`): a
  finished run's final model, whose parameters start the next run;
- a state dict with the model's own names, or a Hugging Face checkpoint's names
  (`model.layers.…`, `lm_head.weight`), in one file or a folder of (sharded) `*.safetensors`.
Tensors are read one at a time (`safe_open`), never unpickled.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from torch import Tensor, nn

from nodekit.globalmodel import MOMENTUM, PARAM, GlobalModel
from nodekit.node import NodeError
from protocol.chunks import DEFAULT_CHUNK_BYTES

MAX_CONFIG_BYTES = 1 << 20


class CheckpointError(ValueError):
    """The checkpoint is missing, unreadable, or does not fit the run's model."""


def checkpoint_files(source: Path) -> list[Path]:
    """The safetensors files of a checkpoint file or folder (sorted, so shards read in order)."""
    if source.is_file():
        return [source]
    if source.is_dir():
        files = sorted(source.glob("*.safetensors"))
        if files:
            return files
        raise CheckpointError(f"{source}: no *.safetensors in this folder (only safetensors are read)")
    raise CheckpointError(f"{source}: no such checkpoint file or folder")


def _tied(source: Path) -> bool:
    """A Hugging Face folder whose config ties the output head to the input embedding."""
    cfg = source / "config.json" if source.is_dir() else None
    if cfg is None or not cfg.is_file() or cfg.stat().st_size > MAX_CONFIG_BYTES:
        return False
    try:
        return bool(json.loads(cfg.read_bytes()).get("tie_word_embeddings", False))
    except (ValueError, OSError):
        return False


def load_params(model: nn.Module, source: Path | str) -> dict[str, Tensor]:
    """The checkpoint's tensors for every parameter of `model`, by name, float32, shape-checked."""
    source = Path(source)
    want = {n: tuple(p.shape) for n, p in model.named_parameters()}
    aliases: dict[str, str] = {}
    for n in want:  # a checkpoint may use our names, global-model names or Hugging Face names
        for alias in (n, PARAM + n, n.removeprefix("lm.")):
            aliases.setdefault(alias, n)
    found: dict[str, Tensor] = {}
    try:
        for path in checkpoint_files(source):
            with safe_open(str(path), framework="pt") as f:
                for key in f.keys():  # noqa: SIM118 - safe_open is not a Mapping
                    name = aliases.get(key)
                    if name is None or key.startswith(MOMENTUM):
                        continue
                    if name in found:
                        raise CheckpointError(f"{path}: {name} appears twice in the checkpoint")
                    found[name] = f.get_tensor(key)
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{source}: not a readable safetensors checkpoint ({e})") from e
    head, embed = "lm.lm_head.weight", "lm.model.embed_tokens.weight"
    if head in want and head not in found and embed in found and _tied(source):
        found[head] = found[embed]
    missing = sorted(set(want) - set(found))
    if missing:
        raise CheckpointError(f"{source} lacks {len(missing)} of the model's tensors, e.g. {missing[:3]}")
    out = {}
    for n, shape in want.items():
        t = found[n]
        if tuple(t.shape) != shape:
            raise CheckpointError(f"{source}: {n} is {list(t.shape)}, the run's model needs {list(shape)}")
        if not t.is_floating_point():
            raise CheckpointError(f"{source}: {n} is {t.dtype}, not a floating-point tensor")
        t = t.to(torch.float32)
        if not bool(torch.isfinite(t).all()):
            raise CheckpointError(f"{source}: {n} holds NaN or Inf")
        out[n] = t
    return out


def initial_global(
    model: nn.Module, checkpoint: Path | str = "", chunk_bytes: int = DEFAULT_CHUNK_BYTES
) -> GlobalModel:
    """G_0 of a run: the checkpoint's parameters if one is given, else the model's own (seeded) ones;
    zero outer momentum either way. Its hash is a chunked content hash: the run's chunk size."""
    if not checkpoint:
        return GlobalModel.from_module(model, chunk_bytes)
    return GlobalModel.create(load_params(model, checkpoint), chunk_bytes=chunk_bytes)


def node_initial_global(
    initial_hash: str, model: nn.Module, checkpoint: str, chunk_bytes: int = DEFAULT_CHUNK_BYTES
) -> GlobalModel:
    """G_0 as a node starts: from its `init_checkpoint` if it has one (which must be the run's),
    else the seeded model's. A node with neither fetches G_0 from peers by hash."""
    try:
        g0 = initial_global(model, checkpoint, chunk_bytes)
    except CheckpointError as e:
        raise NodeError(f"init_checkpoint: {e}") from e
    if checkpoint and g0.hash != initial_hash:
        raise NodeError(
            f"init_checkpoint {checkpoint} gives G_0 {g0.hash[:12]}, the run's is {initial_hash[:12]}"
        )
    return g0
