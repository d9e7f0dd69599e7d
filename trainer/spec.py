"""Resolve a chain's `ModelSpec` against the node's OWN allow-list.

A chain may name any "module:callable"; a node must never import code because a chain said so.
Only factories the operator listed are instantiated. Users bring their own model by adding
their factory to the allow-list they pass in; the factory returns an `nn.Module` whose
`forward(idx)` gives logits, or a `(module, loss_fn)` pair when next-byte cross-entropy is not
the right loss.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from torch import Tensor, nn

from protocol.config import ModelSpec
from trainer import hf
from trainer.model import lm_loss, small_gpt

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
        made = factory(**spec.config)
    except (TypeError, ValueError) as e:
        raise BadModelSpec(f"{spec.factory}: {e}") from e
    module, loss_fn = made if isinstance(made, tuple) else (made, lm_loss)
    if not isinstance(module, nn.Module) or not callable(loss_fn):
        raise BadModelSpec(f"{spec.factory} must return an nn.Module or (nn.Module, loss_fn)")
    return BuiltModel(module, loss_fn)


def build_model(spec: ModelSpec, allow_list: Mapping[str, Factory] = DEFAULT_ALLOW_LIST) -> nn.Module:
    """The contract entry point: just the module (see `build` for the loss too)."""
    return build(spec, allow_list).module
