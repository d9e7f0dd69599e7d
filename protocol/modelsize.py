"""How big a run's model is, from its `ModelSpec` alone: exact parameter and tensor counts.

The chain refuses a run whose model no node could hold (`MsgCreateRun`, specs §2.4), and a node
refuses to build one it cannot hold (`replay.spec.check_fits`), both before anything is
allocated. Neither may import a model library, so the counts of the allow-listed factories are
written out here analytically — exact, the numel that `named_parameters()` of the built module
sums to (tests/test_model_bounds.py builds the real modules and compares). A factory the chain does
not know cannot be counted: its spec must declare its count in the reserved config key
`param_count` (nodes check the declaration on the meta device before allocating, and it is never
passed to the factory); a known factory may declare it too, and must then declare it exactly.

Every rule the factories themselves enforce on their config (positive integers, divisible
heads, known keys, a complete Hugging Face config) is checked here as well, so the chain refuses
a run that no node would build instead of recording it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from protocol.config import ModelSpec

PARAM_COUNT_KEY = "param_count"
"""Reserved `ModelSpec.config` key: the declared parameter count (required for factories this
module cannot count; never passed to the factory)."""

SMALL_GPT = "trainer.model:small_gpt"
HF_LLAMA = "trainer.hf:llama"
HF_QWEN2 = "trainer.hf:qwen2"


class ModelSizeError(ValueError):
    """The spec cannot be counted: an unknown factory without a declared count, or a config that
    its factory would refuse (missing, mistyped or inconsistent architecture fields)."""


@dataclass(frozen=True)
class ModelSize:
    """What a node must hold for this model, known before it is built.

    `params`: the sum of numel over `named_parameters()` (shared tensors once), the number every
    per-parameter cost (training state, G, Δ) multiplies. `tensors`: how many parameter tensors
    (each one a Python object, a header entry in every canonical state, a name in the training
    state). The shape fields (`hidden`, `layers`, `vocab`, `context`) are None for a declared count.
    """

    factory: str
    params: int
    tensors: int | None = None
    hidden: int | None = None
    layers: int | None = None
    vocab: int | None = None
    context: int | None = None

    @property
    def declared(self) -> bool:
        return self.tensors is None


def _int(config: Mapping[str, Any], key: str, default: int | None = None, *, low: int = 1) -> int:
    value = config.get(key, default)
    if value is None:
        raise ModelSizeError(f"config lacks {key}")
    if isinstance(value, bool) or not isinstance(value, int):
        raise ModelSizeError(f"{key} must be an integer, not {value!r}"[:200])
    if value < low:
        raise ModelSizeError(f"{key} must be >= {low}, not {value}")
    return value


def _real(config: Mapping[str, Any], key: str, default: float) -> float:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ModelSizeError(f"{key} must be a finite number, not {value!r}"[:200])
    return float(value)


def _bool(config: Mapping[str, Any], key: str, default: bool) -> bool:
    value = config.get(key, default)
    if not isinstance(value, bool):
        raise ModelSizeError(f"{key} must be true or false, not {value!r}"[:200])
    return value


def _known_keys(config: Mapping[str, Any], known: frozenset[str]) -> None:
    unknown = sorted(set(config) - known)
    if unknown:
        raise ModelSizeError(f"unknown config keys: {unknown}"[:300])


# ---- trainer.model:small_gpt (replay/model.py: GPTConfig and GPT) ------------------------------

_GPT_KEYS = frozenset({"n_layer", "n_head", "n_embd", "block_size", "vocab_size", "dropout", "bias", "seed"})


def small_gpt_size(config: Mapping[str, Any]) -> ModelSize:
    """wte V·E + wpe T·E + L blocks + ln_f + untied lm_head V·E. A block: ln_1 and ln_2 (E each),
    c_attn 3E², attn c_proj E², c_fc 4E², mlp c_proj 4E²; with `bias` every Linear and LayerNorm
    adds its bias (3E + E + 4E + E, and E per LayerNorm). Defaults are GPTConfig's."""
    _known_keys(config, _GPT_KEYS)
    n_layer, n_head = _int(config, "n_layer", 4), _int(config, "n_head", 4)
    e, t, v = _int(config, "n_embd", 128), _int(config, "block_size", 128), _int(config, "vocab_size", 256)
    if e % n_head:
        raise ModelSizeError(f"n_embd {e} must be a multiple of n_head {n_head}")
    dropout = _real(config, "dropout", 0.0)
    if not 0.0 <= dropout < 1.0:
        raise ModelSizeError(f"dropout must be in [0, 1), not {dropout}")
    bias = _bool(config, "bias", False)
    _int(config, "seed", 0, low=-(1 << 63))
    b = int(bias)
    per_layer = 12 * e * e + 2 * e + b * (2 * e + 3 * e + e + 4 * e + e)
    params = v * e + t * e + n_layer * per_layer + e * (1 + b) + v * e
    tensors = 2 + n_layer * 6 * (1 + b) + (1 + b) + 1
    return ModelSize(SMALL_GPT, params, tensors, hidden=e, layers=n_layer, vocab=v, context=t)


# ---- trainer.hf:llama / trainer.hf:qwen2 (replay/hf.py: the complete config) -------------------

HF_ARCH_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "max_position_embeddings")  # fmt: skip
_HF_KEYS = frozenset(
    {*HF_ARCH_KEYS, "rope_theta", "rms_norm_eps", "initializer_range", "tie_word_embeddings",
     "attn_implementation", "seed", "transformers_version"}
)  # fmt: skip


def hf_size(config: Mapping[str, Any], *, qkv_bias: bool, factory: str) -> ModelSize:
    """embed V·h + L layers + final norm h + lm_head V·h. A layer: q and o h², k and v h·kv·d
    (d = h / heads), gate/up/down 3·h·I, two RMSNorms h; Qwen2 adds q, k, v biases.

    The head is counted untied whatever `tie_word_embeddings` says, because that is what
    `replay.hf.build` builds: transformers 5 ties weights in the initialisation that the build
    skips (`_no_init`), so the flag changes the config hash but not the model (pinned by
    tests/test_model_bounds.py against real builds)."""
    if "preset" in config:
        raise ModelSizeError("a run's model config must be complete: expand the preset (run create does)")
    _known_keys(config, _HF_KEYS)
    v, h, inter, layers, heads, kv, positions = (_int(config, k) for k in HF_ARCH_KEYS)
    if h % heads:
        raise ModelSizeError(f"hidden_size {h} must be a multiple of num_attention_heads {heads}")
    if heads % kv:
        raise ModelSizeError(f"num_attention_heads {heads} must be a multiple of num_key_value_heads {kv}")
    if not isinstance(config.get("transformers_version"), str):
        raise ModelSizeError("config lacks transformers_version")
    for key, default in (("rope_theta", 10_000.0), ("rms_norm_eps", 1e-6), ("initializer_range", 0.02)):
        _real(config, key, default)
    _bool(config, "tie_word_embeddings", False)
    if not isinstance(config.get("attn_implementation", "sdpa"), str):
        raise ModelSizeError("attn_implementation must be a string")
    _int(config, "seed", 0, low=-(1 << 63))
    kv_dim = kv * (h // heads)
    per_layer = 2 * h * h + 2 * h * kv_dim + 3 * h * inter + 2 * h + (h + 2 * kv_dim if qkv_bias else 0)
    params = v * h + layers * per_layer + h + v * h
    tensors = 1 + layers * (9 + (3 if qkv_bias else 0)) + 1 + 1
    return ModelSize(factory, params, tensors, hidden=h, layers=layers, vocab=v, context=positions)


COUNTERS: dict[str, Callable[[Mapping[str, Any]], ModelSize]] = {
    SMALL_GPT: small_gpt_size,
    HF_LLAMA: lambda c: hf_size(c, qkv_bias=False, factory=HF_LLAMA),
    HF_QWEN2: lambda c: hf_size(c, qkv_bias=True, factory=HF_QWEN2),
}
"""The factories whose size the chain computes itself (the default allow-list)."""


def factory_config(spec: ModelSpec) -> dict[str, Any]:
    """The keyword config the factory is called with: the spec's, without the reserved key."""
    return {k: v for k, v in spec.config.items() if k != PARAM_COUNT_KEY}


def model_size(spec: ModelSpec) -> ModelSize:
    """The spec's exact size; `ModelSizeError` if it cannot be known from the spec."""
    declared = spec.config.get(PARAM_COUNT_KEY)
    if declared is not None and (isinstance(declared, bool) or not isinstance(declared, int) or declared < 1):
        raise ModelSizeError(f"{PARAM_COUNT_KEY} must be a positive integer, not {declared!r}"[:200])
    counter = COUNTERS.get(spec.factory)
    if counter is None:
        if declared is None:
            raise ModelSizeError(f"not a factory the chain can count: declare config.{PARAM_COUNT_KEY}")
        return ModelSize(spec.factory, declared)
    size = counter(factory_config(spec))
    if declared is not None and declared != size.params:
        raise ModelSizeError(f"{PARAM_COUNT_KEY} {declared} is not the model's {size.params} parameters")
    return size
