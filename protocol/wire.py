"""Protobuf wire form of the module's messages: pydantic model ⇄ proto ⇄ `google.protobuf.Any`.

Transactions carry messages as `Any` (type URL `/inference.diloco.MsgXxx`, or cosmos bank's
`/cosmos.bank.v1beta1.MsgSend`). Everything that comes off the wire passes the same pydantic
validation as a locally built message, so a node never acts on a value its models would
refuse; every failure on the way in is a `WireError`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from enum import Enum
from typing import Any

from cosmpy.protos.cosmos.bank.v1beta1 import tx_pb2 as bank_pb2
from google.protobuf import any_pb2
from google.protobuf.message import DecodeError, Message
from google.protobuf.unknown_fields import UnknownFieldSet
from pydantic import BaseModel, ValidationError

from protocol import messages as m
from protocol.amounts import parse_sdk_int
from protocol.proto import tx_pb2

MAX_MSG_BYTES = 1 << 20
"""Largest encoded message accepted by `from_any` (a reveal with 1024 openings is ≈ 0.5 MB)."""

_INT64 = (-(1 << 63), (1 << 63) - 1)


class WireError(ValueError):
    """A message cannot be encoded, or wire bytes do not decode to a valid message."""


_PROTO_OF: dict[type[BaseModel], type[Message]] = {
    **{cls: getattr(tx_pb2, cls.__name__) for cls in m.DILOCO_MSGS},
    m.MsgSend: bank_pb2.MsgSend,
}
_MODEL_OF: dict[str, type[BaseModel]] = {cls.type_url(): cls for cls in _PROTO_OF}  # type: ignore[attr-defined]


def type_urls() -> list[str]:
    """Every type URL `from_any` accepts."""
    return sorted(_MODEL_OF)


# ---- model → proto ---------------------------------------------------------------------------


def _set_config_value(pb: Message, value: Any) -> None:
    if isinstance(value, bool):
        pb.bool_value = value
    elif isinstance(value, int):
        if not _INT64[0] <= value <= _INT64[1]:
            raise WireError(f"model config integer {value} does not fit int64")
        pb.int_value = value
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise WireError(f"model config value {value!r} is not finite")
        pb.float_value = value
    elif isinstance(value, str):
        pb.string_value = value
    else:
        raise WireError(f"unsupported model config value {value!r}")


def _fill(pb: Message, data: Mapping[str, Any]) -> None:
    """Copy a `model_dump()` dict into `pb`, field by field (names are identical by design)."""
    for name, value in data.items():
        if isinstance(value, Mapping) and name == "config" and pb.DESCRIPTOR.full_name.endswith("ModelSpec"):
            for key, item in value.items():
                _set_config_value(pb.config[key], item)
        elif isinstance(value, Mapping):
            _fill(getattr(pb, name), value)
        elif isinstance(value, list):
            field = getattr(pb, name)
            for item in value:
                if isinstance(item, Mapping):
                    _fill(field.add(), item)
                else:
                    field.append(item)
        elif isinstance(value, Enum):
            setattr(pb, name, value.value)
        else:
            setattr(pb, name, value)


def to_proto(msg: m.AnyMsg) -> Message:
    """The protobuf message for a typed message; `WireError` if a value does not fit its field."""
    proto_cls = _PROTO_OF.get(type(msg))
    if proto_cls is None:
        raise WireError(f"no wire form for {type(msg).__name__}")
    data = msg.model_dump()
    if isinstance(msg, m.MsgSend):
        data["amount"] = [{"denom": c["denom"], "amount": str(c["amount"])} for c in data["amount"]]
    pb = proto_cls()
    try:
        _fill(pb, data)
    except (TypeError, ValueError) as exc:  # out-of-range integers, bad strings
        raise WireError(f"{type(msg).__name__}: {exc}") from exc
    return pb


def to_any(msg: m.AnyMsg) -> any_pb2.Any:
    """`Any` with type URL `/<full name>` and deterministic bytes (map keys sorted)."""
    pb = to_proto(msg)
    return any_pb2.Any(type_url=msg.type_url(), value=pb.SerializeToString(deterministic=True))


# ---- proto → model ---------------------------------------------------------------------------


def _read(pb: Message) -> dict[str, Any]:
    """Set fields of `pb` as a dict; unset sub-messages are left out so pydantic decides."""
    if len(UnknownFieldSet(pb)):
        raise WireError(f"{pb.DESCRIPTOR.full_name} carries unknown fields")
    out: dict[str, Any] = {}
    for field in pb.DESCRIPTOR.fields:
        value = getattr(pb, field.name)
        if field.message_type is None:
            if field.type == field.TYPE_DOUBLE and not math.isfinite(value):
                name = f"{pb.DESCRIPTOR.full_name}.{field.name}"
                raise WireError(f"{name} is {value!r}: doubles must be finite")
            out[field.name] = list(value) if field.label == field.LABEL_REPEATED else value
        elif field.message_type.GetOptions().map_entry:
            out[field.name] = {k: _config_value(v) for k, v in value.items()}
        elif field.label == field.LABEL_REPEATED:
            out[field.name] = [_read(item) for item in value]
        elif pb.HasField(field.name):
            out[field.name] = _read(value)
    return out


def _config_value(pb: Message) -> Any:
    if len(UnknownFieldSet(pb)):
        raise WireError("model config value carries unknown fields")
    kind = pb.WhichOneof("kind")
    if kind is None:
        raise WireError("model config value is empty")
    value = getattr(pb, kind)
    if kind == "float_value" and not math.isfinite(value):
        raise WireError(f"model config value {value!r} is not finite")
    return value


def from_any(any_pb: any_pb2.Any) -> m.AnyMsg:
    """Decode and validate one message; the only exception it raises is `WireError`.

    Total on purpose: the chain decodes every tx's messages with it in CheckTx, ProcessProposal and
    FinalizeBlock, where anything but a rejection would stop a validator. A validator written to
    raise another error (a bug) is still a refusal of these bytes, the same on every node; only
    `MemoryError`, a fact about this machine rather than the bytes, is let through."""
    try:
        return _from_any(any_pb)
    except (WireError, MemoryError):
        raise
    except Exception as exc:  # the decoder's boundary: bytes in, a message or WireError out
        raise WireError(f"undecodable message ({type(exc).__name__})") from exc


def _from_any(any_pb: any_pb2.Any) -> m.AnyMsg:
    type_url = getattr(any_pb, "type_url", None)
    value = getattr(any_pb, "value", None)
    if not isinstance(type_url, str) or not isinstance(value, bytes):
        raise WireError("expected a google.protobuf.Any")
    model_cls = _MODEL_OF.get(type_url)
    if model_cls is None:
        raise WireError(f"unknown message type {type_url[:120]!r}")
    if len(value) > MAX_MSG_BYTES:
        raise WireError(f"{type_url}: {len(value)} bytes exceeds the {MAX_MSG_BYTES}-byte limit")
    pb = _PROTO_OF[model_cls]()
    try:
        pb.ParseFromString(value)
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise WireError(f"{type_url}: undecodable bytes ({exc})") from exc
    data = _read(pb)
    if model_cls is m.MsgSend:  # amounts are decimal strings on the wire: sdk.Int's strict form
        try:
            data["amount"] = [{**c, "amount": parse_sdk_int(c.get("amount", ""))} for c in data["amount"]]
        except ValueError as exc:
            raise WireError(f"{type_url}: {exc}") from exc
    try:
        return model_cls.model_validate(data)  # type: ignore[return-value]
    except ValidationError as exc:
        raise WireError(f"{type_url}: invalid message: {exc.errors(include_url=False)[:3]}") from exc
