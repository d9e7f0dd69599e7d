"""Hugging Face `transformers` causal LMs (Llama- and Qwen2-style) as allow-listed model factories.

Built from a config only, with our own seeded initialisation (never weights from a hub: the hub
is switched off before `transformers` is imported, and a pretrained start comes in as an init
checkpoint whose hash the run carries). The config a run's `ModelSpec` holds is complete — every
number of the architecture plus the `transformers` version that defines its maths — so the spec
hash covers them all, and a node whose installed version differs refuses to build the model
rather than replaying different arithmetic. `transformers` is imported lazily: `--help` and the
chain process never pay for it.

Presets run from `tiny` (CI) to `1b`; `expand(factory, config)` turns `{preset = "tiny", …}` into
the full config (what `run create` and the devnet put on chain).
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

ARCHS = {"llama": ("LlamaConfig", "LlamaForCausalLM"), "qwen2": ("Qwen2Config", "Qwen2ForCausalLM")}
FACTORIES = {f"trainer.hf:{a}": a for a in ARCHS}
VERSION_KEY = "transformers_version"

PRESETS: dict[str, dict[str, int | float | bool]] = {
    # tiny ≈ 0.1M parameters with bytes (CI, devnet); small ≈ 0.6M (the convergence benchmark)
    "tiny": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "max_position_embeddings": 128, "vocab_size": 256},
    "small": {"hidden_size": 128, "intermediate_size": 344, "num_hidden_layers": 3, "num_attention_heads": 4,
              "num_key_value_heads": 2, "max_position_embeddings": 256, "vocab_size": 256},
    "125m": {"hidden_size": 768, "intermediate_size": 2048, "num_hidden_layers": 12,
             "num_attention_heads": 12, "num_key_value_heads": 12, "max_position_embeddings": 2048,
             "vocab_size": 32_000},
    # Llama-3.2-1B's body with a 32k vocabulary, untied: ≈1.1B parameters
    "1b": {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
           "num_key_value_heads": 8, "max_position_embeddings": 4096, "vocab_size": 32_000},
}  # fmt: skip

DEFAULTS: dict[str, int | float | bool | str] = {
    "rope_theta": 10_000.0,
    "rms_norm_eps": 1e-6,
    "initializer_range": 0.02,
    "tie_word_embeddings": False,  # one name per tensor in the flat training state
    "attn_implementation": "sdpa",
    "seed": 0,
}
ARCH_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
             "num_key_value_heads", "max_position_embeddings")  # fmt: skip
KEYS = frozenset({*ARCH_KEYS, *DEFAULTS, VERSION_KEY})


def _offline() -> None:
    """Nothing is ever fetched: set before `transformers` (and `huggingface_hub`) is imported."""
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        os.environ.setdefault(var, "1")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")


def installed_version() -> str:
    """The installed `transformers` version, read without importing it."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("transformers")
    except PackageNotFoundError:
        raise ValueError("the transformers package is not installed (pip install transformers)") from None


def expand(factory: str, config: Mapping[str, Any]) -> dict[str, Any]:
    """The complete config of a `trainer.hf:*` spec: preset, then defaults, then what was given,
    pinned to the installed `transformers` version unless the config already names one."""
    if factory not in FACTORIES:
        return dict(config)
    cfg = dict(config)
    preset = cfg.pop("preset", None)
    if preset is not None and preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; one of {sorted(PRESETS)}")
    out: dict[str, Any] = {**DEFAULTS, **PRESETS.get(str(preset), {}), **cfg}
    out.setdefault(VERSION_KEY, installed_version())
    return out


def spec_config(arch: str, preset: str, **overrides: Any) -> dict[str, Any]:
    """The full config dict for `trainer.hf:<arch>` from a preset (tests, devnet, benchmarks)."""
    return expand(f"trainer.hf:{arch}", {"preset": preset, **overrides})


class CausalLM(nn.Module):
    """`forward(idx) -> logits` around a `transformers` causal LM (the replayable step's contract)."""

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, idx: Tensor) -> Tensor:
        return self.lm(input_ids=idx, use_cache=False).logits


def _check(config: Mapping[str, Any]) -> None:
    unknown = set(config) - KEYS
    if "preset" in config:
        raise ValueError("a run's model config must be complete: expand the preset (run create does)")
    if unknown:
        raise ValueError(f"unknown config keys: {sorted(unknown)}")
    missing = [k for k in (*ARCH_KEYS, VERSION_KEY) if k not in config]
    if missing:
        raise ValueError(f"config lacks {missing}")
    for k in ARCH_KEYS:
        if not isinstance(config[k], int) or isinstance(config[k], bool) or config[k] < 1:
            raise ValueError(f"{k} must be a positive integer")
    if config["hidden_size"] % config["num_attention_heads"]:
        raise ValueError("hidden_size must be a multiple of num_attention_heads")
    if config["num_attention_heads"] % config["num_key_value_heads"]:
        raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
    have = installed_version()
    if config[VERSION_KEY] != have:
        raise ValueError(
            f"the run's model is defined by transformers {config[VERSION_KEY]}, this node has {have}: "
            "install that version (different versions may compute different bits)"
        )


def hf_config(arch: str, **config: Any) -> Any:
    """The `transformers` config (e.g. `LlamaConfig`) of a complete, version-checked config: what
    `build` instantiates, and what an exported model's config.json holds."""
    full = {**DEFAULTS, **config}
    _check(full)
    _offline()
    hf_cfg = _transformers_class(ARCHS[arch][0])(
        **{k: full[k] for k in ARCH_KEYS}, rms_norm_eps=float(full["rms_norm_eps"]),
        initializer_range=float(full["initializer_range"]),
        tie_word_embeddings=bool(full["tie_word_embeddings"]), use_cache=False,
        rope_parameters={"rope_type": "default", "rope_theta": float(full["rope_theta"])},
    )  # fmt: skip
    hf_cfg._attn_implementation = str(full["attn_implementation"])
    return hf_cfg


def build(arch: str, **config: Any) -> CausalLM:
    """The model for a complete, version-checked config, initialised from `seed` alone."""
    full = {**DEFAULTS, **config}
    hf_cfg = hf_config(arch, **config)
    model_cls = _transformers_class(ARCHS[arch][1])
    with _BUILD_LOCK, torch.random.fork_rng(devices=[]), _no_init():  # HF's init is replaced below
        torch.manual_seed(0)
        model = CausalLM(model_cls(hf_cfg).float())
    _init_weights(model, int(full["seed"]), float(full["initializer_range"]), int(full["num_hidden_layers"]))
    return model


_BUILD_LOCK = threading.Lock()
"""One build at a time inside `no_init_weights` and `fork_rng`: both swap process-wide state (torch's
init functions, the global RNG) and put back what they found on exit, so two threads inside them at
once (a host and a verifier in one process, a verifier's replay pool) left the no-op init functions
in place for good: every later `nn.Linear` in the process started from uninitialised memory. The
same lock guards transformers' lazy first import, which another thread can see half done
("module 'transformers' has no attribute 'LlamaConfig'")."""


def _transformers_class(name: str) -> Any:
    """`transformers.<name>`, resolved under `_BUILD_LOCK` (see there)."""
    with _BUILD_LOCK:
        import transformers

        return getattr(transformers, name)


def _no_init():  # -> a context manager
    try:
        from transformers.initialization import no_init_weights

        return no_init_weights()
    except ImportError:  # older transformers: let it initialise, we overwrite every tensor
        import contextlib

        return contextlib.nullcontext()


@torch.no_grad()
def _init_weights(model: nn.Module, seed: int, std: float, layers: int) -> None:
    """Our init, independent of the library's: N(0, std) matrices (output projections scaled by
    1/√(2L), GPT-2 style), ones for norms, zeros for biases, from a local generator in name order."""
    g = torch.Generator().manual_seed(seed)
    proj_std = std / math.sqrt(2 * max(1, layers))
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            p.fill_(1.0)
        elif name.endswith(".bias"):
            p.zero_()
        else:
            s = proj_std if name.endswith(("o_proj.weight", "down_proj.weight")) else std
            p.copy_(torch.randn(p.shape, generator=g) * s)


def llama(**config: Any) -> CausalLM:
    """`trainer.hf:llama` — a Llama-style decoder (RMSNorm, RoPE, SwiGLU, GQA)."""
    return build("llama", **config)


def qwen2(**config: Any) -> CausalLM:
    """`trainer.hf:qwen2` — Qwen2-style (Llama plus q/k/v biases)."""
    return build("qwen2", **config)


def hf_names(model: nn.Module) -> dict[str, str]:
    """Our parameter name -> the name in a Hugging Face checkpoint of the same model."""
    return {n: n.removeprefix("lm.") for n, _ in model.named_parameters()}
