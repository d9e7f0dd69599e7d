"""The small GPT: shapes, causality, seeded init, and the allow-list that guards model specs."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from protocol.config import ModelSpec
from replay.model import GPT, GPTConfig, lm_loss, small_gpt
from replay.spec import BadModelSpec, ModelNotAllowed, build, build_model

TINY = dict(n_layer=2, n_head=2, n_embd=32, block_size=32)


def test_forward_shapes_and_initial_loss_near_uniform() -> None:
    m = small_gpt(**TINY)
    idx = torch.randint(0, 256, (4, 32), generator=torch.Generator().manual_seed(1))
    logits = m(idx)
    assert logits.shape == (4, 32, 256)
    loss = lm_loss(logits, idx).detach()
    assert abs(float(loss) - torch.log(torch.tensor(256.0)).item()) < 0.2


def test_attention_is_causal() -> None:
    m = small_gpt(**TINY).eval()
    a = torch.randint(0, 256, (1, 16), generator=torch.Generator().manual_seed(2))
    b = a.clone()
    b[0, 10:] = (b[0, 10:] + 1) % 256
    assert torch.equal(m(a)[0, :10], m(b)[0, :10])
    assert not torch.equal(m(a)[0, 10:], m(b)[0, 10:])


def test_init_depends_only_on_seed_not_global_rng() -> None:
    torch.manual_seed(123)
    a = small_gpt(**TINY, seed=7)
    torch.manual_seed(456)
    b = small_gpt(**TINY, seed=7)
    c = small_gpt(**TINY, seed=8)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not torch.equal(sa["wte.weight"], sc["wte.weight"])


def test_bad_config_and_too_long_input_are_named_errors() -> None:
    with pytest.raises(ValueError, match="multiple of n_head"):
        GPT(GPTConfig(n_head=3, n_embd=32))
    with pytest.raises(ValueError, match="unknown GPT config"):
        small_gpt(n_layers=2)
    with pytest.raises(ValueError, match="exceeds block_size"):
        small_gpt(**TINY)(torch.zeros(1, 33, dtype=torch.long))


def test_spec_resolves_only_allow_listed_factories() -> None:
    spec = ModelSpec(factory="trainer.model:small_gpt", config=TINY)
    assert isinstance(build_model(spec), GPT)
    with pytest.raises(ModelNotAllowed):
        build_model(ModelSpec(factory="os:system", config={}))
    with pytest.raises(BadModelSpec):
        build_model(ModelSpec(factory="trainer.model:small_gpt", config={"n_head": 3}))


def test_user_model_with_its_own_loss() -> None:
    def mse(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return ((out - y) ** 2).mean()

    def toy(width: int) -> tuple[nn.Module, object]:
        return nn.Linear(width, 1), mse

    built = build(ModelSpec(factory="mine:toy", config={"width": 3}), {"mine:toy": toy})
    assert isinstance(built.module, nn.Linear)
    assert built.loss_fn is mse
    with pytest.raises(BadModelSpec, match=r"nn\.Module"):
        build(ModelSpec(factory="mine:bad", config={}), {"mine:bad": lambda: 42})
