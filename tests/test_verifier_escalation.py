"""Escalation with real nodes: the verifier drawn first is offline, the next round's verifier judges.

One honest host, two verifiers, v = 1, `max_escalations = 1`. Which verifier round 0 draws comes
from a block hash, so both run the same switch: at the moment the node asks `online()` (after the
challenge, when round 0 is already on chain) a verifier that the chain drew in round 0 becomes
the library's `offline` behaviour, the other stays honest. The missing verdict escalates the
contribution to the other verifier (rounds are disjoint, `protocol.prf.assign_verifiers`), which
replays it and accepts; the Δ reaches G_1 and nobody is slashed.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from gonka_diloco.adversaries import resolve_verifier
from gonka_diloco.adversaries.verifiers import OfflineVerifier
from tests.support.nodes import (
    IMPATIENT,
    IMPATIENT_VERIFIER,
    STAKE,
    LockstepChain,
    create_run,
    host_config,
    run_config,
    running,
    tiny_corpus,
    verifier_config,
)
from trainer.node import HostNode
from verifier.behaviour import VerifierBehaviour
from verifier.job import Job, Judgement
from verifier.node import VerifierNode


class OfflineIfDrawnFirst(VerifierBehaviour):
    """Delegates to `offline` if the chain drew this verifier in round 0 of step 0, else to `honest`.
    Decided once, on the first `online()` call (the node makes it after the challenge is derived)."""

    def __init__(self, chain: LockstepChain, run_id: int) -> None:
        self.chain, self.run_id = chain, run_id
        self.address = ""  # set once the node (and so its wallet) exists
        self.delegate: VerifierBehaviour | None = None

    def _pick(self) -> VerifierBehaviour:
        if self.delegate is None:
            challenges = self.chain.query("challenges", run_id=self.run_id, step=0)["challenges"]
            assert challenges, "online() asked before the challenge"
            first = any(c["verifier_rounds"].get(self.address) == 0 for c in challenges)
            self.delegate = resolve_verifier("offline" if first else "honest")
        return self.delegate

    def online(self) -> bool:
        return self._pick().online()

    def decide(self, job: Job, check: Callable[[], Judgement]) -> Judgement | None:
        return self._pick().decide(job, check)


def test_missing_verdict_escalates_to_the_next_verifier_who_accepts(tmp_path: Path) -> None:
    corpus = tiny_corpus()
    chain = LockstepChain()
    cfg = run_config(corpus, max_outer_steps=1, verifiers_per_contribution=1)
    cfg = cfg.model_copy(update={"phases": cfg.phases.model_copy(update={"max_escalations": 1})})
    run_id = create_run(chain, cfg)
    logs: list[dict[str, Any]] = []
    quick: dict[str, Any] = {"log": logs.append, "patience": IMPATIENT}
    host = HostNode(host_config(tmp_path, 1, run_id), chain, corpus=corpus, **quick)
    behaviours = {i: OfflineIfDrawnFirst(chain, run_id) for i in (11, 12)}
    verifiers = {
        i: VerifierNode(verifier_config(tmp_path, i, run_id), chain, corpus=corpus, behaviour=b,
                        **{**quick, "patience": IMPATIENT_VERIFIER})
        for i, b in behaviours.items()
    }  # fmt: skip
    for i, node in verifiers.items():
        behaviours[i].address = node.address
    with running([host.run, *(n.run for n in verifiers.values())], chain):
        pass

    # exactly one verifier was drawn first and went offline; the other judged honestly
    kinds = {i: type(b.delegate) for i, b in behaviours.items()}
    assert sorted(k.__name__ for k in kinds.values()) == ["OfflineVerifier", "VerifierBehaviour"], kinds
    (off,) = [i for i, k in kinds.items() if k is OfflineVerifier]
    (on,) = [i for i, k in kinds.items() if k is VerifierBehaviour]
    offline, judge = verifiers[off], verifiers[on]

    # the chain drew the offline verifier in round 0 and, after its silence, the other in round 1
    (challenge,) = chain.query("challenges", run_id=run_id, step=0)["challenges"]
    assert challenge["host"] == host.address
    assert challenge["verifiers"] == [offline.address, judge.address]
    assert challenge["verifier_rounds"] == {offline.address: 0, judge.address: 1}
    (verdict,) = chain.query("verdicts", run_id=run_id, step=0)["verdicts"]
    assert verdict["verifier"] == judge.address and verdict["reason"] == 0 and verdict["round"] == 1
    assert offline.snapshot()["verdicts"] == {} and offline.snapshot()["submitted"] == 0
    assert judge.snapshot()["verdicts"] == {f"0:{host.address}": "ACCEPT"}

    # one escalation round, then accepted (final round, a = 1, r = 0: chain/module.py _initial_review)
    step = chain.query("outer_step", run_id=run_id, step=0)
    assert step["round"] == 1 and step["phase"] == "DONE"
    assert step["outcomes"] == {host.address: "accepted"} and step["accepted"] == [host.address]

    # the honest Δ reached the global model: the host reported the hash the chain adopted
    g1 = chain.run(run_id)["global_model_hash"]
    assert g1 == step["result_hash"] != cfg.initial_model_hash
    assert step["result_votes"][host.address] == g1
    applied = [e["model_hash"] for e in logs if e["event"] == "outer_step_applied" and e["node"] == host.name]
    assert applied == [g1]
    assert host.snapshot()["accepted"] == 1

    # specs/protocol.md §2.6.1 / chain/module.py _finalize_step: only a verdict that contradicts the
    # outcome is slashed; a missing verdict is no verdict, so the offline verifier keeps its bond
    # (it only earns nothing — rewards go to accepted hosts alone)
    stakes = {p["address"]: p["stake"] for p in chain.query("participants", run_id=run_id)["participants"]}
    assert stakes == {host.address: STAKE, offline.address: STAKE, judge.address: STAKE}
