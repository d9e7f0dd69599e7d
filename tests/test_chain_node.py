"""The devnet node as a subprocess, driven by an unmodified cosmpy LedgerClient and raw HTTP."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from cosmpy.aerial.client import LedgerClient
from cosmpy.aerial.config import NetworkConfig
from cosmpy.aerial.tx_helpers import SubmittedTx

from chain.cli import NodeProcess
from chain.client import HttpChainClient, TxFailed, sign_tx
from chain.node import DEV_BALANCE
from protocol.keys import test_wallet
from protocol.messages import Coin, MsgSend

pytestmark = pytest.mark.slow
CHAIN_ID = "gonka-devnet"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    home = tmp_path_factory.mktemp("node") / "chain"
    proc = NodeProcess(home, block_interval=0.1)
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def ledger(node: NodeProcess) -> LedgerClient:
    cfg = NetworkConfig(
        chain_id=CHAIN_ID,
        url=f"rest+{node.url}",
        fee_minimum_gas_price=1,
        fee_denomination="ngonka",
        staking_denomination="ngonka",
    )
    return LedgerClient(cfg, query_interval_secs=1)


@pytest.fixture(scope="module")
def client(node: NodeProcess) -> Iterator[HttpChainClient]:
    c = HttpChainClient(node.url)
    try:
        yield c
    finally:
        c.close()


def test_unmodified_ledger_client_sends_tokens(ledger: LedgerClient) -> None:
    alice, bob = test_wallet(1), test_wallet(2)
    account = ledger.query_account(alice.address())
    assert account.sequence == 0
    before = ledger.query_bank_balance(bob.address())
    assert before == DEV_BALANCE
    submitted: SubmittedTx = ledger.send_tokens(bob.address(), 12345, "ngonka", alice)
    submitted.wait_to_complete(timeout=20, poll_period=0.1)
    assert submitted.response is not None and submitted.response.code == 0
    assert submitted.response.height > 0
    assert ledger.query_bank_balance(bob.address()) == before + 12345
    assert ledger.query_account(alice.address()).sequence == 1
    assert ledger.query_latest_block().height >= submitted.response.height
    assert ledger.query_latest_block().chain_id == CHAIN_ID


def test_unknown_tx_is_not_found_the_way_cosmpy_polls(ledger: LedgerClient) -> None:
    from cosmpy.aerial.exceptions import NotFoundError

    with pytest.raises(NotFoundError):
        ledger.query_tx("AB" * 32)


def _broadcast(url: str, raw: bytes) -> dict:
    r = httpx.post(
        f"{url}/cosmos/tx/v1beta1/txs",
        json={"tx_bytes": base64.b64encode(raw).decode(), "mode": "BROADCAST_MODE_SYNC"},
    )
    assert r.status_code == 200, r.text
    return r.json()["tx_response"]


def _send(
    sender: int,
    seq: int,
    *,
    chain_id: str = CHAIN_ID,
    number: int | None = None,
    fee: int = 200_000,
    gas: int = 200_000,
    amount: int = 1,
) -> bytes:
    w = test_wallet(sender)
    msg = MsgSend(
        from_address=str(w.address()), to_address=str(test_wallet(0).address()), amount=[Coin(amount=amount)]
    )
    return sign_tx(
        w,
        [msg],
        chain_id=chain_id,
        account_number=number if number is not None else 99,
        sequence=seq,
        gas_limit=gas,
        fee=fee,
    )


def test_every_bad_tx_class_gets_its_error_and_the_node_keeps_serving(node: NodeProcess) -> None:
    url = node.url
    number = int(
        httpx.get(f"{url}/cosmos/auth/v1beta1/accounts/{test_wallet(3).address()}").json()["account"][
            "account_number"
        ]
    )
    cases = {
        "garbage": (b"\xff\x00garbage", 2),
        "oversized": (b"\x0a" + b"\x00" * (300 * 1024), 21),
        "wrong chain id": (_send(3, 0, chain_id="other-chain", number=number), 4),
        "wrong account number": (_send(3, 0, number=number + 1), 4),
        "future sequence": (_send(3, 5, number=number), 32),
        "fee too low": (_send(3, 0, number=number, fee=10), 13),
        "out of gas": (_send(3, 0, number=number, gas=100, fee=100), 11),
    }
    for name, (raw, code) in cases.items():
        resp = _broadcast(url, raw)
        assert resp["code"] == code, (name, resp)
        assert resp["codespace"] == "sdk" and resp["raw_log"], name
    # an unknown message type inside a correctly signed tx
    from cosmpy.aerial.tx import SigningCfg, Transaction, TxFee
    from cosmpy.protos.cosmos.staking.v1beta1.tx_pb2 import MsgDelegate

    w = test_wallet(3)
    tx = Transaction().add_message(MsgDelegate(delegator_address=str(w.address())))
    tx.seal(SigningCfg.direct(w.public_key(), 0), fee=TxFee(amount="200000ngonka", gas_limit=200_000))
    tx.sign(w.signer(), CHAIN_ID, number).complete()
    resp = _broadcast(url, tx.tx.SerializeToString())
    assert resp["code"] == 6 and "unknown message type" in resp["raw_log"]
    # HTTP-level garbage
    assert httpx.post(f"{url}/cosmos/tx/v1beta1/txs", content=b"not json").status_code == 400
    assert httpx.post(f"{url}/cosmos/tx/v1beta1/txs", json={"tx_bytes": "!!"}).status_code == 400
    assert httpx.post(f"{url}/cosmos/tx/v1beta1/txs", content=b"x" * (2 << 20)).status_code == 400
    deep = b"[" * 100_000 + b"]" * 100_000  # found by fuzzing: a RecursionError used to answer 500
    for route in ("txs", "simulate"):
        assert httpx.post(f"{url}/cosmos/tx/v1beta1/{route}", content=deep).status_code == 400, route
    for h in (2**63, 2**64 + 5, -1):  # heights past int64 used to overflow SQLite (500)
        assert httpx.get(f"{url}/cosmos/base/tendermint/v1beta1/blocks/{h}").status_code == 404, h
        assert httpx.get(f"{url}/inference/diloco/v1/blocks/{h}", params={"wait": 0.2}).status_code == 404, h
    # replay: the good tx goes in once, the same bytes again are refused
    good = _send(3, 0, number=number)
    assert _broadcast(url, good)["code"] == 0
    again = _broadcast(url, good)
    assert again["code"] in (19, 32)
    c = HttpChainClient(url)
    try:
        result = c.wait_for_tx(again["txhash"], timeout=20)
        assert result.code == 0
        assert c.wait_for_block(result.height, timeout=20).height == result.height + 1
    finally:
        c.close()
    metrics = httpx.get(f"{url}/metrics").text
    assert 'chain_rejected_txs_total{code="2",codespace="sdk"}' in metrics


def test_client_broadcast_waits_and_reports_failures(client: HttpChainClient) -> None:
    sender, to = test_wallet(4), test_wallet(5)
    before = client.balance(str(to.address()))
    result = client.broadcast(
        sender,
        [
            MsgSend(
                from_address=str(sender.address()), to_address=str(to.address()), amount=[Coin(amount=777)]
            )
        ],
    )
    assert result.ok and result.height > 0
    assert any(e.type == "transfer" for e in result.events)
    assert client.balance(str(to.address())) == before + 777
    too_much = MsgSend(
        from_address=str(sender.address()),
        to_address=str(to.address()),
        amount=[Coin(amount=DEV_BALANCE * 10)],
    )
    with pytest.raises(TxFailed) as info:
        client.broadcast(sender, [too_much])
    assert info.value.codespace == "diloco" and info.value.code == 5
    # the failed tx consumed its sequence; the next one still goes through
    assert client.broadcast(
        sender,
        [MsgSend(from_address=str(sender.address()), to_address=str(to.address()), amount=[Coin(amount=1)])],
    ).ok


def test_module_queries_and_long_poll(client: HttpChainClient, node: NodeProcess) -> None:
    params = client.params()
    assert params["denom"] == "ngonka"
    h = client.height()
    block = client.wait_for_block(h, timeout=10)
    assert block.height == h + 1 and len(block.app_hash) == 64
    r = httpx.get(f"{node.url}/inference/diloco/v1/query/run", params={"run_id": "999"})
    assert r.status_code == 404 and r.json()["codespace"] == "diloco"
    r = httpx.get(f"{node.url}/inference/diloco/v1/query/run", params={"run_id": "x"})
    assert r.status_code == 400
    assert httpx.get(f"{node.url}/inference/diloco/v1/query/nope").status_code == 404
    r = httpx.get(f"{node.url}/inference/diloco/v1/blocks/{h + 10_000}", params={"wait": "0.2"})
    assert r.status_code == 404
    acct = client.account(str(test_wallet(6).address()))
    assert acct is not None and json.dumps(acct)


def test_restart_on_same_home_keeps_height_and_app_hash(tmp_path: Path) -> None:
    home = tmp_path / "chain"
    first = NodeProcess(home, block_interval=0.05)
    try:
        c = HttpChainClient(first.url)
        block = c.wait_for_block(3, timeout=20)
        c.close()
    finally:
        first.stop()
    second = NodeProcess(home, block_interval=0.05)
    try:
        c = HttpChainClient(second.url)
        again = c.block(block.height)
        assert again.app_hash == block.app_hash and again.hash == block.hash
        assert c.wait_for_block(c.height(), timeout=20).prev_block_hash is not None
        c.close()
    finally:
        second.stop()
