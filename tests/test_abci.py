"""The ABCI application in process: each ABCI call against a validator's `handle`, no engine running.

What CometBFT relies on is pinned here, fast: the handshake (Info after a restart gives the last
height and app hash), InitChain checks the genesis, CheckTx is the ante, proposals are filtered
and checked deterministically, FinalizeBlock takes time and hash from the request, Commit
persists, and two validators fed the same blocks agree unless one runs an altered rule.
The same app over real CometBFT processes: tests/test_cometbft.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path

import pytest
from cosmpy.protos.tendermint.abci import types_pb2 as abci
from cosmpy.protos.tendermint.types.validator_pb2 import BlockIDFlag
from hypothesis import given, settings
from hypothesis import strategies as st

from chain.abci.cometbft import (
    COMETBFT_VERSION,
    REPO,
    Localnet,
    ensure_binary,
    node_id,
    patch_toml,
    write_localnet,
)
from chain.abci.faults import FreeFeesApp
from chain.abci.validator import Validator
from chain.abci.wire import MAX_MESSAGE_BYTES, FramingError, encode_varint, frame, read_request
from chain.app import Limits
from chain.client import sign_tx
from chain.genesis import genesis_state
from chain.node import dev_genesis
from chain.state import app_hash
from protocol.keys import test_wallet
from protocol.messages import Coin, MsgSend

GENESIS = dev_genesis(8)
QUIET = lambda **_: None  # noqa: E731


@pytest.fixture(scope="module")
def localnet(tmp_path_factory: pytest.TempPathFactory) -> Localnet:
    """Two validator homes (keys, genesis, configs) made by the real `cometbft init`."""
    ensure_binary()
    return write_localnet(tmp_path_factory.mktemp("net") / "net", 2, genesis=GENESIS, block_interval=0.2)


def fresh(localnet: Localnet, tmp_path: Path, index: int = 0, fault: str | None = None) -> Validator:
    """A validator on a copy of one home (each test starts from genesis)."""
    import shutil

    home = tmp_path / f"node{index}"
    shutil.copytree(localnet.home(f"validator-{index}"), home)
    return Validator(home, log=QUIET, fault=fault)


def call(v: Validator, **request: object) -> abci.Response:
    response = v.handle(abci.Request(**request))
    assert response.WhichOneof("value") != "exception", response.exception.error
    return response


def send(sender: int, seq: int, amount: int = 5, *, fee: int = 200_000) -> bytes:
    w = test_wallet(sender)
    number = genesis_state(GENESIS).accounts[str(w.address())].number
    msg = MsgSend(
        from_address=str(w.address()), to_address=str(test_wallet(2).address()), amount=[Coin(amount=amount)]
    )
    return sign_tx(
        w, [msg], chain_id="gonka-devnet", account_number=number, sequence=seq, gas_limit=200_000, fee=fee
    )


def finalize(
    v: Validator, height: int, txs: list[bytes], *, time_ns: int | None = None
) -> abci.ResponseFinalizeBlock:
    req = abci.RequestFinalizeBlock(height=height, txs=txs, hash=bytes([height]) * 32)
    req.time.FromNanoseconds(time_ns or 1_800_000_000_000_000_000 + height * 10**9)
    req.proposer_address = bytes.fromhex("AB" * 20)
    vote = req.decided_last_commit.votes.add()
    vote.validator.address = bytes.fromhex("CD" * 20)
    vote.block_id_flag = BlockIDFlag.BLOCK_ID_FLAG_ABSENT
    return call(v, finalize_block=req).finalize_block


def test_the_makefile_and_the_code_pin_the_same_cometbft() -> None:
    makefile = (REPO / "Makefile").read_text()
    assert f"COMETBFT_VERSION := {COMETBFT_VERSION}" in makefile
    assert COMETBFT_VERSION.startswith("v0.38.")


def test_localnet_homes_are_loopback_only_and_share_one_genesis(localnet: Localnet) -> None:
    import subprocess
    import tomllib

    docs = []
    for v in localnet.validators:
        home = localnet.folder / v.home
        config = tomllib.loads((home / "config" / "config.toml").read_text())
        listeners = [config["proxy_app"], config["rpc"]["laddr"], config["p2p"]["laddr"]]
        assert all("127.0.0.1" in addr for addr in listeners), listeners
        assert config["rpc"]["grpc_laddr"] == config["rpc"]["pprof_laddr"] == ""
        assert not config["instrumentation"]["prometheus"]
        assert config["p2p"]["persistent_peers"].count("@127.0.0.1:") == 1
        docs.append((home / "config" / "genesis.json").read_text())
        shown = subprocess.run(
            [str(ensure_binary()), "show-node-id", "--home", str(home)], capture_output=True, text=True
        )
        assert node_id(home) == v.node_id == shown.stdout.strip()
    assert docs[0] == docs[1]
    genesis = json.loads(docs[0])
    assert len(genesis["validators"]) == 2 and genesis["app_state"]["chain_id"] == "gonka-devnet"
    assert int(genesis["consensus_params"]["block"]["max_bytes"]) == Limits().block_max_bytes


def test_a_config_key_that_does_not_exist_is_an_error() -> None:
    with pytest.raises(Exception, match="not in CometBFT's config template"):
        patch_toml('[rpc]\nladdr = "x"\n', {"rpc": {"ladr": "y"}})
    assert patch_toml('top = 1\n[rpc]\nladdr = "x"\n', {"rpc": {"laddr": "y"}}).endswith('laddr = "y"\n')


def test_handshake_init_chain_and_restart_after_commit(localnet: Localnet, tmp_path: Path) -> None:
    v = fresh(localnet, tmp_path)
    info = call(v, info=abci.RequestInfo()).info
    assert info.last_block_height == 0 and info.last_block_app_hash == b""
    bad = abci.RequestInitChain(
        chain_id="gonka-devnet", app_state_bytes=dev_genesis(3).model_dump_json().encode()
    )
    assert v.handle(abci.Request(init_chain=bad)).WhichOneof("value") == "exception"
    wrong_id = abci.RequestInitChain(chain_id="other", app_state_bytes=v.info.genesis_bytes)
    assert v.handle(abci.Request(init_chain=wrong_id)).WhichOneof("value") == "exception"
    init = call(
        v, init_chain=abci.RequestInitChain(chain_id="gonka-devnet", app_state_bytes=v.info.genesis_bytes)
    )
    assert init.init_chain.app_hash == app_hash(genesis_state(GENESIS))

    resp = finalize(v, 1, [send(1, 0)])
    assert [r.code for r in resp.tx_results] == [0]
    header = v._pending.header  # type: ignore[union-attr]
    assert header["time_ns"] == 1_800_000_000_000_000_000 + 10**9  # the request's time, no local clock
    assert v._pending.hash == (bytes([1]) * 32).hex()  # type: ignore[union-attr]  # the request's hash
    assert header["missed_validators"] == ["CD" * 20] and header["proposer"] == "AB" * 20
    assert resp.app_hash.hex() == header["app_hash"]
    call(v, commit=abci.RequestCommit())
    assert v.store.block(1)["hash"] == (bytes([1]) * 32).hex()  # type: ignore[index]
    finalize(v, 2, [])  # delivered, never committed: a crash here loses block 2 only
    v.close()

    again = Validator(v.cometbft_home, log=QUIET)  # what CometBFT's handshake sees after a restart
    info = call(again, info=abci.RequestInfo()).info
    assert info.last_block_height == 1 and info.last_block_app_hash == resp.app_hash
    assert again.app.last_block_hash == (bytes([1]) * 32).hex()
    wrong_height = abci.RequestFinalizeBlock(height=3, hash=b"x" * 32)
    assert again.handle(abci.Request(finalize_block=wrong_height)).WhichOneof("value") == "exception"
    replayed = finalize(again, 2, [])  # CometBFT replays block 2: the app is where it was
    call(again, commit=abci.RequestCommit())
    assert again.height == 2 and replayed.app_hash.hex() == again.last_header["app_hash"]  # type: ignore[index]
    again.close()


def test_check_tx_is_the_ante_with_pending_sequences_and_recheck(localnet: Localnet, tmp_path: Path) -> None:
    v = fresh(localnet, tmp_path)
    ok = call(v, check_tx=abci.RequestCheckTx(tx=send(1, 0))).check_tx
    assert ok.code == 0 and ok.gas_wanted == 200_000
    assert (
        call(v, check_tx=abci.RequestCheckTx(tx=send(1, 1))).check_tx.code == 0
    )  # continues the pending one
    assert call(v, check_tx=abci.RequestCheckTx(tx=send(1, 5))).check_tx.code == 32  # wrong sequence
    assert call(v, check_tx=abci.RequestCheckTx(tx=send(3, 0, fee=1))).check_tx.code == 13  # fee below min
    forged = bytearray(send(4, 0))
    forged[-1] ^= 1
    assert call(v, check_tx=abci.RequestCheckTx(tx=bytes(forged))).check_tx.code == 4  # bad signature
    assert call(v, check_tx=abci.RequestCheckTx(tx=b"\x01garbage")).check_tx.code == 2
    assert len(v.mempool) == 2
    finalize(v, 1, [send(1, 0)])
    call(v, commit=abci.RequestCommit())
    assert list(v.mempool) and v.pending_seq == {str(test_wallet(1).address()): 2}
    recheck = abci.RequestCheckTx(tx=send(1, 1), type=abci.CheckTxType.RECHECK)
    assert call(v, check_tx=recheck).check_tx.code == 0
    stale = abci.RequestCheckTx(tx=send(1, 0), type=abci.CheckTxType.RECHECK)  # now in a block
    assert call(v, check_tx=stale).check_tx.code == 32


def test_proposals_are_filtered_and_checked_the_same_way_everywhere(
    localnet: Localnet, tmp_path: Path
) -> None:
    v = fresh(localnet, tmp_path)
    good = [send(1, 0), send(1, 1), send(3, 0)]
    prepared = call(
        v,
        prepare_proposal=abci.RequestPrepareProposal(
            txs=[good[0], b"\x00junk", *good[1:]], max_tx_bytes=10**6
        ),
    )
    assert list(prepared.prepare_proposal.txs) == good
    small = call(v, prepare_proposal=abci.RequestPrepareProposal(txs=good, max_tx_bytes=len(good[0]) + 1))
    assert list(small.prepare_proposal.txs) == good[:1]
    status = abci.ResponseProcessProposal.ProposalStatus
    accept = call(v, process_proposal=abci.RequestProcessProposal(txs=good)).process_proposal.status
    assert accept == status.ACCEPT
    for bad in ([*good, b"\x00junk"], [b"\x00" * (Limits().max_tx_bytes + 1)]):
        result = call(v, process_proposal=abci.RequestProcessProposal(txs=bad)).process_proposal.status
        assert result == status.REJECT
    other = fresh(localnet, tmp_path, 1)  # a validator that never saw these txs decides the same
    assert (
        call(other, process_proposal=abci.RequestProcessProposal(txs=good)).process_proposal.status == accept
    )


def test_two_validators_agree_block_by_block_and_an_altered_rule_diverges(
    localnet: Localnet, tmp_path: Path
) -> None:
    a, b = fresh(localnet, tmp_path, 0), fresh(localnet, tmp_path, 1)
    liar = Validator(_copy(localnet, tmp_path, 1, "liar"), log=QUIET, fault="free-fees")
    assert isinstance(liar.app, FreeFeesApp)
    blocks = [[], [send(1, 0), send(3, 0)], [send(1, 1)], []]
    hashes: dict[str, list[bytes]] = {"a": [], "b": [], "liar": []}
    for height, txs in enumerate(blocks, start=1):
        for name, v in (("a", a), ("b", b), ("liar", liar)):
            hashes[name].append(finalize(v, height, txs).app_hash)
            call(v, commit=abci.RequestCommit())
    assert hashes["a"] == hashes["b"]
    assert (
        hashes["liar"][0] == hashes["a"][0] and hashes["liar"][1] != hashes["a"][1]
    )  # the first block with fees


def _copy(localnet: Localnet, tmp_path: Path, index: int, name: str) -> Path:
    import shutil

    home = tmp_path / name
    shutil.copytree(localnet.home(f"validator-{index}"), home)
    return home


def test_queries_answer_from_state_and_refuse_bad_input(localnet: Localnet, tmp_path: Path) -> None:
    v = fresh(localnet, tmp_path)
    address = str(test_wallet(1).address())
    ok = call(
        v, query=abci.RequestQuery(path="/diloco/balance", data=json.dumps({"address": address}).encode())
    )
    assert ok.query.code == 0 and json.loads(ok.query.value)["amount"] == GENESIS.accounts[address]
    assert call(v, query=abci.RequestQuery(path="/diloco/nope")).query.code == 6
    assert (
        call(v, query=abci.RequestQuery(path="/diloco/run", data=b'{"run_id": 9}')).query.codespace
        == "diloco"
    )
    assert call(v, query=abci.RequestQuery(path="/diloco/balance", data=b"[1]")).query.code == 3


def _read_all(data: bytes) -> list[abci.Request]:
    async def go() -> list[abci.Request]:
        reader = asyncio.StreamReader()
        reader.feed_data(data)
        reader.feed_eof()
        out = []
        while (request := await read_request(reader)) is not None:
            out.append(request)
        return out

    return asyncio.run(go())


def test_framing_round_trips_and_refuses_what_is_not_a_message() -> None:
    requests = [abci.Request(echo=abci.RequestEcho(message="hi")), abci.Request(flush=abci.RequestFlush())]
    requests.append(abci.Request(check_tx=abci.RequestCheckTx(tx=b"x" * 300)))
    assert _read_all(b"".join(frame(r) for r in requests)) == requests
    with pytest.raises(FramingError, match="exceeds"):
        _read_all(encode_varint(MAX_MESSAGE_BYTES + 1))
    with pytest.raises(FramingError, match="longer than 10"):
        _read_all(b"\xff" * 11)
    with pytest.raises(FramingError, match="inside a message"):
        _read_all(encode_varint(50) + b"abc")
    with pytest.raises(FramingError, match="no value"):
        _read_all(encode_varint(0))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_framing_fuzz_never_raises_anything_else(data: bytes) -> None:
    with contextlib.suppress(FramingError):
        _read_all(data)


def test_a_validator_process_does_not_import_torch() -> None:
    """The chain process stays light: what `chain start --engine cometbft` imports, without torch."""
    import subprocess
    import sys

    code = (
        "import sys, chain.cli, chain.abci.validator; "
        "print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert done.stdout.strip() == "[]"


def test_a_halted_node_serves_its_status_and_nothing_else(tmp_path: Path) -> None:
    """Memory that may have run ahead of the disk (or, under CometBFT, of the network) is not served."""
    from fastapi.testclient import TestClient

    from chain.node import API, Node, create_app

    node = Node(tmp_path / "chain", GENESIS, log=QUIET)
    with TestClient(create_app(node, run_blocks=False)) as http:
        address = str(test_wallet(1).address())
        assert http.get(f"/cosmos/bank/v1beta1/balances/{address}").status_code == 200
        node.halted = "cometbft stopped: diverged: the network committed another app hash"
        refused = http.get(f"/cosmos/bank/v1beta1/balances/{address}")
        assert refused.status_code == 503 and "diverged" in refused.json()["message"]
        assert http.get(f"{API}/query/balance", params={"address": address}).status_code == 503
        assert http.get(f"{API}/status").json()["halted"].startswith("cometbft stopped: diverged")
