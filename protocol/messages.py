"""The module's messages (proto package `inference.diloco`) as pydantic models.

These are the typed form every node works with; `protocol.wire` maps each one to and from its
protobuf form (`/inference.diloco.MsgXxx` inside a Cosmos `Any`). Field names are the proto
field names, snake_case, signer first as `creator`.
"""

from __future__ import annotations

import re
from decimal import Decimal
from enum import IntEnum, StrEnum
from typing import Annotated, Any, Literal

from pydantic import Field, model_serializer, model_validator

from protocol.amounts import MAX_AMOUNT
from protocol.config import Codec, Frozen, Hex32, RunConfig
from protocol.envclass import replay_class

Address = Annotated[str, Field(pattern=r"^gonka1[02-9ac-hj-np-z]{38,58}$")]
"""A bech32 account address with the `gonka` prefix."""

PROTO_PACKAGE = "inference.diloco"
MAX_REPORTED_HOSTS = 10_000
"""Most hosts one `MsgReportUnavailable` names (the default participant limit per run)."""


class Role(StrEnum):
    HOST = "host"
    VERIFIER = "verifier"


class Reason(IntEnum):
    """Why a verifier rejects. 0 is acceptance; each reject reason has its own code."""

    ACCEPT = 0
    BAD_PROOF = 1
    WRONG_START = 2
    REPLAY_MISMATCH = 3
    DELTA_MISMATCH = 4
    MISSING_DATA = 5
    MALFORMED_BLOB = 6
    BAD_TOKENS = 7
    BAD_ENVIRONMENT = 8


class EnvFingerprint(Frozen):
    """Where a trajectory was computed: the machine facts that decide its bits, and its replay class.

    `replay_class` is derived (`protocol.envclass.replay_class`): left empty it is filled in, given
    it must equal the derivation, so a fingerprint can never claim another class than its fields.
    """

    torch_version: str = Field(max_length=64)
    threads: int = Field(ge=1, le=256)
    deterministic: bool = True
    device: str = Field("cpu", max_length=32, description="device type: cpu | cuda")
    micro_batches: int = Field(1, ge=1, le=1024, description="data-parallel slices per step (DDP ranks)")
    torch_git: str = Field("", max_length=64, description="torch.version.git_version")
    cpu_capability: str = Field("", max_length=32, description="torch.backends.cpu.get_cpu_capability()")
    gpu_name: str = Field("", max_length=128)
    compute_capability: str = Field("", max_length=16, pattern=r"^(\d{1,3}\.\d{1,3})?$")
    sm_count: int = Field(0, ge=0, le=1 << 20)
    cuda_version: str = Field("", max_length=32)
    cudnn_version: str = Field("", max_length=32)
    nccl_version: str = Field("", max_length=32)
    replay_class: str = Field("", pattern=r"^([0-9a-f]{64})?$")

    @model_validator(mode="after")
    def _derive_class(self) -> EnvFingerprint:
        derived = replay_class(self.model_dump(exclude={"replay_class"}))
        if not self.replay_class:
            object.__setattr__(self, "replay_class", derived)  # frozen: set once, at validation
        elif self.replay_class != derived:
            raise ValueError(f"replay_class {self.replay_class[:12]} is not the class of these fields")
        return self


class Msg(Frozen):
    creator: Address

    @classmethod
    def type_url(cls) -> str:
        return f"/{PROTO_PACKAGE}.{cls.__name__}"


class MsgCreateRun(Msg):
    config: RunConfig


class MsgJoinRun(Msg):
    run_id: int = Field(ge=1)
    role: Role
    endpoint: str = Field(max_length=256, pattern=r"^https?://")
    stake: int = Field(ge=0)
    replay_class: str = Field("", pattern=r"^([0-9a-f]{64})?$")
    """A verifier's own replay class (§6.1; empty: undeclared). In bitwise mode the chain draws a
    commitment's verifiers from those declaring its class (`chain.module.DrawPools`)."""


class MsgLeaveRun(Msg):
    run_id: int = Field(ge=1)


class MsgCommitPseudoGradient(Msg):
    run_id: int = Field(ge=1)
    outer_step: int = Field(ge=0)
    base_model_hash: Hex32
    trajectory_root: Hex32
    leaf_count: int = Field(ge=2)
    delta_hash: Hex32
    final_optimizer_hash: Hex32
    codec: Codec
    tokens: int = Field(ge=0)
    env: EnvFingerprint
    final_ef_hash: str = Field("", pattern=r"^(?:[0-9a-f]{64})?$")
    """Codec sparse: the hash of the error-feedback accumulator e_next the host carries on
    (specs §4.1); empty for every other codec, so a dense commit's wire bytes are unchanged."""

    @model_serializer(mode="wrap")
    def _omit_empty_ef(self, handler: Any) -> dict[str, Any]:
        """`final_ef_hash` is in the dump only when set: dense commits dump as they always did."""
        data: dict[str, Any] = handler(self)
        if not self.final_ef_hash:
            data.pop("final_ef_hash", None)
        return data


class SegmentOpening(Frozen):
    """Both ends of one sampled segment, with the proof that binds them to the trajectory root."""

    segment: int = Field(ge=0)
    start_leaf: Hex32
    end_leaf: Hex32
    proof: list[Hex32] = Field(max_length=64)


class MsgRevealContribution(Msg):
    run_id: int = Field(ge=1)
    outer_step: int = Field(ge=0)
    openings: list[SegmentOpening] = Field(max_length=1024)


class MsgSubmitVerdict(Msg):
    run_id: int = Field(ge=1)
    outer_step: int = Field(ge=0)
    host: Address
    reason: Reason
    evidence_hash: Hex32
    detail: str = Field("", max_length=256)

    @property
    def accept(self) -> bool:
        return self.reason is Reason.ACCEPT


MAX_VAL_LOSS_PPM = 10**15
"""Largest validation loss a vote may carry: 1e9 nats, in millionths (an integer: no floats on chain)."""


class MsgSubmitOuterResult(Msg):
    run_id: int = Field(ge=1)
    outer_step: int = Field(ge=0)
    model_hash: Hex32
    val_loss_ppm: int = Field(0, ge=0, le=MAX_VAL_LOSS_PPM)
    """The voter's validation loss of the `model_hash` it votes for, in millionths of a nat per token
    (its validation split, the run's fixed evaluation batches; 0 = not given). Informational: the
    chain stores it with the vote so a report can read a run's loss after its nodes exited; it takes
    part in no decision, and a report uses the median over the votes for the adopted model."""


class MsgReportUnavailable(Msg):
    """An accepted host could not fetch these accepted hosts' Δs from anyone (author, verifiers,
    peers) before the result deadline. A majority of the accepted weight naming a host drops its Δ
    from the round's set and slashes it for withholding (specs/protocol.md §2.7)."""

    run_id: int = Field(ge=1)
    outer_step: int = Field(ge=0)
    hosts: list[Address] = Field(min_length=1, max_length=MAX_REPORTED_HOSTS)

    @model_validator(mode="after")
    def _distinct_others(self) -> MsgReportUnavailable:
        if len(set(self.hosts)) != len(self.hosts):
            raise ValueError("hosts must be distinct")
        if self.creator in self.hosts:
            raise ValueError("a host cannot report its own Δ unavailable")
        return self


class Coin(Frozen):
    denom: Literal["ngonka"] = "ngonka"
    amount: int = Field(ge=0, le=MAX_AMOUNT)  # sdk.Int: 256 bits (protocol.amounts)


NGONKA_PER_GNK = 10**9
_AMOUNT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(gnk|ngonka)?\s*$", re.IGNORECASE)


def parse_amount(text: str) -> int:
    """An amount as operators type it — `20GNK`, `1.5gnk`, `5000000000ngonka`, or a bare integer of
    ngonka — in ngonka (1 GNK = 1e9 ngonka); ValueError naming the text otherwise."""
    match = _AMOUNT.match(text or "")
    if match is None:
        raise ValueError(f"amount {text!r}: expected e.g. 20GNK, 1.5GNK or 5000000000ngonka")
    number, unit = match.group(1), (match.group(2) or "ngonka").lower()
    value = Decimal(number) * (NGONKA_PER_GNK if unit == "gnk" else 1)
    if value != value.to_integral_value():
        raise ValueError(f"amount {text!r} is not a whole number of ngonka")
    return int(value)


def format_amount(ngonka: int) -> str:
    """ngonka as GNK for people (`20GNK`, `0.5GNK`); exact, no float rounding."""
    whole, frac = divmod(ngonka, NGONKA_PER_GNK)
    return f"{whole}{'.' + str(frac).rjust(9, '0').rstrip('0') if frac else ''}GNK"


class MsgSend(Frozen):
    """Cosmos bank `MsgSend` (`/cosmos.bank.v1beta1.MsgSend`), in the same typed form."""

    from_address: Address
    to_address: Address
    amount: list[Coin] = Field(min_length=1, max_length=4)

    @classmethod
    def type_url(cls) -> str:
        return "/cosmos.bank.v1beta1.MsgSend"

    @property
    def creator(self) -> str:
        return self.from_address


DILOCO_MSGS: tuple[type[Msg], ...] = (
    MsgCreateRun,
    MsgJoinRun,
    MsgLeaveRun,
    MsgCommitPseudoGradient,
    MsgRevealContribution,
    MsgSubmitVerdict,
    MsgSubmitOuterResult,
    MsgReportUnavailable,
)
AnyMsg = (
    MsgCreateRun
    | MsgJoinRun
    | MsgLeaveRun
    | MsgCommitPseudoGradient
    | MsgRevealContribution
    | MsgSubmitVerdict
    | MsgSubmitOuterResult
    | MsgReportUnavailable
    | MsgSend
)
