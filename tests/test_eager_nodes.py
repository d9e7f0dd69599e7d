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
from replay.data import eval_loss
from replay.spec import build_model
from tests.support.nodes import (
    SPEC,
    LockstepChain,
    counted,
    create_run,
    host,
    run_config,
    running,
    then_stop,
    tiny_corpus,
    verdicts,
    verifier_node,
)
from trainer.node import VAL_BATCHES

STEPS = 4


def eager_config(corpus: Any, **kw: Any) -> Any:
    """s = 2 of 2 segments: segment 0 is always opened, so every verification rebuilds the start."""
    kw.setdefault("max_outer_steps", STEPS)
    return run_config(corpus, overlap=Overlap.EAGER, sampled_segments=2, **kw)


def test_eager_run_rejects_a_wrong_start_applies_the_parent_rule_and_learns(tmp_path: Path) -> None:
    """Two honest eager hosts, `wrong_start` (a forged stand-in Δ) and `sign_flip` in step 1 only.

    - the honest hosts start each step from the rule's eager start and are accepted in every step,
      with two steps in flight;
    - `wrong_start` is honest in step 0 (no parent yet), then rejected as WRONG_START once the
      chain names a parent (steps 1 and 2); in step 3 the rule names none (its step 2 contribution
      had a rejected parent), so there is nothing to forge and it is accepted;
    - `sign_flip` is rejected in step 1; its honest step 2 contribution (trained from its own eager
      start, which the rule builds on the rejected Δ) is accepted by its verifier and then dropped as
      `parent_not_accepted`; its step 3 has no parent (the step 2 one was not eligible) and is
      accepted. The rejected Δ is in no other host's start and no accepted set;
    - the global validation loss falls."""
    from gonka_diloco.adversaries import resolve_host

    corpus = tiny_corpus()
    chain = LockstepChain()
    cfg = eager_config(corpus)
    run_id = create_run(chain, cfg)
    verifier = counted(chain, verifier_node(tmp_path, 9, run_id, corpus))
    logs: list[dict[str, Any]] = []
    honest = [host(tmp_path, i, run_id, chain, corpus, log=logs.append) for i in (1, 2)]
    cheat = host(tmp_path, 3, run_id, chain, corpus, behaviour=resolve_host("wrong_start"))
    flip = host(tmp_path, 4, run_id, chain, corpus, behaviour=resolve_host("sign_flip", {"steps": [1]}))
    hosts = [*honest, cheat, flip]
    with running([lambda h=h: h.run(linger=True) for h in hosts] + [then_stop(verifier.run, hosts)], chain):
        pass
    steps = [chain.query("outer_step", run_id=run_id, step=n) for n in range(STEPS)]
    on = {h.address: {(n, r) for n, a, r in verdicts(chain, run_id, STEPS) if a == h.address} for h in hosts}
    # step 3: its step 2 child of a rejected parent is not eligible, so the rule names no parent and
    # its forgery has nothing to forge: it starts from G_2 like everyone without one, and passes
    assert on[cheat.address] == {
        (0, Reason.ACCEPT),
        (1, Reason.WRONG_START),
        (2, Reason.WRONG_START),
        (3, Reason.ACCEPT),
    }
    assert on[flip.address] == {
        (0, Reason.ACCEPT),
        (1, Reason.DELTA_MISMATCH),
        (2, Reason.ACCEPT),
        (3, Reason.ACCEPT),
    }
    outcomes = [s["outcomes"][flip.address] for s in steps]
    assert outcomes == ["accepted", "rejected", "parent_not_accepted", "accepted"], outcomes
    want = [hosts, honest, honest, hosts]
    for n, step in enumerate(steps):
        assert step["phase"] == "DONE", n
        assert step["accepted"] == sorted(h.address for h in want[n]), n
        assert step["outcomes"][cheat.address] == ("rejected" if n in (1, 2) else "accepted"), n
    # the honest starts were eager: built on their own previous Δ, on the step's base
    for n in range(1, STEPS):
        for h in honest:
            start = chain.query("start_state", run_id=run_id, host=h.address, step=n)
            own = chain.query("commitment", run_id=run_id, host=h.address, step=n - 1)
            assert start["parent_delta_hash"] == own["delta_hash"], (n, h.name)
            assert start["base_model_hash"] == steps[n]["base_model_hash"]
    # the rejected Δ: the parent of its own host's step 2 only, in no accepted set
    rejected = chain.query("commitment", run_id=run_id, host=flip.address, step=1)["delta_hash"]
    assert (
        chain.query("start_state", run_id=run_id, host=flip.address, step=2)["parent_delta_hash"] == rejected
    )
    assert chain.query("start_state", run_id=run_id, host=flip.address, step=3)["parent_delta_hash"] is None
    for n in range(STEPS):
        for h in [*honest, cheat]:
            assert (
                chain.query("start_state", run_id=run_id, host=h.address, step=n)["parent_delta_hash"]
                != rejected
            )
        accepted = chain.query("accepted", run_id=run_id, step=n)["accepted"]
        assert rejected not in {a["delta_hash"] for a in accepted}
    # each honest host trained each step once and committed what it trained; step 1 before it
    # opened (its start is fixed once the host's step 0 commit is in: no step before step 0 has to
    # close), the later ones when their start was fixed before the step opened
    for h in honest:
        mine = [e for e in logs if e["event"] == "trained" and e["node"] == h.name]
        trained = {e["outer_step"]: e["ahead"] for e in mine}
        assert sorted(trained) == list(range(STEPS)) and trained[1] and not trained[0], (h.name, trained)
    assert len([e for e in logs if e["event"] == "trained"]) == len(honest) * STEPS
    assert not [e for e in logs if e["event"] == "trained_from_another_start"]
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


def test_a_step_trained_ahead_from_a_start_the_chain_does_not_name_is_trained_again(tmp_path: Path) -> None:
    """A host trains step 1 before it opens (`next_start_state`), but its record names another
    start than the chain's `start_state` at the open (here: rewritten on disk, as if the chain had
    answered otherwise): the record is not committed, the step is trained again from the chain's
    start, and that contribution is accepted next to the other host's trained-ahead one."""
    import json

    corpus = tiny_corpus()
    chain = LockstepChain()
    run_id = create_run(chain, eager_config(corpus, max_outer_steps=2))
    verifier = counted(chain, verifier_node(tmp_path, 9, run_id, corpus))
    logs: list[dict[str, Any]] = []
    a, b = (host(tmp_path, i, run_id, chain, corpus, log=logs.append) for i in (1, 2))
    trained_ahead = a.train.train_ahead

    def ahead_from_another_start(n: int) -> None:
        trained_ahead(n)
        path = a.records.path(n)
        if path.exists():
            record = json.loads(path.read_bytes())
            record["start"][1] = "0" * 64  # another parent Δ than the one the chain will name
            path.write_text(json.dumps(record))

    a.train.train_ahead = ahead_from_another_start  # type: ignore[method-assign]
    with running([lambda h=h: h.run(linger=True) for h in (a, b)] + [then_stop(verifier.run, [a, b])], chain):
        pass
    trained = sorted((e["node"], e["outer_step"], e["ahead"]) for e in logs if e["event"] == "trained")
    assert trained == [(a.name, 0, False), (a.name, 1, False), (a.name, 1, True),
                       (b.name, 0, False), (b.name, 1, True)], trained  # fmt: skip
    assert [e["outer_step"] for e in logs if e["event"] == "trained_from_another_start"] == [1]
    step = chain.query("outer_step", run_id=run_id, step=1)
    assert step["accepted"] == sorted([a.address, b.address]), step["outcomes"]
