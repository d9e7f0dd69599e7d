"""Issue 10's attackers against real nodes (in-process chain, hosts serving over HTTP): the node
code runs the new adversaries unchanged, and the chain's audits and disputes do the rest.

One outer step in tolerance mode, v = 1, every accepted contribution audited by one more
verifier. Hosts: honest, `noise` (a fake Δ) and `moment_steer` (params exact, moments rewritten).
Verifiers: two honest and one `collude` partnered with the noise host. Whoever is drawn first,
the fake meets an honest REJECT (initial or audit), the dispute is decided by verifier stake, and
the colluder's ACCEPT costs it and its partner half their bonds; the moment steerer is rejected by
the whole-state comparison; the honest host alone reaches G_1 and nobody honest is slashed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gonka_diloco.adversaries import resolve_host, resolve_verifier
from protocol.config import Phases, ReplayMode
from protocol.keys import test_wallet
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
from verifier.node import VerifierNode

HOSTS = {1: "honest", 2: "noise", 3: "moment_steer"}
VERIFIERS = (11, 12, 13)  # 13 colludes with host 2


def test_colluding_verifier_and_moment_steerer_fail_next_to_an_honest_host(tmp_path: Path) -> None:
    corpus = tiny_corpus()
    chain = LockstepChain()
    phases = Phases(join_blocks=3, train_blocks=3, reveal_blocks=3, verify_blocks=3, escalation_blocks=2,
                    audit_blocks=3, confirm_blocks=3, result_blocks=3, epoch_length=1000)  # fmt: skip
    cfg = run_config(
        corpus, max_outer_steps=1, verifiers_per_contribution=1, audit_bps=10_000, audit_verifiers=1,
        phases=phases, replay_mode=ReplayMode.TOLERANCE, tolerance=1e-3, tolerance_exp_avg=1e-3,
        tolerance_exp_avg_sq=1e-3,
    )  # fmt: skip
    run_id = create_run(chain, cfg)
    quick: dict[str, Any] = {"log": lambda e: None, "patience": IMPATIENT}
    hosts = {i: HostNode(host_config(tmp_path, i, run_id), chain, corpus=corpus, behaviour=resolve_host(name),
                         **quick) for i, name in HOSTS.items()}  # fmt: skip
    partner = str(test_wallet(2).address())
    assert hosts[2].address == partner
    behaviours = {11: resolve_verifier("honest"), 12: resolve_verifier("honest"),
                  13: resolve_verifier("collude", {"partner": partner})}  # fmt: skip
    verifiers = {
        i: VerifierNode(verifier_config(tmp_path, i, run_id), chain, corpus=corpus, behaviour=behaviours[i],
                        **{**quick, "patience": IMPATIENT_VERIFIER})
        for i in VERIFIERS
    }  # fmt: skip
    with running([n.run for n in [*hosts.values(), *verifiers.values()]], chain):
        pass

    addr = {name: hosts[i].address for i, name in HOSTS.items()}
    step = chain.query("outer_step", run_id=run_id, step=0)
    assert step["phase"] == "DONE" and step["accepted"] == [addr["honest"]]
    assert step["outcomes"] == {addr["honest"]: "accepted", addr["noise"]: "rejected",
                                addr["moment_steer"]: "rejected"}  # fmt: skip
    assert step["reviews"][addr["noise"]] == "confirm"  # disputed: decided by verifier stake
    assert step["result_hash"] == chain.run(run_id)["global_model_hash"] != cfg.initial_model_hash

    stakes = {p["address"]: p["stake"] for p in chain.query("participants", run_id=run_id)["participants"]}
    colluder = verifiers[13].address
    fraud = cfg.stake.fraud_verifier_slash_bps
    assert stakes[colluder] == STAKE - STAKE * fraud // 10_000  # its ACCEPT of the fake, contradicted
    assert stakes[addr["noise"]] == 1000 - 1000 * cfg.stake.fraud_host_slash_bps // 10_000
    assert stakes[addr["moment_steer"]] == 1000 - 1000 * cfg.stake.host_slash_bps // 10_000
    assert stakes[addr["honest"]] == 1000
    assert all(stakes[verifiers[i].address] == STAKE for i in (11, 12))
    steer_verdicts = [v for v in chain.query("verdicts", run_id=run_id, step=0)["verdicts"]
                      if v["host"] == addr["moment_steer"]]  # fmt: skip
    assert steer_verdicts and all(v["reason"] == 3 for v in steer_verdicts)  # REPLAY_MISMATCH
    assert "exp_avg distance" in " ".join(v["detail"] for v in steer_verdicts)
