"""The tx path is total: no bytes make CheckTx, ProcessProposal or FinalizeBlock throw (specs §2.9).

One finding (issue 23): a MsgSend whose fee amount uses Arabic-Indic digits passed `str.isdigit()`,
then `int()` raised ValueError in the ante; the ABCI handler answered an exception, CometBFT closed
the app connection and the validator died; two such txs halted the chain, and a byzantine proposer
putting one in a block made every honest ProcessProposal throw. The class: anything but a
rejection escaping the handlers.

Fuzzed here, with hypothesis, on arbitrary bytes and on well-formed protobuf txs with adversarial
field values (huge, negative and non-ASCII numbers, odd denoms, wrong type URLs, nested garbage,
overlong strings, NaN doubles, valid messages with one field mutated), signed by funded accounts so
they reach the message handlers: the embedded node's `App` and a CometBFT validator's ABCI handler
(in process, `Validator.handle`) are driven in lockstep block by block. Invariants: no exception
anywhere, the same result code for every tx on both, the same app hash after every block, the
height advancing. A handler bug (a handler that writes, then raises) fails only its own tx, and
its writes are undone, the same way on both engines. The real multi-validator network under the
same txs: tests/test_cometbft_poison.py.
"""

from __future__ import annotations

import contextlib
import math
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cosmpy.protos.cosmos.base.v1beta1.coin_pb2 import Coin as CoinPb
from cosmpy.protos.cosmos.crypto.secp256k1.keys_pb2 import PubKey
from cosmpy.protos.cosmos.tx.signing.v1beta1.signing_pb2 import SignMode
from cosmpy.protos.cosmos.tx.v1beta1.tx_pb2 import AuthInfo, Fee, ModeInfo, SignDoc, SignerInfo, TxBody, TxRaw
from cosmpy.protos.tendermint.abci import types_pb2 as abci
from fastapi.testclient import TestClient
from google.protobuf import any_pb2
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from chain import module
from chain.abci.cometbft import Localnet, ensure_binary, write_localnet
from chain.abci.validator import Validator
from chain.app import App, TxRejected
from chain.client import sign_tx
from chain.genesis import genesis_state
from chain.node import Node, create_app
from protocol.config import ModelSpec, Phases, RunConfig, Stake
from protocol.messages import (
    Coin,
    EnvFingerprint,
    MsgCommitPseudoGradient,
    MsgCreateRun,
    MsgJoinRun,
    MsgLeaveRun,
    MsgSend,
    MsgSubmitVerdict,
    Reason,
    Role,
)
from protocol.wire import to_proto, type_urls
from tests.support.txs import ADDRESSES, CHAIN_ID, GENESIS, NUMBERS, WALLETS, poison_fee_tx, send_tx

QUIET = lambda **_: None  # noqa: E731
FUZZ = settings(
    max_examples=60,
    deadline=None,  # a loaded 2-core machine: never a flaky deadline
    derandomize=True,  # the same examples on every run and machine (CI is reproducible)
    database=None,
    phases=[Phase.explicit, Phase.generate],  # no shrinking: each example drives a validator (slow)
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
H64 = "ab" * 32


# ---- the two engines in lockstep ---------------------------------------------------------------


@pytest.fixture(scope="module")
def localnet(tmp_path_factory: pytest.TempPathFactory) -> Localnet:
    ensure_binary()
    return write_localnet(tmp_path_factory.mktemp("fuzznet") / "net", 1, genesis=GENESIS, block_interval=0.2)


class Lockstep:
    """A CometBFT validator's ABCI handler and a standalone `App` fed the same blocks."""

    def __init__(self, validator: Validator) -> None:
        self.v = validator
        self.app = App(genesis_state(GENESIS), min_gas_price=1)
        self.broken: str | None = None

    def call(self, **request: Any) -> abci.Response:
        response = self.v.handle(abci.Request(**request))
        kind = response.WhichOneof("value")
        assert kind != "exception", response.exception.error
        return response

    def check(self, raw: bytes) -> int:
        """CheckTx on both: a code from the validator, `TxRejected` at most from the app."""
        code = self.call(check_tx=abci.RequestCheckTx(tx=raw)).check_tx.code
        with contextlib.suppress(TxRejected):
            self.app.check_tx(raw)
        return code

    def proposal(self, txs: list[bytes]) -> int:
        return self.call(process_proposal=abci.RequestProcessProposal(txs=txs)).process_proposal.status

    def block(self, txs: list[bytes]) -> list[int]:
        """One block on both; a failure leaves the pair unusable, so it is kept and raised again
        (hypothesis replays a failing example: it must see the first failure, not its aftermath)."""
        if self.broken is not None:
            raise AssertionError(f"an earlier block failed: {self.broken}")
        try:
            return self._block(txs)
        except BaseException as exc:
            self.broken = f"{type(exc).__name__}: {exc}"[:3000]
            raise

    def _block(self, txs: list[bytes]) -> list[int]:
        height = self.v.height + 1
        req = abci.RequestFinalizeBlock(height=height, txs=txs, hash=height.to_bytes(32, "big"))
        req.time.FromNanoseconds(1_800_000_000_000_000_000 + height * 10**9)
        finalized = self.call(finalize_block=req).finalize_block
        self.call(commit=abci.RequestCommit())
        mine = self.app.deliver_block(txs, req.time.ToNanoseconds(), block_hash=req.hash.hex())
        assert self.v.height == self.app.height == height  # blocks keep coming
        assert finalized.app_hash.hex() == mine.header["app_hash"]  # and agree
        codes = [r.code for r in finalized.tx_results]
        assert codes == [r.code for r in mine.results]
        return codes

    def sequence(self, address: str) -> int:
        account = self.app.state.accounts.get(address)
        return account.sequence if account is not None else 0


@contextlib.contextmanager
def lockstep(localnet: Localnet, tmp: Path) -> Iterator[Lockstep]:
    home = tmp / "validator"
    shutil.copytree(localnet.home("validator-0"), home)
    v = Validator(home, log=QUIET)
    try:
        yield Lockstep(v)
    finally:
        v.close()


@pytest.fixture(scope="module")
def pair(localnet: Localnet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lockstep]:
    with lockstep(localnet, tmp_path_factory.mktemp("pair")) as both:
        both.block([raw_create_run(both)])  # a run exists: later txs reach the run handlers
        yield both


# ---- adversarial values ------------------------------------------------------------------------

U64 = st.one_of(st.integers(0, 12), st.sampled_from([2**31, 2**32, 2**53 + 1, 2**63 - 1, 2**64 - 1]))
I64 = st.one_of(U64.filter(lambda x: x < 2**63), st.sampled_from([-1, -(2**63)]))
DOUBLES = st.one_of(st.sampled_from([0.0, -0.0, 0.7, 1e-8, 1e308, math.nan, math.inf, -math.inf]),
                    st.floats(allow_nan=True, allow_infinity=True))  # fmt: skip
ODD_STRINGS = st.one_of(
    st.sampled_from(["", "int8", "bf16", "host", "verifier", "bitwise", "tolerance", "math", "none", "eager",
                     "http://x", H64, H64.upper(), "0" * 63, "١٢٣", "1_000", " 5", "-5", "9" * 100,
                     "\x00", "ngonka", "NGONKA", "uatom", "trainer.model:small_gpt", "os:system"]),
    st.sampled_from(ADDRESSES),
    st.text(max_size=40),
    st.just("a" * 300),
)  # fmt: skip
AMOUNTS = st.one_of(st.just("400000"), st.sampled_from(
    ["", "0", "007", "٢٠٠٠٠٠", "２００", "1_000", " 1", "+1", "-1", "1e3", "0x10", "9" * 78, "9" * 79,
     "1" * 5000, str(2**256), "400000\x00", "²⁰⁰⁰⁰⁰", "①"]), st.text(max_size=12))  # fmt: skip
CONFIG_KEYS = ["n_layer", "n_head", "n_embd", "block_size", "vocab_size", "dropout", "bias", "seed",
               "param_count", "hidden_size", "preset", "x"]  # fmt: skip


def fill(draw: Any, msg: Message, depth: int = 0) -> Message:
    """Every field of `msg` (nested messages too, to depth 3) set, or not, to an adversarial value."""
    for f in msg.DESCRIPTOR.fields:
        if not draw(st.booleans()):
            continue
        repeated = f.label == FieldDescriptor.LABEL_REPEATED
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            for _ in range(draw(st.integers(0, 4))):
                entry = getattr(msg, f.name)[draw(st.sampled_from(CONFIG_KEYS))]
                fill(draw, entry, depth + 1)
        elif f.message_type is not None:
            if depth >= 3:
                continue
            for _ in range(draw(st.integers(0, 2)) if repeated else 1):
                child = getattr(msg, f.name).add() if repeated else getattr(msg, f.name)
                fill(draw, child, depth + 1)
                if not repeated:
                    child.SetInParent()
        else:
            values = [draw(_scalar(f)) for _ in range(draw(st.integers(0, 3)) if repeated else 1)]
            if repeated:
                getattr(msg, f.name).extend(values)
            else:
                setattr(msg, f.name, values[0])
    return msg


def _scalar(f: FieldDescriptor) -> st.SearchStrategy[Any]:
    t = f.type
    if t == FieldDescriptor.TYPE_STRING:
        return ODD_STRINGS
    if t == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if t == FieldDescriptor.TYPE_DOUBLE:
        return DOUBLES
    if t in (FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_FIXED64):
        return U64
    if t == FieldDescriptor.TYPE_UINT32:
        return st.integers(0, 2**32 - 1)
    if t == FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=40)
    return I64


def valid_config(**kw: Any) -> RunConfig:
    base: dict[str, Any] = dict(
        model=ModelSpec(factory="trainer.model:small_gpt", config={"n_layer": 1, "n_embd": 16, "n_head": 2}),
        dataset_manifest_hash=H64, initial_model_hash=H64, inner_steps=4, segment_len=2, sampled_segments=1,
        verifiers_per_contribution=1, batch_size=2, seq_len=8,
        phases=Phases(join_blocks=1, train_blocks=2, reveal_blocks=2, verify_blocks=2, escalation_blocks=2,
                      result_blocks=2, epoch_length=50, poc_window=3, early_close=True),
        stake=Stake(min_host_stake=10, min_verifier_stake=10, reward_per_outer_step=100),
    )  # fmt: skip
    return RunConfig(**{**base, **kw})


def valid_msgs(signer: str) -> list[Any]:
    """One valid message of each kind the signer may send (the run is run 1)."""
    env = EnvFingerprint(torch_version="2.13.0", threads=1)
    return [
        MsgSend(from_address=signer, to_address=ADDRESSES[3], amount=[Coin(amount=7)]),
        MsgCreateRun(creator=signer, config=valid_config()),
        MsgJoinRun(creator=signer, run_id=1, role=Role.VERIFIER, endpoint="http://v", stake=10),
        MsgJoinRun(creator=signer, run_id=1, role=Role.HOST, endpoint="http://h", stake=10),
        MsgLeaveRun(creator=signer, run_id=1),
        MsgCommitPseudoGradient(creator=signer, run_id=1, outer_step=0, base_model_hash=H64,
                                trajectory_root=H64, leaf_count=3, delta_hash=H64, final_optimizer_hash=H64,
                                codec="int8", tokens=64, env=env),
        MsgSubmitVerdict(creator=signer, run_id=1, outer_step=0, host=ADDRESSES[4], reason=Reason.ACCEPT,
                         evidence_hash=H64),
    ]  # fmt: skip


def adversarial_any(draw: Any, signer: str) -> any_pb2.Any:
    kind = draw(st.sampled_from(["valid", "mutated", "mutated", "random", "garbage"]))
    if kind in ("valid", "mutated"):
        msg = draw(st.sampled_from(valid_msgs(signer)))
        pb = to_proto(msg)
        if kind == "mutated":
            field = draw(st.sampled_from(list(pb.DESCRIPTOR.fields)))
            if field.message_type is None and field.label != FieldDescriptor.LABEL_REPEATED:
                setattr(pb, field.name, draw(_scalar(field)))
            elif field.message_type is not None and field.label != FieldDescriptor.LABEL_REPEATED:
                fill(draw, getattr(pb, field.name), 1)
        return any_pb2.Any(type_url=msg.type_url(), value=pb.SerializeToString())
    url = draw(st.one_of(st.sampled_from(type_urls()), ODD_STRINGS))
    if kind == "garbage":
        return any_pb2.Any(type_url=url, value=draw(st.binary(max_size=200)))
    from protocol.wire import _MODEL_OF, _PROTO_OF  # the proto class of a known type URL

    model = _MODEL_OF.get(url)
    pb = _PROTO_OF[model]() if model is not None else any_pb2.Any()
    return any_pb2.Any(type_url=url, value=fill(draw, pb).SerializeToString())


def signed_tx(draw: Any, both: Lockstep) -> bytes:
    """A well-formed TxRaw from a funded account. Either its messages are adversarial and its
    envelope honest, or its messages valid and its envelope (fee coins, gas, sequence, memo,
    timeout, public key, signature) adversarial: the decoder stops at the first bad part, so each
    half is reached only when the other is sound."""
    index = draw(st.integers(0, 4))
    signer = ADDRESSES[index]
    odd_msgs = draw(st.booleans())
    odd_envelope = not odd_msgs or draw(st.integers(0, 4)) == 0

    def pick(honest: Any, odd: st.SearchStrategy[Any]) -> Any:
        return draw(odd) if odd_envelope and draw(st.booleans()) else honest

    if odd_msgs:
        msgs = [adversarial_any(draw, signer) for _ in range(draw(st.integers(1, 3)))]
    else:
        chosen = [draw(st.sampled_from(valid_msgs(signer))) for _ in range(draw(st.integers(1, 2)))]
        msgs = [any_pb2.Any(type_url=m.type_url(), value=to_proto(m).SerializeToString()) for m in chosen]
    body = TxBody(messages=msgs, memo=pick("", st.sampled_from(["m", "x" * 300, "١٢٣"])),
                  timeout_height=pick(0, st.sampled_from([1, 2**64 - 1])))  # fmt: skip
    key = WALLETS[index].public_key().public_key_bytes
    pub = any_pb2.Any(type_url="/cosmos.crypto.secp256k1.PubKey", value=PubKey(key=key).SerializeToString())
    pub = pick(pub, st.builds(any_pb2.Any, type_url=ODD_STRINGS, value=st.binary(max_size=40)))
    sequence = both.sequence(signer) + pick(0, st.sampled_from([1, -1, 2**40]))
    fee = Fee(gas_limit=pick(400_000, st.sampled_from([0, 10_000_001, 2**64 - 1])))
    for _ in range(pick(1, st.sampled_from([0, 2, 3]))):
        fee.amount.append(CoinPb(denom=pick("ngonka", st.sampled_from(["uatom", "", "NGONKA", "ngonka "])),
                                 amount=pick("400000", AMOUNTS)))  # fmt: skip
    direct = ModeInfo(single=ModeInfo.Single(mode=SignMode.SIGN_MODE_DIRECT))
    info = SignerInfo(public_key=pub, mode_info=direct, sequence=max(0, sequence) % 2**64)
    auth = AuthInfo(signer_infos=[info], fee=fee)
    body_bytes, auth_bytes = body.SerializeToString(), auth.SerializeToString()
    doc = SignDoc(body_bytes=body_bytes, auth_info_bytes=auth_bytes, chain_id=CHAIN_ID,
                  account_number=NUMBERS[signer]).SerializeToString()  # fmt: skip
    signature = pick(WALLETS[index].signer().sign(doc, deterministic=True, canonicalise=True),
                     st.binary(max_size=70))  # fmt: skip
    tx = TxRaw(body_bytes=body_bytes, auth_info_bytes=auth_bytes, signatures=[signature])
    return tx.SerializeToString()


def raw_create_run(both: Lockstep) -> bytes:
    authority = ADDRESSES[0]
    return sign_tx(WALLETS[0], [MsgCreateRun(creator=authority, config=valid_config())], chain_id=CHAIN_ID,
                   account_number=NUMBERS[authority], sequence=both.sequence(authority), gas_limit=400_000,
                   fee=400_000)  # fmt: skip


def mutated_bytes(draw: Any) -> bytes:
    """A valid tx with bytes flipped, cut, spliced or repeated: TxRaw framing garbage."""
    raw = bytearray(send_tx(draw(st.integers(0, 4)), draw(st.integers(0, 3))))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "cut", "insert", "dup"]))
        at = draw(st.integers(0, max(0, len(raw) - 1)))
        if op == "flip" and raw:
            raw[at] ^= 1 << draw(st.integers(0, 7))
        elif op == "cut":
            del raw[at:]
        elif op == "insert":
            raw[at:at] = draw(st.binary(min_size=1, max_size=8))
        else:
            raw += raw[at:]
    return bytes(raw)


# ---- the properties ----------------------------------------------------------------------------


@FUZZ
@given(st.lists(st.binary(max_size=600), max_size=3), st.data())
def test_arbitrary_and_mangled_bytes_never_throw_and_both_engines_agree(
    pair: Lockstep, blobs: list[bytes], data: st.DataObject
) -> None:
    txs = blobs + [mutated_bytes(data.draw) for _ in range(2)]
    for raw in txs:
        pair.check(raw)
    pair.proposal(txs)
    pair.block(txs)


@FUZZ
@given(st.data())
def test_well_formed_txs_with_adversarial_fields_never_throw_and_both_engines_agree(
    pair: Lockstep, data: st.DataObject
) -> None:
    txs = [signed_tx(data.draw, pair) for _ in range(data.draw(st.integers(1, 3)))]
    if data.draw(st.booleans()):
        txs.append(raw_create_run(pair))  # a valid run config keeps the run handlers busy
    for raw in txs:
        pair.check(raw)
    status = pair.proposal(txs)
    decodes = []
    for raw in txs:
        try:
            pair.app.decode(raw)
            decodes.append(True)
        except TxRejected:
            decodes.append(False)
    accept = abci.ResponseProcessProposal.ProposalStatus.ACCEPT
    assert (status == accept) == all(decodes)  # REJECT exactly when some tx does not decode
    pair.block(txs)
    pair.block([])  # begin/end block over whatever state those txs made


def test_issue_23_poison_fee_is_a_coded_rejection_everywhere(localnet: Localnet, tmp_path: Path) -> None:
    """The 311-byte tx of the issue: CheckTx refuses it with sdk code 10, a proposal holding it is
    rejected, a block holding it (a byzantine proposer's, committed anyway) fails only that tx,
    and an honest send next to it goes through."""
    poison = poison_fee_tx()
    with lockstep(localnet, tmp_path) as both:
        response = both.call(check_tx=abci.RequestCheckTx(tx=poison)).check_tx
        assert (response.code, response.codespace) == (10, "sdk") and "ASCII digits" in response.log
        status = abci.ResponseProcessProposal.ProposalStatus
        honest = send_tx(1, 0)
        assert both.proposal([honest]) == status.ACCEPT
        assert both.proposal([honest, poison]) == status.REJECT
        offered = abci.RequestPrepareProposal(txs=[poison, honest], max_tx_bytes=10**6)
        prepared = both.call(prepare_proposal=offered)
        assert list(prepared.prepare_proposal.txs) == [honest]
        others = [poison_fee_tx(d) for d in ("9" * 5000, "\u0664\u0660\u0660\u0660\u0660\u0660", "1_000")]
        assert both.block([poison, honest, *others]) == [10, 0, 10, 10, 10]
        assert both.block([send_tx(1, 1)]) == [0]


def test_the_embedded_node_answers_the_poison_tx_with_a_cosmos_error_not_a_500(tmp_path: Path) -> None:
    import base64

    node = Node(tmp_path / "chain", GENESIS, log=QUIET)
    try:
        client = TestClient(create_app(node, run_blocks=False))
        for raw, code in ((poison_fee_tx(), 10), (b"\xff" * 311, 2), (send_tx(1, 0), 0)):
            r = client.post("/cosmos/tx/v1beta1/txs", json={"tx_bytes": base64.b64encode(raw).decode()})
            assert r.status_code == 200, r.text
            assert r.json()["tx_response"].get("code", 0) == code, r.text
        block = node.produce_block()
        assert [x.code for x in block.results] == [0] and node.halted is None
    finally:
        node.close()


def _buggy_send(state: Any, msg: MsgSend, ctx: Any) -> list[Any]:
    """A handler bug: writes (moves the funds), then raises what no validity rule would."""
    module.process_send(state, msg, ctx)
    raise KeyError("a bug after the writes")


def test_a_handler_bug_fails_only_its_tx_and_its_writes_are_undone_on_both_engines(
    localnet: Localnet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with lockstep(localnet, tmp_path) as both:
        before = both.app.state.accounts[ADDRESSES[2]].balance
        big = MsgSend(from_address=ADDRESSES[3], to_address=ADDRESSES[2], amount=[Coin(amount=1000)])
        number = NUMBERS[ADDRESSES[3]]
        buggy = sign_tx(WALLETS[3], [big], chain_id=CHAIN_ID, account_number=number, sequence=0,
                        gas_limit=400_000, fee=400_000)  # fmt: skip
        monkeypatch.setitem(module.HANDLERS, MsgSend, _buggy_on(ADDRESSES[3]))
        codes = both.block([send_tx(1, 0, amount=5), buggy, send_tx(4, 0, amount=6)])
        assert codes == [0, 1, 0]
        state = both.app.state
        assert state.accounts[ADDRESSES[2]].balance == before + 5 + 6  # the bug's 1000 was undone
        assert state.accounts[ADDRESSES[3]].sequence == 1  # its ante's writes stay, as a failed tx's
        monkeypatch.undo()
        assert both.block([send_tx(1, 1)]) == [0]


def _buggy_on(sender: str) -> Any:
    honest = module.HANDLERS[MsgSend]

    def handler(state: Any, msg: MsgSend, ctx: Any) -> list[Any]:
        return _buggy_send(state, msg, ctx) if msg.from_address == sender else honest(state, msg, ctx)

    return handler


def test_a_handler_bug_in_simulate_is_a_rejection(monkeypatch: pytest.MonkeyPatch) -> None:
    app = App(genesis_state(GENESIS), min_gas_price=1)
    monkeypatch.setitem(module.HANDLERS, MsgSend, _buggy_send)
    with pytest.raises(TxRejected, match="MsgSend handler raised KeyError"):
        app.simulate(send_tx(1, 0))
