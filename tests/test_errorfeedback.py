"""Error feedback (specs §4.1): the step's exact definition, the carried e's hash, the verifier's
rebuild, every forger of the adversary library caught next to an honest host, and the run config."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from gonka_diloco.adversaries.sparse import EF_FORGERS
from protocol import codecs
from protocol.config import EF_DECAY, Codec, ModelSpec, OuterOptim, OuterRule, RunConfig
from protocol.errorfeedback import (
    EFConfig,
    EFError,
    check_ef,
    ef_hash,
    ef_step,
    ef_tensors,
    fresh_ef,
    fresh_ef_hash,
    verify_ef_step,
)
from protocol.outer import f32_nearest
from protocol.tensors import StateKind, tensor_hash

SHAPES = {"a.w": (40, 30), "b": (17,), "c": (3, 3)}
CFG = EFConfig(chunk=64, topk=4, decay=0.95)


def rand(seed: int, scale: float = 1.0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {n: torch.randn(s, generator=g) * scale for n, s in SHAPES.items()}


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


def test_step_is_its_definition() -> None:
    e, delta = rand(1, 0.1), rand(2, 0.01)
    payload, e_next = ef_step(e, delta, CFG)
    beta = torch.tensor(float(f32_nearest(Fraction(0.95))))
    a = {n: torch.add(torch.mul(e[n], beta), delta[n]) for n in SHAPES}
    assert payload == codecs.encode(a, Codec.SPARSE, 64, 4)  # the payload is C(β·e + Δ)
    sent = dict(codecs.iter_sparse(payload, SHAPES))
    for n in SHAPES:
        want = a[n].clone().reshape(-1)
        pos = sent[n].positions
        want[pos] = torch.sub(want[pos], sent[n].values)  # e_next = a − decode(C(a)), kept positions only
        assert torch.equal(bits(e_next[n].reshape(-1)), bits(want))
        kept = torch.zeros(want.numel(), dtype=torch.bool)
        kept[pos] = True
        assert torch.equal(bits(e_next[n].reshape(-1)[~kept]), bits(a[n].reshape(-1)[~kept]))
    assert e_next.keys() == delta.keys()


def test_no_accumulator_is_zeros_and_streaming_is_the_same() -> None:
    delta = rand(3, 0.01)
    p0, e0 = ef_step(None, delta, CFG)
    p1, e1 = ef_step(fresh_ef(SHAPES), delta, CFG)
    assert p0 == p1 and all(torch.equal(bits(e0[n]), bits(e1[n])) for n in SHAPES)
    e = rand(4, 0.1)
    payload, e_next = ef_step(e, delta, CFG)
    order = sorted(SHAPES, key=str.encode)
    streamed = list(ef_tensors(((n, delta[n]) for n in order), e.__getitem__, SHAPES, CFG))  # a loader
    assert [t.name for t in streamed] == order
    assert codecs.payload_header("sparse", 64, SHAPES, 4) + b"".join(t.body for t in streamed) == payload
    assert all(torch.equal(bits(t.e_next), bits(e_next[t.name])) for t in streamed)


def test_accumulator_hash_is_its_own_kind() -> None:
    e = rand(5)
    assert ef_hash(e) == tensor_hash(e, StateKind.ERROR_FEEDBACK)
    assert ef_hash(e) not in {tensor_hash(e, k) for k in StateKind if k is not StateKind.ERROR_FEEDBACK}
    assert fresh_ef_hash(SHAPES) == ef_hash(fresh_ef(SHAPES))
    assert fresh_ef_hash(SHAPES, 256) == ef_hash(fresh_ef(SHAPES), 256) != fresh_ef_hash(SHAPES)


def test_bad_accumulators_are_ef_errors() -> None:
    delta = rand(6, 0.01)
    bad = rand(7)
    bad["b"] = torch.zeros(16)
    with pytest.raises(EFError, match="shape"):
        ef_step(bad, delta, CFG)
    nan = rand(7)
    nan["c"][0, 0] = float("nan")
    with pytest.raises(EFError, match="NaN"):
        check_ef(nan, SHAPES)
    with pytest.raises(EFError, match="missing"):
        check_ef({"b": torch.zeros(17)}, SHAPES)
    huge = {n: torch.full(s, 3e38) for n, s in SHAPES.items()}
    with pytest.raises(codecs.CodecError, match="overflows"):
        ef_step(huge, huge, EFConfig(64, 4, 1.0))


def _check(e: dict[str, torch.Tensor] | None, delta: dict[str, torch.Tensor], payload: bytes,
           e_next: dict[str, torch.Tensor]) -> bool:  # fmt: skip
    order = sorted(SHAPES, key=str.encode)
    mine = ((n, delta[n]) for n in order)
    out = verify_ef_step(e, mine, SHAPES, CFG, delta_hash=codecs.delta_hash(payload),
                         ef_hash_committed=ef_hash(e_next))  # fmt: skip
    return out.ok


@pytest.mark.parametrize("name", sorted(EF_FORGERS))
def test_every_forger_is_caught_next_to_the_honest_host(name: str) -> None:
    e, delta = ef_step(None, rand(8, 0.01), CFG)[1], rand(9, 0.01)  # an accumulator after one step
    honest_payload, honest_e = ef_step(e, delta, CFG)
    assert _check(e, delta, honest_payload, honest_e)
    payload, e_next = EF_FORGERS[name](e, delta, CFG)
    codecs.decode(payload, SHAPES)  # valid-looking: it decodes, sizes are the layout's
    assert len(payload) == len(honest_payload)
    assert not _check(e, delta, payload, e_next)
    out = verify_ef_step(e, sorted(delta.items()), SHAPES, CFG, delta_hash=codecs.delta_hash(payload),
                         ef_hash_committed=ef_hash(e_next))  # fmt: skip
    assert out.detail and out.payload == honest_payload  # the verifier derived (and serves) the honest one


def test_dropping_the_accumulator_is_honest_only_while_it_is_zero() -> None:
    delta = rand(10, 0.01)
    assert _check(None, delta, *EF_FORGERS["ef_dropped"](None, delta, CFG))


def test_sparse_runs_catch_a_forger_by_replay() -> None:
    """The in-process protocol (real committed training, replay and the EF rebuild): a host sending
    plausible but wrong indices is rejected every step after its accumulator fills; the honest
    host next to it is accepted every step."""
    from bench.sim import Setup, run_diloco
    from replay.step import configure_determinism

    configure_determinism(1)
    st = Setup(hosts=2, inner_steps=10, outer_steps=2, segment_len=5, eval_batches=1, codec="sparse",
               codec_chunk=256, outer_rule="average", outer_lr=1.0)  # fmt: skip
    out = run_diloco(st, verify=True, adversaries=1, ef_attack="topk_shifted")
    assert out["verdicts"] == {"honest:ACCEPT": 2, "adversary:DELTA_MISMATCH": 2}


# ---------------------------------------------------------------- run config


def _cfg(**kw: object) -> RunConfig:
    return RunConfig(model=ModelSpec(factory="trainer.model:small_gpt"), dataset_manifest_hash="0" * 64,
                     initial_model_hash="0" * 64, **kw)  # type: ignore[arg-type]  # fmt: skip


def test_config_defaults_keep_every_existing_hash() -> None:
    base = _cfg()
    dump = base.model_dump(mode="json")
    assert "codec_topk" not in dump and "codec_ef_decay" not in dump and "rule" not in dump["outer"]
    assert _cfg(outer=OuterOptim(rule=OuterRule.NESTEROV)).config_hash() == base.config_hash()
    sparse = _cfg(codec="sparse", codec_block_size=4096, codec_topk=64, codec_ef_decay=0.95,
                  outer=OuterOptim(lr=1.0, rule="average"))  # fmt: skip
    d = sparse.model_dump(mode="json")
    assert (d["codec_topk"], d["codec_ef_decay"], d["outer"]["rule"]) == (64, 0.95, "average")
    assert RunConfig.model_validate(d) == sparse
    assert EFConfig.of(sparse) == EFConfig(4096, 64, 0.95)
    assert _cfg(codec="sparse", codec_block_size=4096).sparse_topk == 64  # 0 = C/64
    assert RunConfig.model_validate({**d, "codec_ef_decay": 0.0, "outer": {"lr": 1.0, "rule": ""}}) == \
        sparse.model_copy(update={"codec_ef_decay": EF_DECAY, "outer": OuterOptim(lr=1.0)})  # proto3 unset
    # β's default is issue 37's measured best, omitted at it; β = 1 (the default before) is written out
    assert EF_DECAY == 0.9 and _cfg(codec="sparse").codec_ef_decay == EF_DECAY
    assert _cfg(codec="sparse", codec_ef_decay=1.0).model_dump(mode="json")["codec_ef_decay"] == 1.0


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"codec_topk": 4}, "apply to codec 'sparse' only"),
        ({"codec_ef_decay": 0.5}, "apply to codec 'sparse' only"),
        ({"codec": "sparse", "codec_block_size": 1 << 17}, "65536"),
        ({"codec": "sparse", "codec_block_size": 64, "codec_topk": 65}, "exceeds codec_block_size"),
        ({"codec": "sparse", "codec_ef_decay": 1.5}, "less than or equal"),
    ],
)
def test_config_rejects_inconsistent_sparse_settings(kw: dict[str, object], match: str) -> None:
    with pytest.raises(ValidationError, match=match):
        _cfg(**kw)
    with pytest.raises(EFError, match="needs codec 'sparse'"):
        EFConfig.of(_cfg())


def test_beta_is_rounded_once_to_float32() -> None:
    assert EFConfig(64, 4, 0.95).beta.item() == float(np.float32(0.95))
    assert EFConfig(64, 4, 1.0).beta.item() == 1.0


def test_sparse_config_round_trips_the_wire_and_defaults_keep_their_bytes() -> None:
    from protocol.messages import MsgCreateRun
    from protocol.wire import from_any, to_any

    creator = "gonka1" + "q" * 38
    sparse = _cfg(codec="sparse", codec_block_size=4096, codec_topk=64, codec_ef_decay=0.95,
                  outer=OuterOptim(lr=1.0, rule="average"))  # fmt: skip
    back = from_any(to_any(MsgCreateRun(creator=creator, config=sparse)))
    assert back.config == sparse and back.config.config_hash() == sparse.config_hash()  # type: ignore[union-attr]
    unset = _cfg(codec="sparse", codec_block_size=4096)  # k, β, rule unset: proto3 zeros read as defaults
    assert from_any(to_any(MsgCreateRun(creator=creator, config=unset))).config == unset  # type: ignore[union-attr]
    plain = to_any(MsgCreateRun(creator=creator, config=_cfg())).value
    assert b"sparse" not in plain and b"nesterov" not in plain  # today's configs: the same wire bytes
