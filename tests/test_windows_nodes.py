"""Sampling windows with real nodes (issue 34): H/k = 4 segments in two blocks of w = 2, v = 2
checkers, so every outer step each block is some checker's window. A lazy host (one whole block
faked) and a host faking one segment are rejected in every step by the checker whose window holds
the fake, while the checker of the other block accepts its clean window and is never slashed for
it; a colluding verifier partnered with a host that sends a made-up Δ accepts it, but every
checker checks Δ against θ_H, so an honest one rejects, the dispute's panel confirms, and the
colluder loses half its bond wherever it vouched; the honest host is accepted throughout and
nobody honest is slashed."""

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
    for n in range(STEPS):
        step = chain.query("outer_step", run_id=run_id, step=n)
        want = {addr[1]: "accepted", addr[2]: "rejected", addr[3]: "rejected", addr[4]: "rejected"}
        assert step["outcomes"] == want, diagnosis(step, addr, logs)
        challenges = {c["host"]: c for c in chain.query("challenges", run_id=run_id, step=n)["challenges"]}
        verdicts = chain.query("verdicts", run_id=run_id, step=n)["verdicts"]
        for i in (2, 3):  # the faked segments lie in one block; its checker rejected, the other's accepted
            faked = hosts[i].behaviour.faked(cfg, addr[i], n)  # type: ignore[attr-defined]
            c = challenges[addr[i]]
            for v in c["slots"]:
                own = set(window(c["windows"][c["slots"][v]], cfg.n_segments, cfg.window_len))
                reason = next(x["reason"] for x in verdicts if x["host"] == addr[i] and x["verifier"] == v)
                if v in honest_verifiers:
                    assert (reason != 0) == bool(own & faked), (n, i, sorted(own), sorted(faked), reason)
        # the fake Δ: every honest verdict on it is a reject, whatever the window
        on_fake = [x for x in verdicts if x["host"] == addr[4] and x["verifier"] in honest_verifiers]
        assert on_fake and all(x["reason"] != 0 for x in on_fake)
    after = stakes(chain, run_id)
    assert all(after[v] == STAKE for v in honest_verifiers)  # an accept of a clean window is never slashed
    vouched = [x for n in range(STEPS) for x in chain.query("verdicts", run_id=run_id, step=n)["verdicts"]
               if x["verifier"] == colluder and x["host"] == addr[4]]  # fmt: skip
    assert vouched and all(x["reason"] == 0 for x in vouched)
    assert after[colluder] < STAKE and after[addr[4]] < STAKE // 2 + 1  # the fraud rate, both
    assert after[addr[1]] == STAKE
