"""Signed txs per second through the devnet node's HTTP API, signatures checked.

Pre-signs N bank MsgSends from several dev accounts (consecutive sequences), starts a node as a
subprocess, broadcasts them concurrently (one ordered stream per account, as a real client must),
and measures from the first broadcast until the last tx is committed.
Run: `.venv/bin/python -m bench.chain_tps [--txs N] [--accounts K]`.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import tempfile
import threading
import time
from pathlib import Path

from chain.cli import NodeProcess
from chain.client import sign_tx
from chain.genesis import genesis_state
from chain.node import dev_genesis
from protocol.keys import test_wallet
from protocol.messages import Coin, MsgSend

RESULTS = Path(__file__).parent / "results" / "chain_tps.json"


def presign(n_txs: int, n_accounts: int) -> list[list[bytes]]:
    state = genesis_state(dev_genesis())
    streams: list[list[bytes]] = []
    for k in range(n_accounts):
        w = test_wallet(1 + k)
        number = state.accounts[str(w.address())].number
        msg = MsgSend(
            from_address=str(w.address()), to_address=str(test_wallet(0).address()), amount=[Coin(amount=1)]
        )
        streams.append(
            [
                sign_tx(
                    w,
                    [msg],
                    chain_id="gonka-devnet",
                    account_number=number,
                    sequence=s,
                    gas_limit=100_000,
                    fee=100_000,
                )
                for s in range(n_txs // n_accounts)
            ]
        )
    return streams


def run(url: str | list[str], streams: list[list[bytes]]) -> dict[str, float]:
    """One thread per account with its own keep-alive connection: ordered per account, concurrent
    across accounts, and light enough on the client side not to starve the node of CPU. With several
    URLs (validators) the accounts' streams are spread over them; blocks are read from the first."""
    urls = [url] if isinstance(url, str) else url
    hosts = [u.removeprefix("http://").split(":") for u in urls]
    host, port = hosts[0]
    bodies = [
        [
            json.dumps({"tx_bytes": base64.b64encode(raw).decode(), "mode": "BROADCAST_MODE_SYNC"}).encode()
            for raw in s
        ]
        for s in streams
    ]
    start_height = json.loads(_get(host, port, "/inference/diloco/v1/status"))["height"]
    rejected = [0] * len(streams)

    def stream(i: int) -> None:
        to_host, to_port = hosts[i % len(hosts)]
        conn = http.client.HTTPConnection(to_host, int(to_port), timeout=30)
        for body in bodies[i]:
            conn.request("POST", "/cosmos/tx/v1beta1/txs", body, {"Content-Type": "application/json"})
            resp = json.loads(conn.getresponse().read())
            rejected[i] += resp["tx_response"].get("code", 0) != 0
        conn.close()

    t0 = time.perf_counter()
    threads = [threading.Thread(target=stream, args=(i,)) for i in range(len(streams))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    t_broadcast = time.perf_counter() - t0
    total, n_rejected = sum(len(s) for s in streams), sum(rejected)
    committed, height = 0, start_height
    while committed < total - n_rejected:
        block = json.loads(_get(host, port, f"/inference/diloco/v1/blocks/{height + 1}?wait=10"))
        committed += sum(res["code"] == 0 for res in block["results"])
        height += 1
    elapsed = time.perf_counter() - t0
    return {
        "txs": total,
        "rejected": n_rejected,
        "committed": committed,
        "blocks": height - start_height,
        "broadcast_s": round(t_broadcast, 3),
        "elapsed_s": round(elapsed, 3),
        "broadcast_tps": round(total / t_broadcast, 1),
        "committed_tps": round(committed / elapsed, 1),
    }


def _get(host: str, port: str, path: str) -> bytes:
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        body = resp.read()
        if resp.status != 200:
            raise RuntimeError(f"GET {path}: {resp.status} {body[:200]!r}")
        return body
    finally:
        conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--txs", type=int, default=3000)
    parser.add_argument("--accounts", type=int, default=16)
    parser.add_argument("--block-interval", type=float, default=0.5)
    args = parser.parse_args()
    print(f"pre-signing {args.txs} txs from {args.accounts} accounts ...")
    streams = presign(args.txs, args.accounts)
    with tempfile.TemporaryDirectory() as tmp:
        node = NodeProcess(Path(tmp) / "chain", block_interval=args.block_interval)
        try:
            figures = run(node.url, streams)
        finally:
            node.stop()
    figures.update(accounts=args.accounts, block_interval=args.block_interval, goal_tps=300)
    print(f"{'metric':<16}{'value':>12}")
    for key, value in figures.items():
        print(f"{key:<16}{value:>12}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(figures, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
