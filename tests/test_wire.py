"""Wire form: exact round trips through `Any`, cosmpy packing, and a fuzzed decoder."""

from __future__ import annotations

import contextlib
import math

import pytest
from cosmpy.aerial.tx import SigningCfg, Transaction, TxFee
from cosmpy.crypto.keypairs import PrivateKey
from cosmpy.protos.cosmos.bank.v1beta1.tx_pb2 import MsgSend as BankMsgSend
from google.protobuf import any_pb2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol import messages as m
from protocol.config import (
    Codec,
    InnerOptim,
    ModelSpec,
    Moments,
    OuterOptim,
    Phases,
    ReplayMode,
    RunConfig,
    Stake,
)
from protocol.proto import tx_pb2
from protocol.wire import MAX_MSG_BYTES, WireError, from_any, to_any, to_proto, type_urls

BECH32 = "qpzry9x8gf2tvdw0s3jn54khce6mua7l"
addresses = st.text(alphabet=BECH32, min_size=38, max_size=58).map(lambda s: "gonka1" + s)
hex32 = st.binary(min_size=32, max_size=32).map(bytes.hex)
u32 = st.integers(0, 2**32 - 1)
pos = st.integers(1, 2**40)
positive_float = st.floats(min_value=1e-30, max_value=1e30, allow_nan=False)
unit = st.floats(min_value=0.0, max_value=1.0, exclude_max=True, allow_nan=False)
config_values = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
    st.booleans(),
)


@st.composite
def run_configs(draw: st.DrawFn) -> RunConfig:
    k = draw(st.integers(1, 10))
    n = draw(st.integers(1, 20))
    epoch = draw(st.integers(1, 10_000))
    mode = draw(st.sampled_from(ReplayMode))
    tolerance = positive_float if mode is ReplayMode.TOLERANCE else st.sampled_from([0.0, 0.5])
    return RunConfig(
        name=draw(st.text(min_size=1, max_size=64)),
        model=ModelSpec(
            factory=draw(st.sampled_from(["trainer.model:gpt", "a.b:c_1"])),
            config=draw(st.dictionaries(st.text(max_size=10), config_values, max_size=5)),
        ),
        dataset_manifest_hash=draw(hex32),
        initial_model_hash=draw(hex32),
        seed=draw(st.integers(0, 2**63 - 1)),
        inner_steps=k * n,
        segment_len=k,
        sampled_segments=draw(st.integers(1, n)),
        verifiers_per_contribution=draw(st.integers(1, 16)),
        audit_bps=draw(st.integers(0, 10_000)),
        audit_verifiers=draw(st.integers(1, 64)),
        codec=draw(st.sampled_from(Codec)),
        inner=InnerOptim(
            lr=draw(positive_float),
            weight_decay=draw(unit),
            beta1=draw(unit),
            beta2=draw(unit),
            eps=draw(positive_float),
            grad_clip=draw(positive_float),
            warmup_steps=draw(u32),
            # either format on the wire; tolerance mode needs fp32 (its thresholds' moments)
            moments=Moments.FP32 if mode is ReplayMode.TOLERANCE else draw(st.sampled_from(Moments)),
        ),
        outer=OuterOptim(lr=draw(positive_float), momentum=draw(unit)),
        phases=Phases(
            epoch_length=epoch,
            poc_window=draw(st.integers(0, epoch - 1)),
            train_blocks=draw(pos),
            result_rounds=draw(st.integers(1, 100)),
        ),
        stake=Stake(
            min_host_stake=draw(st.integers(0, 2**64 - 1)),
            host_slash_bps=draw(st.integers(0, 10_000)),
            fraud_host_slash_bps=draw(st.integers(0, 10_000)),
        ),
        replay_mode=mode,
        tolerance=draw(tolerance),
        tolerance_exp_avg=draw(tolerance),
        tolerance_exp_avg_sq=draw(tolerance),
        threads=draw(st.integers(1, 256)),
    )


env = st.builds(
    m.EnvFingerprint,
    torch_version=st.text(max_size=64),
    threads=st.integers(1, 256),
    deterministic=st.booleans(),
    device=st.text(max_size=32),
)
openings = st.builds(
    m.SegmentOpening, segment=u32, start_leaf=hex32, end_leaf=hex32, proof=st.lists(hex32, max_size=6)
)
any_msg = st.one_of(
    st.builds(m.MsgCreateRun, creator=addresses, config=run_configs()),
    st.builds(
        m.MsgJoinRun,
        creator=addresses,
        run_id=pos,
        role=st.sampled_from(m.Role),
        endpoint=st.text(max_size=40).map(lambda s: "http://" + s),
        stake=st.integers(0, 2**64 - 1),
    ),
    st.builds(m.MsgLeaveRun, creator=addresses, run_id=pos),
    st.builds(
        m.MsgCommitPseudoGradient,
        creator=addresses,
        run_id=pos,
        outer_step=u32,
        base_model_hash=hex32,
        trajectory_root=hex32,
        leaf_count=st.integers(2, 10_000),
        delta_hash=hex32,
        final_optimizer_hash=hex32,
        codec=st.sampled_from(Codec),
        tokens=st.integers(0, 2**64 - 1),
        env=env,
    ),
    st.builds(
        m.MsgRevealContribution,
        creator=addresses,
        run_id=pos,
        outer_step=u32,
        openings=st.lists(openings, max_size=4),
    ),
    st.builds(
        m.MsgSubmitVerdict,
        creator=addresses,
        run_id=pos,
        outer_step=u32,
        host=addresses,
        reason=st.sampled_from(m.Reason),
        evidence_hash=hex32,
        detail=st.text(max_size=256),
    ),
    st.builds(m.MsgSubmitOuterResult, creator=addresses, run_id=pos, outer_step=u32, model_hash=hex32),
    st.lists(addresses, min_size=2, max_size=6, unique=True).flatmap(
        lambda a: st.builds(
            m.MsgReportUnavailable, creator=st.just(a[0]), run_id=pos, outer_step=u32, hosts=st.just(a[1:])
        )
    ),
    st.builds(
        m.MsgSend,
        from_address=addresses,
        to_address=addresses,
        amount=st.lists(st.builds(m.Coin, amount=st.integers(0, 10**30)), min_size=1, max_size=4),
    ),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(any_msg)
def test_round_trip_is_exact(msg: m.AnyMsg) -> None:
    packed = to_any(msg)
    assert packed.type_url == msg.type_url()
    back = from_any(packed)
    assert back == msg and type(back) is type(msg)
    assert to_any(back).value == packed.value  # deterministic bytes
    if isinstance(msg, m.MsgCreateRun):
        assert back.config.config_hash() == msg.config.config_hash()


def test_float_fields_survive_bit_exactly() -> None:
    cfg = next_config(lr=0.1 + 0.2, momentum=math.nextafter(0.9, 0))
    back = from_any(to_any(m.MsgCreateRun(creator=ADDR, config=cfg)))
    assert isinstance(back, m.MsgCreateRun)
    assert back.config.outer.lr == 0.1 + 0.2 and back.config.outer.momentum == math.nextafter(0.9, 0)


ADDR = "gonka1" + "q" * 38
H = "ab" * 32


def next_config(lr: float = 0.7, momentum: float = 0.9) -> RunConfig:
    return RunConfig(
        model=ModelSpec(factory="trainer.model:gpt", config={"n_layer": 2, "dropout": 0.0, "act": "gelu"}),
        dataset_manifest_hash=H,
        initial_model_hash=H,
        outer=OuterOptim(lr=lr, momentum=momentum),
    )


def test_type_urls_and_full_names() -> None:
    assert type_urls() == sorted([*(c.type_url() for c in m.DILOCO_MSGS), "/cosmos.bank.v1beta1.MsgSend"])
    assert tx_pb2.MsgCommitPseudoGradient.DESCRIPTOR.full_name == "inference.diloco.MsgCommitPseudoGradient"
    send = m.MsgSend(from_address=ADDR, to_address=ADDR, amount=[m.Coin(amount=1)])
    assert isinstance(to_proto(send), BankMsgSend)


def test_cosmpy_packs_our_messages_with_module_type_url() -> None:
    msg = m.MsgLeaveRun(creator=ADDR, run_id=3)
    tx = Transaction()
    tx.add_message(to_proto(msg))
    key = PrivateKey(bytes(range(1, 33)))
    tx.seal(SigningCfg.direct(key.public_key, 0), fee=TxFee(amount="0ngonka", gas_limit=0))
    tx.sign(key, "gonka-devnet", 0)
    tx.complete()
    packed = tx.tx.body.messages[0]
    assert packed.type_url == "/inference.diloco.MsgLeaveRun"
    assert from_any(packed) == msg


def test_bank_send_from_cosmpy_bytes() -> None:
    raw = BankMsgSend(from_address=ADDR, to_address=ADDR)
    raw.amount.add(denom="ngonka", amount="123")
    packed = any_pb2.Any()
    packed.Pack(raw, type_url_prefix="/")
    assert from_any(packed) == m.MsgSend(from_address=ADDR, to_address=ADDR, amount=[m.Coin(amount=123)])


def _any(type_url: str, pb: object) -> any_pb2.Any:
    return any_pb2.Any(type_url=type_url, value=pb.SerializeToString())  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("type_url", "pb"),
    [
        ("/inference.diloco.MsgLeaveRun", tx_pb2.MsgLeaveRun(creator=ADDR, run_id=0)),  # run_id >= 1
        ("/inference.diloco.MsgLeaveRun", tx_pb2.MsgLeaveRun(creator="cosmos1abc", run_id=1)),
        ("/inference.diloco.MsgCreateRun", tx_pb2.MsgCreateRun(creator=ADDR)),  # config missing
        ("/inference.diloco.MsgSubmitVerdict", tx_pb2.MsgSubmitVerdict(creator=ADDR, run_id=1, reason=99)),
        ("/inference.diloco.MsgSubmitOuterResult", tx_pb2.MsgSubmitOuterResult(creator=ADDR, run_id=1)),
        ("/cosmos.bank.v1beta1.MsgSend", BankMsgSend(from_address=ADDR, to_address=ADDR)),  # no coins
        ("/inference.diloco.MsgLeaveRunX", tx_pb2.MsgLeaveRun()),
        ("type.googleapis.com/inference.diloco.MsgLeaveRun", tx_pb2.MsgLeaveRun(creator=ADDR, run_id=1)),
    ],
)
def test_invalid_messages_are_wire_errors(type_url: str, pb: object) -> None:
    with pytest.raises(WireError):
        from_any(_any(type_url, pb))


def test_bad_bank_amount_and_denom() -> None:
    for denom, amount in (("ngonka", "12x"), ("uatom", "5"), ("ngonka", "-5")):
        raw = BankMsgSend(from_address=ADDR, to_address=ADDR)
        raw.amount.add(denom=denom, amount=amount)
        with pytest.raises(WireError):
            from_any(_any("/cosmos.bank.v1beta1.MsgSend", raw))


def test_empty_model_config_value_and_unknown_fields_refused() -> None:
    pb = to_proto(m.MsgCreateRun(creator=ADDR, config=next_config()))
    pb.config.model.config["empty"].Clear()  # type: ignore[attr-defined]
    with pytest.raises(WireError, match="empty"):
        from_any(_any("/inference.diloco.MsgCreateRun", pb))
    extra = tx_pb2.MsgLeaveRun(creator=ADDR, run_id=1).SerializeToString() + b"\xa0\x06\x01"  # field 100
    with pytest.raises(WireError, match="unknown"):
        from_any(any_pb2.Any(type_url="/inference.diloco.MsgLeaveRun", value=extra))


def test_oversized_and_non_any_input() -> None:
    with pytest.raises(WireError, match="limit"):
        from_any(any_pb2.Any(type_url="/inference.diloco.MsgLeaveRun", value=b"\x00" * (MAX_MSG_BYTES + 1)))
    with pytest.raises(WireError):
        from_any(b"not an any")  # type: ignore[arg-type]


def test_unencodable_values_are_wire_errors() -> None:
    cfg = RunConfig(
        model=ModelSpec(factory="a:b", config={"huge": 2**70}), dataset_manifest_hash=H, initial_model_hash=H
    )
    with pytest.raises(WireError, match="int64"):
        to_any(m.MsgCreateRun(creator=ADDR, config=cfg))
    with pytest.raises(WireError):
        to_any(m.MsgJoinRun(creator=ADDR, run_id=1, role=m.Role.HOST, endpoint="http://x", stake=2**64))


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([*type_urls(), "/x.y.Z", ""]), st.binary(max_size=300))
def test_fuzz_from_any_random_bytes(type_url: str, value: bytes) -> None:
    try:
        out = from_any(any_pb2.Any(type_url=type_url, value=value))
    except WireError:
        return
    assert type(out).type_url() == type_url


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(any_msg, st.data())
def test_fuzz_truncated_and_flipped_encodings(msg: m.AnyMsg, data: st.DataObject) -> None:
    raw = bytearray(to_any(msg).value)
    cut = data.draw(st.integers(0, len(raw)))
    variants = [bytes(raw[:cut])]
    if raw:
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] ^= data.draw(st.integers(1, 255))
        variants.append(bytes(raw))
    for value in variants:
        with contextlib.suppress(WireError):
            from_any(any_pb2.Any(type_url=msg.type_url(), value=value))
