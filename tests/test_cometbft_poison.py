"""Poison txs against four real validators (app + CometBFT each): the chain keeps making blocks.

Issue 23: one MsgSend whose fee amount was written in superscript digits made a validator's
CheckTx throw, CometBFT closed its app connection and the validator stopped; two such txs stopped
two of four validators and the chain with them. Here every poison of the fuzzer's classes (that
tx, an overlong amount, Arabic-Indic digits, raw junk, a wrong type URL, a non-canonical bank
amount, a mangled tx, a 2^64 − 1 gas limit) is sent to each validator, through its REST route and
straight to its CometBFT RPC: each is refused with a code, an honest send next to them commits,
and all four validators keep making blocks with the same app hash. In-process, fuzzed:
tests/test_tx_fuzz.py.
"""

from __future__ import annotations

import base64
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from cosmpy.protos.cosmos.tx.v1beta1.tx_pb2 import AuthInfo, TxBody, TxRaw
from google.protobuf import any_pb2

from chain.abci.cometbft import ensure_binary, write_localnet
from chain.cli import Engine, NodeProcess
from chain.client import HttpChainClient
from protocol.keys import test_wallet
from protocol.messages import Coin, MsgSend
from tests.support.txs import GENESIS, poison_fee_tx, send_tx

pytestmark = pytest.mark.slow
API = "/inference/diloco/v1"


def poisons() -> list[bytes]:
    """One tx of each class that used to (or could) make a handler throw."""
    tx = TxRaw.FromString(send_tx(3, 0))
    body = TxBody.FromString(tx.body_bytes)
    wrong_url = TxBody(messages=[any_pb2.Any(type_url="/x.y.Z", value=b"\xff" * 9)])
    bank = body.messages[0]
    from cosmpy.protos.cosmos.bank.v1beta1 import tx_pb2 as bank_pb2

    send = bank_pb2.MsgSend.FromString(bank.value)
    send.amount[0].amount = "\u0661\u0662"
    odd_amount = TxBody(messages=[any_pb2.Any(type_url=bank.type_url, value=send.SerializeToString())])
    gas = AuthInfo.FromString(tx.auth_info_bytes)
    gas.fee.gas_limit = 2**64 - 1
    out = [
        poison_fee_tx(),  # issue 23's: superscript digits
        poison_fee_tx("9" * 5000),
        poison_fee_tx("\u0664\u0660\u0660\u0660\u0660\u0660"),
        b"\xff" * 311,
        TxRaw(body_bytes=wrong_url.SerializeToString(), auth_info_bytes=tx.auth_info_bytes,
              signatures=tx.signatures).SerializeToString(),
        TxRaw(body_bytes=odd_amount.SerializeToString(), auth_info_bytes=tx.auth_info_bytes,
              signatures=tx.signatures).SerializeToString(),
        TxRaw(body_bytes=tx.body_bytes, auth_info_bytes=gas.SerializeToString(),
              signatures=tx.signatures).SerializeToString(),
        send_tx(3, 0)[:-7] + b"\x12\x05\x0a\x03abc",
    ]  # fmt: skip
    return out


def _get(url: str, path: str, timeout: float = 10.0, **params: Any) -> httpx.Response:
    return httpx.get(f"{url}{path}", params=params, timeout=timeout)


def height(url: str) -> int:
    try:
        r = _get(url, f"{API}/status", timeout=5)
        return int(r.json().get("height", 0)) if r.status_code == 200 else 0
    except (httpx.HTTPError, ValueError):
        return 0


def block(url: str, h: int, wait: float = 30.0) -> dict[str, Any]:
    r = _get(url, f"{API}/blocks/{h}", timeout=wait + 10, wait=wait)
    assert r.status_code == 200, f"{url} has no block {h}: {r.status_code} {r.text[:200]}"
    return r.json()


def test_four_validators_refuse_every_poison_tx_and_keep_making_blocks(tmp_path: Path) -> None:
    ensure_binary()
    net = write_localnet(tmp_path / "net", 4, genesis=GENESIS, block_interval=0.2)
    procs = []
    try:
        for v in net.validators:
            procs.append(NodeProcess(net.home(v.name), engine=Engine.COMETBFT, port=None,
                                     log_path=tmp_path / f"{v.name}.log"))  # fmt: skip
        rest = [v.rest_url for v in net.validators]
        deadline = time.monotonic() + 90
        while min(height(u) for u in rest) < 2:
            assert time.monotonic() < deadline, "the localnet did not start"
            time.sleep(0.2)
        for i, raw in enumerate(poisons()):
            v = net.validators[i % 4]
            body = {"tx_bytes": base64.b64encode(raw).decode(), "mode": "BROADCAST_MODE_SYNC"}
            r = httpx.post(f"{v.rest_url}/cosmos/tx/v1beta1/txs", json=body, timeout=15)
            assert r.status_code == 200, r.text
            assert r.json()["tx_response"].get("code", 0) != 0, (i, r.text)
            rpc = {"jsonrpc": "2.0", "id": i, "method": "broadcast_tx_sync",
                   "params": {"tx": base64.b64encode(raw).decode()}}  # fmt: skip
            other = net.validators[(i + 1) % 4]
            answer = httpx.post(other.rpc_url, json=rpc, timeout=15).json()
            assert "error" not in answer and answer["result"]["code"] != 0, (i, answer)
        client = HttpChainClient(rest)
        try:
            sender, to = (str(test_wallet(i).address()) for i in (4, 5))
            msg = MsgSend(from_address=sender, to_address=to, amount=[Coin(amount=777)])
            sent = client.broadcast(test_wallet(4), [msg])
        finally:
            client.close()
        target = max(height(u) for u in rest) + 3
        headers = [block(u, target)["header"] for u in rest]  # every validator reaches it
        assert len({h["app_hash"] for h in headers}) == 1, headers
        assert block(rest[0], sent.height)["header"]["height"] == sent.height
        for u in rest:
            status = _get(u, f"{API}/status").json()
            assert status.get("engine_alive", True) and not status.get("halted"), status
    finally:
        for p in procs:
            p.stop()
