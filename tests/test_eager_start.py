"""The eager start (specs §2.2.1, `nodekit.eager.EagerStart`): computed tensor by tensor on access,
it has exactly the bits of the whole-model `protocol.outer.eager_start` on the decoded parent Δ, from
a G read from disk as well as from memory, and a parent payload that does not fit is refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from nodekit.eager import eager_start
from nodekit.globalmodel import GlobalModel, GlobalStore
from nodekit.store import ContentStore
from protocol.codecs import CodecError, decode, encode
from protocol.config import Codec, OuterOptim
from protocol.outer import eager_scale, outer_update
from protocol.outer import eager_start as start_params


def _g() -> GlobalModel:
    gen = torch.Generator().manual_seed(5)
    shapes = {"a.weight": (7, 5), "b.bias": (5,), "c": (3, 3, 2)}
    params = {k: torch.randn(s, generator=gen) for k, s in shapes.items()}
    momentum = {k: torch.randn(s, generator=gen) * 0.1 for k, s in shapes.items()}
    return GlobalModel.create(params, momentum)


@pytest.mark.parametrize("codec", [Codec.INT8, Codec.FP32])
def test_eager_start_is_bitwise_the_whole_model_outer_update(tmp_path: Path, codec: Codec) -> None:
    gm = _g()
    gen = torch.Generator().manual_seed(9)
    delta = {k: torch.randn(t.shape, generator=gen) * 0.01 for k, t in gm.params.items()}
    payload = encode(delta, codec, 64)
    outer = OuterOptim(lr=0.7, momentum=0.9)
    want = start_params(gm.params, gm.momentum, decode(payload, gm.layout), 0.7, 0.9)
    alpha = torch.tensor(float(eager_scale(0.7, 0.9)))  # 1 / (0.7 · 1.9), rounded once to float32
    scaled = {k: torch.mul(t, alpha) for k, t in decode(payload, gm.layout).items()}
    plain, _ = outer_update(gm.params, gm.momentum, [("h", 1, scaled)], 0.7, 0.9)
    assert all(torch.equal(plain[k], want[k]) for k in want)  # the outer step with α·Δ as the aggregate
    unit, _ = outer_update(gm.params, gm.momentum, [("h", 1, decode(payload, gm.layout))], 1.0, 0.0)
    one = start_params(gm.params, gm.momentum, decode(payload, gm.layout), 1.0, 0.0)  # α = 1 when lr(1+μ) ≤ 1
    assert all(torch.equal(unit[k], one[k]) for k in one)
    store = GlobalStore(ContentStore(tmp_path), gm.layout)
    store.save(gm)
    for g in (gm, store.load(gm.hash)):  # in memory, and read from disk tensor by tensor
        start = eager_start(g, payload, outer)
        assert list(start) == sorted(want) and start.shapes == dict(gm.layout)
        for name in [*sorted(want), "c", "a.weight"]:  # in order, then backwards: the cursor restarts
            assert torch.equal(start[name], want[name]), name
    assert not torch.equal(want["c"], gm.params["c"])


def test_eager_start_refuses_a_parent_that_does_not_fit() -> None:
    gm = _g()
    other = encode({"a.weight": torch.zeros(7, 5)}, Codec.INT8, 64)
    with pytest.raises(CodecError, match="layout"):
        eager_start(gm, other, OuterOptim())
    with pytest.raises(CodecError):
        eager_start(gm, b"not a payload", OuterOptim())
