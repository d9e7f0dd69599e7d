"""Real host and verifier nodes on the eager schedule (`overlap = "eager"`, specs §2.2.1).

A host starts step n from Nesterov(G_{n−1}, its own committed step n − 1 Δ) when the chain names
that Δ its parent; verifiers rebuild segment 0 from the same bits. A host that starts anywhere
else is rejected next to honest eager hosts that are accepted; a host rejected in step n − 1 has
its (honest) step n contribution dropped as `parent_not_accepted`, and its rejected Δ enters no
other host's start and no global model. The crash-and-rejoin case is
`test_overlap_nodes.test_host_crash_during_overlap_then_restart_resumes_both_steps[eager]`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from protocol.config import Overlap
from protocol.messages import Reason
from tests.test_host_node import (
    SPEC,
    LockstepChain,
    create_run,
    run_config,
    running,
    then_stop,
    tiny_corpus,
    verdicts,
    verifier_node,
)
from tests.test_overlap_nodes import counted, host
from trainer.data import eval_loss
from trainer.node import VAL_BATCHES
from trainer.spec import build_model

STEPS = 3


def eager_config(corpus: Any, **kw: Any) -> Any:
    """s = 2 of 2 segments: segment 0 is always opened, so every verification rebuilds the start."""
    kw.setdefault("max_outer_steps", STEPS)
    return run_config(corpus, overlap=Overlap.EAGER, sampled_segments=2, **kw)


def test_eager_run_rejects_a_wrong_start_and_the_loss_falls(tmp_path: Path) -> None:
    """Two honest eager hosts and `wrong_start` (forged stand-in Δ): honest in step 0 (no parent
    yet), rejected as WRONG_START once the chain names a parent; the honest hosts, whose starts
    are the rule's eager ones, accepted in every step with two steps in flight."""
    from gonka_diloco.adversaries import resolve_host

    corpus = tiny_corpus()
    chain = LockstepChain()
    cfg = eager_config(corpus)
    run_id = create_run(chain, cfg)
    verifier = counted(chain, verifier_node(tmp_path, 9, run_id, corpus))
    honest = [host(tmp_path, i, run_id, chain, corpus) for i in (1, 2)]
    cheat = host(tmp_path, 3, run_id, chain, corpus, behaviour=resolve_host("wrong_start"))
    hosts = [*honest, cheat]
    with running([lambda h=h: h.run(linger=True) for h in hosts] + [then_stop(verifier.run, hosts)], chain):
        pass
    steps = [chain.query("outer_step", run_id=run_id, step=n) for n in range(STEPS)]
    for n, step in enumerate(steps):
        assert step["phase"] == "DONE", n
        assert step["outcomes"][cheat.address] == ("accepted" if n == 0 else "rejected"), n
        assert step["accepted"] == sorted(h.address for h in (hosts if n == 0 else honest)), n
    on_cheat = {(n, r) for n, h, r in verdicts(chain, run_id, STEPS) if h == cheat.address}
    assert on_cheat == {(0, Reason.ACCEPT), (1, Reason.WRONG_START), (2, Reason.WRONG_START)}
    for n in range(1, STEPS):  # the honest starts were eager: built on their own previous Δ
        for h in honest:
            start = chain.query("start_state", run_id=run_id, host=h.address, step=n)
            own = chain.query("commitment", run_id=run_id, host=h.address, step=n - 1)
            assert start["parent_delta_hash"] == own["delta_hash"], (n, h.name)
            assert start["base_model_hash"] == steps[n]["base_model_hash"]
    for n in range(STEPS - 1):  # two steps in flight
        nxt = chain.query("commitment", run_id=run_id, host=honest[0].address, step=n + 1)
        assert nxt["height"] < steps[n]["done_height"], n
    assert steps[0]["base_model_hash"] == steps[1]["base_model_hash"] == cfg.initial_model_hash
    assert steps[2]["base_model_hash"] == steps[0]["result_hash"]
    g0 = build_model(SPEC)
    initial = eval_loss(g0, corpus.val, VAL_BATCHES, cfg.seed, batch_size=4, seq_len=cfg.seq_len)
    curve = [honest[0].snapshot()["val_loss"][str(n)] for n in range(STEPS)]
    print(f"eager: global val loss G_0 {initial:.4f} -> " + " -> ".join(f"{x:.4f}" for x in curve))
    assert initial > curve[-1] and curve[-1] < curve[0], (initial, curve)
    assert honest[1].snapshot()["val_loss"] == honest[0].snapshot()["val_loss"]


def test_a_rejected_delta_drops_its_child_and_enters_no_other_start(tmp_path: Path) -> None:
    """`sign_flip` only in step 1: rejected there; its honest step 2 contribution (trained from its
    own eager start, which the rule builds on its rejected Δ) is accepted by its verifier and then
    dropped as `parent_not_accepted`: not in the model, not paid, not slashed. Step 3 has no parent
    (its step 2 child was not eligible) and is accepted. No other host's start names its Δ."""
    from gonka_diloco.adversaries import resolve_host

    steps_n = 4
    corpus = tiny_corpus()
    chain = LockstepChain()
    run_id = create_run(chain, eager_config(corpus, max_outer_steps=steps_n))
    verifier = counted(chain, verifier_node(tmp_path, 9, run_id, corpus))
    honest = [host(tmp_path, i, run_id, chain, corpus) for i in (1, 2)]
    flip = host(tmp_path, 3, run_id, chain, corpus, behaviour=resolve_host("sign_flip", {"steps": [1]}))
    hosts = [*honest, flip]
    with running([lambda h=h: h.run(linger=True) for h in hosts] + [then_stop(verifier.run, hosts)], chain):
        pass
    steps = [chain.query("outer_step", run_id=run_id, step=n) for n in range(steps_n)]
    outcomes = [s["outcomes"][flip.address] for s in steps]
    assert outcomes == ["accepted", "rejected", "parent_not_accepted", "accepted"], outcomes
    on_flip = {(n, r) for n, h, r in verdicts(chain, run_id, steps_n) if h == flip.address}
    assert on_flip == {(0, Reason.ACCEPT), (1, Reason.DELTA_MISMATCH), (2, Reason.ACCEPT), (3, Reason.ACCEPT)}
    assert steps[2]["accepted"] == sorted(h.address for h in honest)
    rejected = chain.query("commitment", run_id=run_id, host=flip.address, step=1)["delta_hash"]
    child = chain.query("start_state", run_id=run_id, host=flip.address, step=2)
    assert child["parent_delta_hash"] == rejected  # its own start (only) was built on it
    assert chain.query("start_state", run_id=run_id, host=flip.address, step=3)["parent_delta_hash"] is None
    for n in range(steps_n):
        for h in honest:
            start = chain.query("start_state", run_id=run_id, host=h.address, step=n)
            assert start["parent_delta_hash"] != rejected
        accepted = chain.query("accepted", run_id=run_id, step=n)["accepted"]
        assert rejected not in {a["delta_hash"] for a in accepted}
    flip_snap = flip.snapshot()
    assert flip_snap["rejected"] >= 1
