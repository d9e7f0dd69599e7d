"""Crash safety: a host stopped mid outer step and restarted on the same data_dir carries on.

The chain is held still while the host is down (`LockstepChain.hold`), so "restarted before the
deadline" and "restarted after it" are exact, not timing accidents.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.support.nodes import (
    QUICK_HOST,
    LockstepChain,
    commit_count,
    crash_on,
    create_run,
    host_config,
    run_config,
    running,
    then_stop,
    tiny_corpus,
    verifier_node,
)
from trainer.behaviour import HostBehaviour, OuterContext
from trainer.commit import TrainedStep
from trainer.node import HostNode


def _setup(tmp_path: Path, steps: int, n_hosts: int) -> tuple[LockstepChain, Any, int, list, Any]:
    corpus = tiny_corpus()
    chain = LockstepChain()
    cfg = run_config(corpus, max_outer_steps=steps)
    run_id = create_run(chain, cfg)
    verifier = verifier_node(tmp_path, 9, run_id, corpus)
    return chain, corpus, run_id, [verifier], cfg


def test_restart_after_commit_reveals_without_recommitting_and_fetches_lost_global(tmp_path: Path) -> None:
    chain, corpus, run_id, verifiers, _ = _setup(tmp_path, steps=3, n_hosts=2)
    other = HostNode(
        host_config(tmp_path, 2, run_id), chain, corpus=corpus, log=lambda e: None, patience=QUICK_HOST
    )
    first = HostNode(host_config(tmp_path, 1, run_id), chain, corpus=corpus, patience=QUICK_HOST, log=print)
    sink = crash_on(first, chain, "committed", step=1)
    first.rt.sink = sink
    logs: list[dict[str, Any]] = []
    chain.hold()  # nobody moves until the first host has started too
    lingering = [other]
    with running([lambda: other.run(linger=True), then_stop(verifiers[0].run, lingering)], chain):
        with running([first.run], chain):
            chain.release()  # returns once the crashed node's thread has stopped; the chain is held
        assert [e["event"] for e in sink.logs][-1] == "stopped"
        shutil.rmtree(tmp_path / "host-1" / "store" / "global")  # G_1 lost in the crash: comes from a peer
        second = HostNode(
            host_config(tmp_path, 1, run_id), chain, corpus=corpus, log=logs.append, patience=QUICK_HOST
        )
        assert second.server.port == first.server.port  # same endpoint as on chain
        lingering.append(second)
        with running([lambda: second.run(linger=True)], chain):
            chain.release()
    events = [(e["event"], e.get("outer_step")) for e in logs]
    assert ("resumed", 1) in events and ("trained", 1) not in events
    assert ("fetching_global", None) in events
    assert ("trained", 2) in events and ("sitting_out", 1) not in events
    assert commit_count(chain, first.address) == 3
    for n in range(3):
        step = chain.query("outer_step", run_id=run_id, step=n)
        assert step["accepted"] == sorted([first.address, other.address]), n
        c = chain.query("commitment", run_id=run_id, host=first.address, step=n)
        assert c["equivocation_tx"] is None
    final = chain.run(run_id)["global_model_hash"]
    assert (tmp_path / "host-1" / "store" / "global" / f"{final}.model").exists()


class CrashBeforeBroadcast(HostBehaviour):
    """Trains honestly, then 'dies' between saving its record and broadcasting the commit."""

    node: HostNode
    chain: LockstepChain
    crashed = False

    def commit_messages(self, contribution: TrainedStep, ctx: OuterContext) -> list:
        if not self.crashed:
            self.crashed = True
            self.chain.hold()
            self.node.stop()
            return []
        return super().commit_messages(contribution, ctx)


@pytest.mark.parametrize("corrupt", [False, True], ids=["record-kept", "record-corrupted"])
def test_restart_between_training_and_commit_commits_the_saved_record(tmp_path: Path, corrupt: bool) -> None:
    """The record is on disk before the broadcast: a restart commits it without retraining; a
    record that no longer matches its hash is not trusted, the host retrains (deterministically)."""
    chain, corpus, run_id, verifiers, _ = _setup(tmp_path, steps=2, n_hosts=1)
    crashing = CrashBeforeBroadcast()
    crashing.chain = chain
    cfg = host_config(tmp_path, 1, run_id)
    first = HostNode(cfg, chain, corpus=corpus, behaviour=crashing, log=lambda e: None, patience=QUICK_HOST)
    crashing.node = first
    logs: list[dict[str, Any]] = []
    lingering: list[HostNode] = []
    chain.hold()
    with running([then_stop(verifiers[0].run, lingering)], chain):
        with running([first.run], chain):
            chain.release()
        assert chain.query("commitment", run_id=run_id, host=first.address, step=0) is None
        saved = json.loads((tmp_path / "host-1" / "commits" / "0.json").read_bytes())
        if corrupt:
            payload = tmp_path / "host-1" / "store" / "delta-0" / f"{saved['delta_hash']}.delta"
            payload.write_bytes(payload.read_bytes()[:-1] + bytes([payload.read_bytes()[-1] ^ 1]))
        second = HostNode(cfg, chain, corpus=corpus, log=logs.append, patience=QUICK_HOST)
        lingering.append(second)
        with running([lambda: second.run(linger=True)], chain):
            chain.release()
    events = [(e["event"], e.get("outer_step")) for e in logs]
    assert ("committed", 0) in events and ("trained", 1) in events
    if corrupt:
        assert ("record_unreadable", 0) in events and ("trained", 0) in events
    else:
        assert ("trained", 0) not in events  # the saved record, not a retrain
    committed = chain.query("commitment", run_id=run_id, host=first.address, step=0)
    assert committed["trajectory_root"] == saved["trajectory_root"]  # retraining is deterministic
    assert chain.query("outer_step", run_id=run_id, step=0)["accepted"] == [first.address]
    assert chain.query("outer_step", run_id=run_id, step=1)["accepted"] == [first.address]


def test_missed_reveal_deadline_sits_out_then_rejoins_next_step(tmp_path: Path) -> None:
    chain, corpus, run_id, verifiers, _ = _setup(tmp_path, steps=2, n_hosts=2)
    other = HostNode(
        host_config(tmp_path, 2, run_id), chain, corpus=corpus, log=lambda e: None, patience=QUICK_HOST
    )
    first = HostNode(
        host_config(tmp_path, 1, run_id), chain, corpus=corpus, log=lambda e: None, patience=QUICK_HOST
    )
    first.rt.sink = crash_on(first, chain, "committed", step=0)
    logs: list[dict[str, Any]] = []
    chain.hold()
    lingering = [other]
    with running([lambda: other.run(linger=True), then_stop(verifiers[0].run, lingering)], chain):
        with running([first.run], chain):
            chain.release()
        deadline = chain.query("outer_step", run_id=run_id, step=0)["reveal_deadline"]
        chain.run_until(deadline + 1)  # the others go on; this host stays down past its reveal deadline
        second = HostNode(
            host_config(tmp_path, 1, run_id), chain, corpus=corpus, log=logs.append, patience=QUICK_HOST
        )
        lingering.append(second)
        with running([lambda: second.run(linger=True)], chain):
            chain.release()
    step0 = chain.query("outer_step", run_id=run_id, step=0)
    assert step0["outcomes"][first.address] == "missing_reveal"
    assert step0["accepted"] == [other.address]
    events = [(e["event"], e.get("outer_step")) for e in logs]
    assert ("reveal_refused", 0) in events
    # it never applied its own unaccepted Δ: its G_1 is the chain's, from the other host alone
    assert ("outer_step_applied", 0) in events and ("result_differs", 0) not in events
    # next step: back in with a fresh optimizer (the chain dropped its unverified one), accepted
    assert ("trained", 1) in events
    assert chain.query("outer_step", run_id=run_id, step=1)["accepted"] == sorted(
        [first.address, other.address]
    )
    assert second.snapshot()["rejected"] == 1 and second.snapshot()["accepted"] == 1
