"""Real host and verifier nodes on the overlapped schedule (specs §2.2.1), in-process chain.

Hosts train step n+1 while step n is revealed, verified and aggregated; an adversary is rejected
in every step and never reaches the model; the global validation loss falls; a host that crashes
during the overlap and restarts on its data_dir picks both steps back up without recommitting.
The chain runs in lockstep with every node thread, the nodes' worker threads included (`counted`).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from protocol.config import Overlap
from protocol.messages import Reason
from replay.data import eval_loss
from replay.spec import build_model
from tests.support.nodes import (
    SPEC,
    LockstepChain,
    commit_count,
    counted,
    crash_on,
    create_run,
    host,
    node_globals,
    run_config,
    running,
    then_stop,
    tiny_corpus,
    verdicts,
    verifier_node,
)
from trainer.node import VAL_BATCHES

STEPS = 3


def overlapped_config(corpus: Any, **kw: Any) -> Any:
    return run_config(corpus, overlap=Overlap.EAGER, max_outer_steps=STEPS, **kw)


def test_overlapped_run_rejects_an_eager_start_and_the_loss_falls(tmp_path: Path) -> None:
    """Two honest hosts and `eager`, which starts each step from its base minus its own step
    n − 1 Δ, not yet verified (Kale et al.'s eager update): honest in step 0 (no Δ yet), then
    rejected in every step, never in the model; the honest hosts are accepted."""
    from gonka_diloco.adversaries import resolve_host

    corpus = tiny_corpus()
    chain = LockstepChain()
    cfg = overlapped_config(corpus)
    run_id = create_run(chain, cfg)
    verifier = counted(chain, verifier_node(tmp_path, 9, run_id, corpus))
    honest = [host(tmp_path, i, run_id, chain, corpus) for i in (1, 2)]
    cheat = host(tmp_path, 3, run_id, chain, corpus, behaviour=resolve_host("eager"))
    hosts = [*honest, cheat]
    with running([lambda h=h: h.run(linger=True) for h in hosts] + [then_stop(verifier.run, hosts)], chain):
        pass
    steps = [chain.query("outer_step", run_id=run_id, step=n) for n in range(STEPS)]
    for n, step in enumerate(steps):
        assert step["phase"] == "DONE", n
        assert step["outcomes"][cheat.address] == ("accepted" if n == 0 else "rejected"), n
        assert step["accepted"] == sorted(h.address for h in (hosts if n == 0 else honest)), n
    on_cheat = {(n, r) for n, h, r in verdicts(chain, run_id, STEPS) if h == cheat.address}
    # two segments in one window: every check rebuilds segment 0's start from the base and the
    # carried optimizer, which the eager start is not (with segment sampling and s = 1 only the last
    # segment is opened, and its Δ, from its eager start, not the base, gives it away instead)
    assert on_cheat == {(0, Reason.ACCEPT), (1, Reason.WRONG_START), (2, Reason.WRONG_START)}
    # two steps were in flight: step n+1 trained and committed before step n closed
    for n in range(STEPS - 1):
        nxt = chain.query("commitment", run_id=run_id, host=honest[0].address, step=n + 1)
        assert nxt["height"] < steps[n]["done_height"], n
    # the base of step n is the result of step n − 2; G_0 for steps 0 and 1
    assert steps[0]["base_model_hash"] == steps[1]["base_model_hash"] == cfg.initial_model_hash
    assert steps[2]["base_model_hash"] == steps[0]["result_hash"]
    final = chain.run(run_id)["global_model_hash"]
    assert final == steps[-1]["result_hash"]
    for node in hosts:  # every host, the cheat too, holds the chain's final G bit for bit
        assert node_globals(node.dir).load(final).hash == final
    g0 = build_model(SPEC)
    initial = eval_loss(g0, corpus.val, VAL_BATCHES, cfg.seed, batch_size=4, seq_len=cfg.seq_len)
    curve = [honest[0].snapshot()["val_loss"][str(n)] for n in range(STEPS)]
    print(f"overlapped: global val loss G_0 {initial:.4f} -> " + " -> ".join(f"{x:.4f}" for x in curve))
    assert initial > curve[-1] and curve[-1] < curve[0], (initial, curve)
    assert honest[1].snapshot()["val_loss"] == honest[0].snapshot()["val_loss"]
    assert cheat.snapshot()["rejected"] == STEPS - 1
    assert all(h.snapshot()["training_seconds"] > 0 for h in honest)


def test_host_crash_during_overlap_then_restart_resumes_both_steps(tmp_path: Path) -> None:
    """Host 1 dies right after committing step 1, while step 0 (committed, not yet revealed or
    aggregated) is in flight; the chain is held while it is down. Restarted on its data_dir it
    reveals and aggregates step 0, reveals step 1 without retraining or recommitting, trains
    step 2: accepted in every step, no equivocation. With segment 0 opened, the restarted
    host recomputes step 1's opened start from its eager start (its own step 0 Δ, read back from
    disk) and trains step 2 from the one on its step 1 Δ."""
    corpus = tiny_corpus()
    chain = LockstepChain()
    run_id = create_run(chain, overlapped_config(corpus, sampled_segments=2))
    verifier = counted(chain, verifier_node(tmp_path, 9, run_id, corpus))
    other = host(tmp_path, 2, run_id, chain, corpus)
    first = host(tmp_path, 1, run_id, chain, corpus)
    sink = crash_on(first, chain, "committed", step=1)
    first.rt.sink = sink
    logs: list[dict[str, Any]] = []
    chain.hold()  # nobody moves until the first host has started too
    lingering = [other]
    with running([lambda: other.run(linger=True), then_stop(verifier.run, lingering)], chain):
        with running([first.run], chain):
            chain.release()  # returns once the crashed node has stopped; the chain is held
        assert [e["event"] for e in sink.logs][-1] == "stopped"
        assert chain.query("outer_step", run_id=run_id, step=0)["phase"] != "DONE"  # crashed mid-overlap
        shutil.rmtree(tmp_path / "host-1" / "store" / "global")  # models lost too: fetched from peers
        second = host(tmp_path, 1, run_id, chain, corpus, log=logs.append)
        lingering.append(second)
        with running([lambda: second.run(linger=True)], chain):
            chain.release()
    events = [(e["event"], e.get("outer_step")) for e in logs]
    assert ("resumed", 1) in events and ("trained", 1) not in events
    assert ("outer_step_applied", 0) in events  # step 0's tail, picked back up after the restart
    assert ("trained", 2) in events and not [e for e in events if e[0] == "sitting_out"]
    assert commit_count(chain, first.address) == STEPS
    for n in range(STEPS):
        step = chain.query("outer_step", run_id=run_id, step=n)
        assert step["accepted"] == sorted([first.address, other.address]), n
        assert chain.query("commitment", run_id=run_id, host=first.address, step=n)["equivocation_tx"] is None
    final = chain.run(run_id)["global_model_hash"]
    assert node_globals(tmp_path / "host-1").load(final).hash == final
    for n in (1, 2):  # steps 1 and 2 started from its own previous Δ
        start = chain.query("start_state", run_id=run_id, host=first.address, step=n)
        own = chain.query("commitment", run_id=run_id, host=first.address, step=n - 1)
        assert start["parent_delta_hash"] == own["delta_hash"], n
