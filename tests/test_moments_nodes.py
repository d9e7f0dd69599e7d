"""Int8 AdamW moments (specs §6.2.1) through real nodes: hosts train, hash, store and serve int8
training states over HTTP, a verifier fetches them into its replay and judges bitwise; the honest
host is accepted at two outer steps (the second carries its int8 optimizer state from the chain),
a noise host is rejected."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from protocol.config import Moments
from protocol.messages import Reason
from tests.support.nodes import LockstepChain, nodes, run_config, running, start, tiny_corpus, verdicts


def test_honest_int8_host_is_accepted_twice_next_to_a_rejected_noise_host(tmp_path: Path) -> None:
    corpus = tiny_corpus()
    chain = LockstepChain()
    cfg = run_config(corpus, max_outer_steps=2, inner={"lr": 1e-3, "moments": "int8"})
    assert cfg.inner.moments is Moments.INT8
    logs: list[dict[str, Any]] = []
    run_id, hosts, verifiers = start(tmp_path, chain, cfg, {1: "honest", 2: "noise"}, {9: "honest"}, logs)
    with running(nodes(hosts, verifiers), chain):
        pass
    got = verdicts(chain, run_id, 2)
    honest, noise = hosts[1].address, hosts[2].address
    assert [(n, r) for n, h, r in got if h == honest] == [(0, Reason.ACCEPT), (1, Reason.ACCEPT)], got
    assert any(h == noise for _, h, _ in got), got
    assert all(r != Reason.ACCEPT for _, h, r in got if h == noise), got
    assert chain.query("outer_step", run_id=run_id, step=1)["accepted"] == [honest]
