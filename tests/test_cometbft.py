"""The chain on CometBFT: four validator processes (app + CometBFT each) carry a training devnet.

One localnet run holds every scenario in sequence, to keep the suite's time: a training devnet
(one honest host, one adversary, one verifier) whose run completes through a SIGKILLed validator,
its restart and catch-up, and a halt with two of four validators killed (no new blocks, no fork)
until they come back; every validator then holds the same block and app hash at every height.
An unmodified cosmpy `LedgerClient` sends ngonka through one validator and reads it from another.
Last, a validator restarted with one rule altered diverges at the first block that rule touches,
is stopped by CometBFT, refuses to serve its state, and is shown as diverged in the report.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from cosmpy.aerial.client import LedgerClient
from cosmpy.aerial.config import NetworkConfig

from chain.abci.cometbft import ensure_binary
from chain.abci.faults import FAULT_ENV
from chain.client import ChainTimeout, HttpChainClient
from gonka_diloco.devnet import Devnet
from gonka_diloco.devnet_config import make_config
from gonka_diloco.report import evaluate
from protocol.keys import test_wallet
from protocol.messages import Coin, MsgSend
from tests.support.procs import QUICK, leftover_processes

pytestmark = pytest.mark.slow
API = "/inference/diloco/v1"
BFT = {
    **QUICK,
    "hosts": 2,
    "verifiers": 1,
    "adversaries": [{"behaviour": "noise"}],
    "outer_steps": 3,
    "engine": "cometbft",
    "validators": 4,
    "block_interval": 0.25,
}


def status(url: str) -> dict[str, Any]:
    return httpx.get(f"{url}{API}/status", timeout=5).json()


def block(url: str, height: int, wait: float = 0.0) -> dict[str, Any] | None:
    """Block `height` from one validator (waiting up to `wait` s for it), None if it has none."""
    r = httpx.get(f"{url}{API}/blocks/{height}", params={"wait": wait}, timeout=wait + 10)
    return r.json() if r.status_code == 200 else None


def ledger(url: str) -> LedgerClient:
    return LedgerClient(
        NetworkConfig(
            chain_id="gonka-devnet",
            url=f"rest+{url}",
            fee_minimum_gas_price=1,
            fee_denomination="ngonka",
            staking_denomination="ngonka",
        )
    )


def committed(home: Path) -> list[tuple[int, str, str]]:
    """(height, block hash, app hash) of every block in a validator's store, read-only."""
    db = sqlite3.connect(f"file:{home / 'app' / 'chain.sqlite'}?mode=ro", uri=True)
    try:
        rows = db.execute("SELECT height, hash, header FROM blocks ORDER BY height").fetchall()
    finally:
        db.close()
    assert [h for h, _, _ in rows] == list(range(1, len(rows) + 1))
    return [(h, block_hash, json.loads(header)["app_hash"]) for h, block_hash, header in rows]


def caught_up(url: str, height: int, timeout: float = 120.0) -> dict[str, Any]:
    """Block `height` once `url` has it. A restarted validator block-syncs from its peers first:
    under CPU starvation that took longer than one 30 s wait (seen once at 3× oversubscription), so
    this asks again until `timeout`; an honest catch-up returns as soon as the block is there."""
    deadline = time.monotonic() + timeout
    while (found := block(url, height, wait=min(30.0, max(1.0, deadline - time.monotonic())))) is None:
        assert time.monotonic() < deadline, f"{url} did not reach height {height} within {timeout:.0f} s"
    return found


def test_four_validators_carry_a_run_through_crashes_and_expose_a_liar(tmp_path: Path) -> None:
    ensure_binary()
    folder = tmp_path / "run"
    cfg = make_config(BFT)
    with Devnet(cfg, folder) as dn:
        dn.start()
        url = {v.name: v.rest_url for v in dn.localnet.validators}  # type: ignore[union-attr]
        v0, v1, v2, v3 = (url[f"validator-{i}"] for i in range(4))

        # An unmodified cosmpy LedgerClient: send through validator-0, read from validator-2.
        recipient = test_wallet(21).address()
        before = ledger(v2).query_bank_balance(recipient, "ngonka")
        sent = ledger(v0).send_tokens(recipient, 777, "ngonka", test_wallet(20)).wait_to_complete()
        caught_up(v2, int(sent.response.height))
        assert ledger(v2).query_bank_balance(recipient, "ngonka") == before + 777

        # SIGKILL one validator mid-run: the other three carry on; restarted, it catches up.
        dn.watch(until=lambda run: run["current_step"] >= 1)
        dn.kill("validator-1")
        killed_at = status(v0)["height"]
        dn.chain.wait_for_block(killed_at + 3, timeout=60)
        dn.restart("validator-1")
        target = status(v0)["height"]
        assert caught_up(v1, target)["header"]["app_hash"] == caught_up(v0, target)["header"]["app_hash"]

        # SIGKILL two of four: no quorum, so no new block anywhere, and no fork.
        dn.kill("validator-2")
        dn.kill("validator-3")
        stuck = max(status(v0)["height"], status(v1)["height"])
        while block(v0, stuck + 1, wait=3.0) is not None:  # a block already voted may still land
            stuck += 1
        assert block(v1, stuck + 1, wait=2.0) is None and block(v0, stuck + 1) is None
        assert caught_up(v1, stuck)["hash"] == caught_up(v0, stuck)["hash"]
        dn.restart("validator-2")
        dn.restart("validator-3")
        dn.chain.wait_for_block(stuck, timeout=60)  # the chain resumes ...
        dn.watch()  # ... and the run completes
        dn.settle_losses()
        snap = dn.snapshot()

        assert evaluate(snap) == [], evaluate(snap)
        adversary = [c for c in snap.contributions if c.host == "host-1"]
        assert adversary and {c.outcome for c in adversary} == {"rejected"}
        val = snap.val_loss()
        assert val[cfg.outer_steps - 1] < val[0]
        assert [v.state for v in snap.validators] == ["ok"] * 4
        # validator-1 was down while the others made blocks; 2 and 3 only while none were made.
        assert {v.name: v.missed_blocks for v in snap.validators}["validator-1"] > 0
        assert {v.name: v.restarts for v in snap.validators} == {
            "validator-0": 0,
            "validator-1": 1,
            "validator-2": 1,
            "validator-3": 1,
        }

        # Every validator committed the same blocks and the same app hash at every height (read
        # from each one's own database: a few ms, where 4 × hundreds of HTTP reads take minutes).
        chains = [committed(folder / "chain" / v.home) for v in dn.localnet.validators]  # type: ignore[union-attr]
        top = min(len(c) for c in chains)
        # (a whole run: windows close early, §2.3.1, so it takes tens of blocks, not hundreds)
        assert top > 30 and all(c[:top] == chains[0][:top] for c in chains)

        # One rule altered (fees refunded): validator-3 diverges at the first block with a fee.
        dn.kill("validator-3")
        dn.restart("validator-3", env={FAULT_ENV: "free-fees"})
        honest = HttpChainClient([v0, v1, v2])
        w = test_wallet(22)
        msg = MsgSend(from_address=str(w.address()), to_address=str(recipient), amount=[Coin(amount=1)])
        included = honest.broadcast(w, [msg]).height
        height = included
        while not status(v3)["halted"]:
            with contextlib.suppress(ChainTimeout):
                height = honest.wait_for_block(height, timeout=10).height
            assert height < included + 40, "the altered validator was never stopped"
        assert "diverged" in status(v3)["halted"]
        assert httpx.get(f"{v3}/cosmos/bank/v1beta1/balances/{recipient}").status_code == 503
        honest.wait_for_block(height + 2, timeout=30)  # three honest validators keep the chain going
        liar = dn.snapshot()
        states = {v.name: v.state for v in liar.validators}
        assert states == {
            "validator-0": "ok",
            "validator-1": "ok",
            "validator-2": "ok",
            "validator-3": "diverged",
        }
        assert any(f.startswith("validator validator-3 diverged") for f in evaluate(liar))
        honest.close()
    assert leftover_processes(str(folder)) == []
