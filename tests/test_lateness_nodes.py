"""Lateness is not fraud (issue 22, specs §2.2.2) against real nodes: an in-process chain, hosts and
verifiers serving over HTTP, one outer step, v = 1, bitwise mode.

A host whose reveal lands after the reveal deadline but inside its grace (`reveal_closes`, half
the verify window) is fetched, replayed and accepted like the on-time hosts beside it: its work
enters the model, it is paid and not slashed. The adversary, a host that keeps its openings back
past the grace, cannot reveal any more: it ends `missing_reveal`, slashed, while the honest hosts
beside it are accepted and adopt the new model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from protocol.config import Phases
from tests.support.nodes import (
    STAKE,
    LockstepChain,
    diagnosis,
    nodes,
    run_config,
    running,
    stakes,
    start,
    tiny_corpus,
)

PHASES = Phases(join_blocks=3, train_blocks=3, reveal_blocks=3, verify_blocks=6, escalation_blocks=2,
                result_blocks=3, epoch_length=1000, poc_window=0)  # fmt: skip
GRACE = PHASES.verify_blocks // 2


@pytest.mark.parametrize("late", [GRACE, GRACE + 1], ids=["in_grace", "past_grace"])
def test_a_late_reveal_is_judged_a_withheld_one_is_slashed(tmp_path: Path, late: int) -> None:
    chain = LockstepChain()
    cfg = run_config(tiny_corpus(), max_outer_steps=1, phases=PHASES)
    names = {1: "honest", 2: "honest", 3: "late_reveal"}
    logs: list[dict[str, Any]] = []
    run_id, hosts, vs = start(tmp_path, chain, cfg, names, {11: "honest"}, logs)
    hosts[3].behaviour.blocks = late  # type: ignore[attr-defined]
    with running(nodes(hosts, vs), chain):
        pass

    addr = {i: n.address for i, n in hosts.items()}
    honest, slow = [addr[1], addr[2]], addr[3]
    step = chain.query("outer_step", run_id=run_id, step=0)
    assert step["phase"] == "DONE", diagnosis(step, addr, logs)
    reveals = {r["host"]: r["height"] for r in chain.query("reveals", run_id=run_id, step=0)["reveals"]}
    s = stakes(chain, run_id)
    assert all(s[h] == STAKE for h in honest)
    g = step["result_hash"]
    assert g == chain.run(run_id)["global_model_hash"] != cfg.initial_model_hash
    if late == GRACE:  # on chain after the deadline, inside the grace: judged like the others
        assert step["reveal_deadline"] < reveals[slow] <= step["reveal_closes"]
        assert step["outcomes"] == dict.fromkeys(addr.values(), "accepted"), diagnosis(step, addr, logs)
        assert s[slow] == STAKE
    else:  # refused past the grace: it never revealed, and is slashed as a withholder
        assert slow not in reveals
        refused = [e for e in logs if e["event"] == "reveal_refused" and e["node"] == "host-3"]
        assert refused and "ErrLateReveal" in str(refused[0]["error"]), refused
        assert step["outcomes"] == {**dict.fromkeys(honest, "accepted"), slow: "missing_reveal"}
        assert s[slow] == STAKE - STAKE * cfg.stake.host_slash_bps // 10_000
