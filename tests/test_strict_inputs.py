"""Numbers that two implementations could read differently are refused (specs §1).

Finite floats: every float anywhere in a `RunConfig` (model config values, both optimizers, the
tolerances, …) and every `double` on the wire must be finite; NaN and ±inf have no canonical JSON,
so a config holding one would hash differently elsewhere. Amounts: every amount string the chain
reads is 1–78 ASCII digits below 2^256, as Cosmos' `sdk.Int` (`int()` and `isdigit()` take other
scripts' digits, signs, spaces and underscores). Each refusal sits next to the honest value's success.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from cosmpy.protos.cosmos.bank.v1beta1 import tx_pb2 as bank_pb2
from google.protobuf import any_pb2
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from protocol.amounts import MAX_AMOUNT, parse_sdk_int
from protocol.config import ModelSpec, RunConfig
from protocol.keys import test_wallet
from protocol.messages import Coin, MsgCreateRun, MsgSend
from protocol.wire import WireError, from_any, to_any, to_proto

H = "0" * 64
A = str(test_wallet(1).address())
B = str(test_wallet(2).address())
NON_FINITE = [math.nan, math.inf, -math.inf]


def _config(**kw: Any) -> RunConfig:
    base: dict[str, Any] = {"model": {"factory": "trainer.model:small_gpt", "config": {"dropout": 0.1}},
                            "dataset_manifest_hash": H, "initial_model_hash": H}  # fmt: skip
    return RunConfig.model_validate({**base, **kw})


def _float_paths(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every float field of a config model, nested models included."""
    out = []
    for name, field in model.model_fields.items():
        ann = field.annotation
        if ann is float:
            out.append((*prefix, name))
        elif isinstance(ann, type) and issubclass(ann, BaseModel):
            out += _float_paths(ann, (*prefix, name))
    return out


FLOAT_FIELDS = _float_paths(RunConfig)


def _with(path: tuple[str, ...], value: float) -> dict[str, Any]:
    data: dict[str, Any] = {}
    node = data
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value
    return data


def test_every_float_of_a_run_config_is_covered() -> None:
    names = {".".join(p) for p in FLOAT_FIELDS}
    assert {"inner.lr", "inner.beta1", "inner.eps", "outer.lr", "outer.momentum", "tolerance",
            "tolerance_exp_avg", "tolerance_exp_avg_sq"} <= names  # fmt: skip


@pytest.mark.parametrize("path", FLOAT_FIELDS, ids=".".join)
@pytest.mark.parametrize("bad", NON_FINITE, ids=repr)
def test_a_non_finite_float_is_refused_naming_its_field(path: tuple[str, ...], bad: float) -> None:
    with pytest.raises(ValidationError) as refused:
        _config(**_with(path, bad))
    assert ".".join(path) in str(refused.value) and "finite" in str(refused.value)
    _config(**_with(path, _default(path)))  # the honest value of the same field


def _default(path: tuple[str, ...]) -> float:
    model: Any = RunConfig
    for key in path[:-1]:
        model = model.model_fields[key].annotation
    return float(model.model_fields[path[-1]].default)


@pytest.mark.parametrize("bad", NON_FINITE, ids=repr)
def test_a_non_finite_model_config_value_is_refused(bad: float) -> None:
    with pytest.raises(ValidationError, match=r"model\.config\.dropout"):
        _config(model={"factory": "trainer.model:small_gpt", "config": {"dropout": bad}})
    with pytest.raises(ValidationError, match="finite"):
        ModelSpec(factory="a:b", config={"x": bad})
    assert ModelSpec(factory="a:b", config={"x": 0.5, "nan": "nan"}).config["nan"] == "nan"  # a string


def test_wire_doubles_must_be_finite() -> None:
    """A second implementation sends a NaN lr or model-config double: the decoder refuses it by field."""
    msg = MsgCreateRun(creator=A, config=_config())
    assert from_any(to_any(msg)) == msg
    pb = to_proto(msg)
    pb.config.inner.lr = math.nan  # type: ignore[attr-defined]
    packed = any_pb2.Any(type_url=msg.type_url(), value=pb.SerializeToString())
    with pytest.raises(WireError, match=r"inference\.diloco\.InnerOptim\.lr is nan"):
        from_any(packed)
    pb = to_proto(msg)
    pb.config.model.config["dropout"].float_value = math.inf  # type: ignore[attr-defined]
    with pytest.raises(WireError, match="not finite"):
        from_any(any_pb2.Any(type_url=msg.type_url(), value=pb.SerializeToString()))


# ---- amounts ----------------------------------------------------------------------------------

BAD_AMOUNTS = ["", " 1", "1 ", "+1", "-1", "1_000", "0x10", "1e3", "1.0", "١٢٣", "１２３", "٣", "9" * 79,
               str(MAX_AMOUNT + 1), "1" * 5000]  # fmt: skip


@pytest.mark.parametrize("text", BAD_AMOUNTS, ids=lambda t: repr(t[:12]))
def test_amounts_are_ascii_digits_below_2_256(text: str) -> None:
    with pytest.raises(ValueError, match="amount"):
        parse_sdk_int(text)


def test_honest_amounts_parse() -> None:
    assert parse_sdk_int("0") == 0 and parse_sdk_int("007") == 7 and parse_sdk_int("123") == 123
    assert parse_sdk_int(str(MAX_AMOUNT)) == MAX_AMOUNT
    with pytest.raises(ValidationError):
        Coin(amount=MAX_AMOUNT + 1)


def _send_any(amount: str) -> any_pb2.Any:
    pb = bank_pb2.MsgSend(from_address=A, to_address=B)
    pb.amount.add(denom="ngonka", amount=amount)
    return any_pb2.Any(type_url=MsgSend.type_url(), value=pb.SerializeToString())


@pytest.mark.parametrize("text", BAD_AMOUNTS, ids=lambda t: repr(t[:12]))
def test_a_bank_send_with_a_non_canonical_amount_is_refused(text: str) -> None:
    with pytest.raises(WireError, match="amount"):
        from_any(_send_any(text))
    assert from_any(_send_any("5")) == MsgSend(from_address=A, to_address=B, amount=[Coin(amount=5)])


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.text(max_size=90))
def test_parse_sdk_int_agrees_with_the_definition(text: str) -> None:
    ok = 0 < len(text) <= 78 and all(c in "0123456789" for c in text) and int(text) <= MAX_AMOUNT
    try:
        value = parse_sdk_int(text)
    except ValueError:
        assert not ok
    else:
        assert ok and value == int(text)
