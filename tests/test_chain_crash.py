"""kill -9 during a stream of txs: every acknowledged tx survives, the app hash is unchanged."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import httpx
import pytest

from chain.cli import NodeProcess
from chain.client import HttpChainClient, TxResult
from protocol.keys import test_wallet
from protocol.messages import Coin, MsgSend

pytestmark = pytest.mark.slow
SENDERS = (10, 11, 12)


def test_sigkill_mid_stream_loses_no_acknowledged_tx(tmp_path: Path) -> None:
    home = tmp_path / "chain"
    node = NodeProcess(home, block_interval=0.05)
    acknowledged: list[TxResult] = []
    lock = threading.Lock()
    enough = threading.Event()
    stop = threading.Event()
    try:
        client = HttpChainClient(node.url, timeout=5)

        def stream(sender: int) -> None:
            w = test_wallet(sender)
            msg = MsgSend(
                from_address=str(w.address()),
                to_address=str(test_wallet(0).address()),
                amount=[Coin(amount=sender)],
            )
            while not stop.is_set():
                try:
                    result = client.broadcast(w, [msg], timeout=10)
                except Exception:  # the node died under us: expected after the kill
                    return
                with lock:
                    acknowledged.append(result)
                    if len(acknowledged) >= 30:
                        enough.set()

        threads = [threading.Thread(target=stream, args=(s,), daemon=True) for s in SENDERS]
        for t in threads:
            t.start()
        assert enough.wait(60), "the stream did not get going"
        served = httpx.get(f"{node.url}/inference/diloco/v1/status").json()  # committed before it is served
        node.kill()  # SIGKILL while the senders are still broadcasting
        stop.set()
        for t in threads:
            t.join(30)
        with lock:
            acked = list(acknowledged)
        last_seen = max(r.height for r in acked)
    finally:
        stop.set()
        node.kill()

    restarted = NodeProcess(home, block_interval=0.05)
    try:
        client = HttpChainClient(restarted.url)
        assert client.height() >= last_seen
        for result in acked:
            got = httpx.get(f"{restarted.url}/cosmos/tx/v1beta1/txs/{result.hash}")
            assert got.status_code == 200, result.hash
            resp = got.json()["tx_response"]
            assert int(resp["height"]) == result.height and resp["code"] == 0
        # the last block served before the kill is identical after the restart, and the chain moves on
        assert client.block(served["height"]).app_hash == served["app_hash"]
        assert client.block(served["height"]).hash == served["block_hash"]
        status = httpx.get(f"{restarted.url}/inference/diloco/v1/status").json()
        next_block = client.wait_for_block(status["height"], timeout=20)
        assert next_block.prev_block_hash == client.block(status["height"]).hash
        # the restarted node persists row by row from where the rows on disk left off: its blocks
        # write a handful of rows (root, a few accounts), never the whole state again
        blocks = [
            json.loads(x) for x in restarted.log_path.read_text().splitlines() if '"event":"block"' in x
        ]
        after = [b for b in blocks if b["height"] > status["height"] - 1]
        assert after and all(b["rows"] <= 8 for b in after), after[:3]
        # sequences resume where the committed state left them
        w = test_wallet(SENDERS[0])
        assert client.broadcast(
            w, [MsgSend(from_address=str(w.address()), to_address=str(w.address()), amount=[Coin(amount=1)])]
        ).ok
        client.close()
    finally:
        restarted.stop()
