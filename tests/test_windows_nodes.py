"""Sampling windows with real nodes (issue 34): H/k = 4 segments in two blocks of w = 2, v = 2
checkers, so every outer step each block is some checker's window. A lazy host (one whole block
faked) and a host faking one segment are rejected in every step by the checker whose window holds
the fake, while the checker of the other block accepts its clean window and is never slashed for
it; a colluding verifier partnered with a host that sends a made-up Δ accepts it. Only the check
of the window ending at θ_H checks Δ (specs §6: a fake Δ is a fake of the last segment, which a
host could always commit a matching θ_H for): in a step where an honest verifier holds that
window it rejects, the dispute's panel and the other holder's revote confirm, and the colluder
loses half its bond for the accept it then owes; where the colluder holds it, the fake passes,
as a fake last segment would. The honest host is accepted throughout and nobody honest is
slashed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gonka_diloco.adversaries import resolve_host, resolve_verifier
from protocol.keys import test_wallet
from protocol.prf import window
from tests.support.nodes import (
    IMPATIENT,
    IMPATIENT_VERIFIER,
    STAKE,
    LockstepChain,
    create_run,
    diagnosis,
    host_config,
    nodes,
    run_config,
    running,
    stakes,
    tiny_corpus,
    verifier_config,
)
from trainer.node import HostNode
from verifier.node import VerifierNode

HOSTS = {1: "honest", 2: "lazy", 3: "one_fake", 4: "noise"}
VERIFIERS = (11, 12, 13)  # 13 colludes with host 4
STEPS = 2


def test_windows_catch_block_fakes_and_a_colluded_fake_delta_next_to_an_honest_host(tmp_path: Path) -> None:
    corpus = tiny_corpus()
    chain = LockstepChain()
    cfg = run_config(corpus, max_outer_steps=STEPS, inner_steps=20, window_segments=2,
                     verifiers_per_contribution=2)  # fmt: skip
    assert cfg.windowed and cfg.n_segments == 4 and cfg.window_len == 2
    run_id = create_run(chain, cfg)
    logs: list[dict[str, Any]] = []
    hosts = {i: HostNode(host_config(tmp_path, i, run_id), chain, corpus=corpus, behaviour=resolve_host(name),
                         log=logs.append, patience=IMPATIENT) for i, name in HOSTS.items()}  # fmt: skip
    partner = str(test_wallet(4).address())
    assert hosts[4].address == partner
    behaviours = {11: resolve_verifier("honest"), 12: resolve_verifier("honest"),
                  13: resolve_verifier("collude", {"partner": partner})}  # fmt: skip
    verifiers = {
        i: VerifierNode(verifier_config(tmp_path, i, run_id), chain, corpus=corpus, behaviour=behaviours[i],
                        log=logs.append, patience=IMPATIENT_VERIFIER)
        for i in VERIFIERS
    }  # fmt: skip
    with running(nodes(hosts, verifiers), chain):
        pass

    addr = {i: h.address for i, h in hosts.items()}
    honest_verifiers = {verifiers[i].address for i in (11, 12)}
    colluder = verifiers[13].address
    caught = 0
    for n in range(STEPS):
        step = chain.query("outer_step", run_id=run_id, step=n)
        challenges = {c["host"]: c for c in chain.query("challenges", run_id=run_id, step=n)["challenges"]}
        fake = challenges[addr[4]]
        at_theta_h = {v for v, j in fake["slots"].items() if cfg.window_reaches_end(fake["windows"][j])}
        assert len(at_theta_h) == 1  # v = 2 slots over B = 2 blocks: the last block is always drawn
        honest_at_end = bool(at_theta_h & honest_verifiers)
        caught += honest_at_end
        fake_outcome = "rejected" if honest_at_end else "accepted"
        want = {addr[1]: "accepted", addr[2]: "rejected", addr[3]: "rejected", addr[4]: fake_outcome}
        assert step["outcomes"] == want, diagnosis(step, addr, logs)
        verdicts = chain.query("verdicts", run_id=run_id, step=n)["verdicts"]
        for i in (2, 3):  # the faked segments lie in one block; its checker rejected, the other's accepted
            faked = hosts[i].behaviour.faked(cfg, addr[i], n)  # type: ignore[attr-defined]
            c = challenges[addr[i]]
            for v in c["slots"]:
                own = set(window(c["windows"][c["slots"][v]], cfg.n_segments, cfg.window_len))
                reason = next(x["reason"] for x in verdicts if x["host"] == addr[i] and x["verifier"] == v)
                if v in honest_verifiers:
                    assert (reason != 0) == bool(own & faked), (n, i, sorted(own), sorted(faked), reason)
        # the fake Δ: an honest holder of the window ending at θ_H rejects it, one of a window short
        # of θ_H accepts its clean window; an honest panel member (Δ first) rejects it
        for x in verdicts:
            if x["host"] == addr[4] and x["verifier"] in honest_verifiers:
                checks_delta = x["verifier"] in at_theta_h or x["verifier"] not in fake["slots"]
                assert (x["reason"] != 0) == checks_delta, (n, x, at_theta_h)
    after = stakes(chain, run_id)
    assert all(after[v] == STAKE for v in honest_verifiers)  # an accept of a clean window is never slashed
    vouched = [x for n in range(STEPS) for x in chain.query("verdicts", run_id=run_id, step=n)["verdicts"]
               if x["verifier"] == colluder and x["host"] == addr[4]]  # fmt: skip
    assert vouched and all(x["reason"] == 0 for x in vouched)
    if caught:  # the colluder vouched for a Δ a dispute rejected (its accept or its revote): the fraud rate
        assert after[colluder] < STAKE and after[addr[4]] < STAKE // 2 + 1
    else:
        assert after[colluder] == STAKE and after[addr[4]] == STAKE
    assert after[addr[1]] == STAKE
