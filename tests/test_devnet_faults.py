"""Devnet fault tolerance over real processes: a SIGKILLed chain node, a SIGKILLed host.

Both drive `Devnet` by hand (start, watch until a chosen moment, kill, restart, watch to the end)
and then hold the finished run to the same checks as `make devnet`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from gonka_diloco.cli import app
from gonka_diloco.devnet import START_TIMEOUT, Devnet
from gonka_diloco.devnet_config import make_config
from gonka_diloco.report import evaluate, load_snapshot
from tests.support.procs import QUICK, leftover_processes

HONEST = {**QUICK, "adversaries": [], "verifiers": 1}
RESTART_WINDOW = START_TIMEOUT + 30.0
"""Seconds of a training window in the host fault test: the longest a restarted host may take to
come up (`START_TIMEOUT`, past which `Devnet.restart` fails) and then fetch G, train and commit.
The chain waits that long only for a host that has not committed: with everyone in, the window
closes early (`early_close`), so it costs the runs nothing."""


def chain_status(dn: Devnet) -> dict[str, Any]:
    return httpx.get(f"{dn.rows['chain'].url}/inference/diloco/v1/status", timeout=5).json()


@pytest.mark.slow
def test_chain_killed_mid_run_resumes_and_the_run_completes(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    cfg = make_config({**HONEST, "hosts": 2})
    with Devnet(cfg, folder) as dn:
        dn.start()
        dn.watch(until=lambda run: run["current_step"] >= 1)
        before = chain_status(dn)
        block = dn.chain.block(before["height"])
        step0 = dn.chain.query("outer_step", run_id=dn.run_id, step=0)
        dn.kill("chain")
        dn.restart("chain")
        after = chain_status(dn)
        # Nothing committed is lost: the same block, the same outer step record, height not behind.
        assert after["height"] >= before["height"]
        assert dn.chain.block(before["height"]).hash == block.hash
        assert dn.chain.query("outer_step", run_id=dn.run_id, step=0)["result_hash"] == step0["result_hash"]
        dn.watch()
        dn.settle_losses()
        snap = dn.snapshot()
    assert leftover_processes(str(folder)) == []
    assert evaluate(snap) == []
    assert snap.node("chain").restarts == 1
    assert all(s.phase == "DONE" and s.accepted == ["host-0", "host-1"] for s in snap.steps)


@pytest.mark.slow
def test_host_killed_mid_outer_step_is_left_out_then_rejoins(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    # The step after the one it is killed in waits for it (RESTART_WINDOW): it rejoins there
    # however long its restart takes. With 4 s windows the chain ran the remaining steps out in
    # ~6 s each while it was down, and a restart takes 10-30 s on a loaded 2-core machine (torch's
    # import alone took 28 s beside two devnets): it rejoined in the last step or in none.
    phases = {**HONEST["phases"], "train": RESTART_WINDOW}
    timeout = HONEST["timeout"] + RESTART_WINDOW
    cfg = make_config({**HONEST, "hosts": 3, "outer_steps": 4, "phases": phases, "timeout": timeout})
    victim = "host-2"
    with Devnet(cfg, folder) as dn:
        dn.start()
        address = dn.rows[victim].address

        # Mid-outer-step: as soon as the chain holds the victim's step-1 commitment. Whether it had
        # revealed by then is a race the test reads from the chain below: the training window
        # closes early at the last commitment (often the victim's) and the reveal follows within a
        # few blocks, faster than a loaded poll, so under load it has usually revealed.
        def committed(run: dict[str, Any]) -> bool:
            if run["current_step"] != 1:  # step 1 does not exist before it opens
                return False
            return dn.chain.query("commitment", run_id=dn.run_id, host=address, step=1) is not None

        dn.watch(until=committed)
        dn.kill(victim)

        # Restart as soon as step 1 takes no more reveals (past `reveal_closes`), so it stays
        # unrevealed; step 2 opens meanwhile or soon after, and its training window waits for it.
        def reveals_closed(run: dict[str, Any]) -> bool:
            s = dn.chain.query("outer_step", run_id=dn.run_id, step=1)
            return run["current_step"] >= 2 or dn.chain.height() > s["reveal_closes"]

        dn.watch(until=reveals_closed)
        dn.restart(victim)
        dn.watch(until=lambda run: run["current_step"] >= 2)
        step1 = dn.chain.query("outer_step", run_id=dn.run_id, step=1)
        assert step1["phase"] == "DONE"  # the outer step finalized
        # On a badly overloaded machine the poll that saw the commitment can come late enough that
        # the victim was already challenged and had revealed: then its data went with it. Which
        # of the two happened is read from the chain, and each has its own expected outcome.
        reveals = dn.chain.query("reveals", run_id=dn.run_id, step=1)["reveals"]
        revealed = address in [r["host"] for r in reveals]
        if not revealed:  # the step finalized without the killed host
            assert address not in step1["accepted"] and len(step1["accepted"]) == 2
        dn.watch()
        dn.settle_losses()
        snap = dn.snapshot()
        operator_view_of_the_same_run(dn.rows["chain"].url, tmp_path / "from-chain", snap)
    assert leftover_processes(str(folder)) == []
    mine = {c.outer_step: c.outcome for c in snap.contributions if c.host == victim}
    assert mine.get(0) == "accepted"
    if revealed:  # verified from what it served before it died, or rejected: its data was gone
        assert mine.get(1) in ("accepted", "rejected"), mine
    else:  # committed, killed before revealing: its commitment is never opened
        assert mine.get(1) == "missing_reveal", mine
    # It came back in the first step after its restart and stayed in.
    assert {n: mine.get(n) for n in range(2, cfg.outer_steps)} == {2: "accepted", 3: "accepted"}, mine
    assert all(len(s.accepted) == 3 for s in snap.steps[2:]), snap.steps
    # Every other check of `make devnet` holds, except the victim's own step-1 entry.
    failures = evaluate(snap, expect_all_honest=False)
    assert [f for f in failures if not (victim in f and "outer step 1" in f)] == []
    assert snap.node(victim).restarts == 1


def operator_view_of_the_same_run(url: str, out: Path, snap: Any) -> None:
    """`report URL` and `status` rebuild the same contributions from the chain alone."""
    result = CliRunner().invoke(app, ["report", url, "--run-id", "1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    from_chain = load_snapshot(out)
    outcomes = sorted((c.address, c.outer_step, c.outcome) for c in from_chain.contributions)
    assert outcomes == sorted((c.address, c.outer_step, c.outcome) for c in snap.contributions)
    assert from_chain.chain.txs == snap.chain.txs and from_chain.chain.rewards == snap.chain.rewards
    status = CliRunner().invoke(app, ["status", "--chain-url", url, "--steps", "1"])
    assert status.exit_code == 0, status.output
    assert "finished" in status.output and "accepted" in status.output
