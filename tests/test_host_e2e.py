"""End to end in one process: 3 honest hosts, 2 verifiers, 3 outer steps on the in-process chain.

The global validation loss must fall, every host must hold the bitwise-same G_n the chain
recorded, and every contribution must have been accepted by a verifier that replayed it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx

from nodekit.globalmodel import GlobalModel
from nodekit.store import ContentStore
from protocol.config import ReplayMode
from protocol.prf import windows_opened
from replay.data import eval_loss
from replay.spec import build_model
from tests.support.nodes import (
    QUICK_HOST,
    SPEC,
    LockstepChain,
    create_run,
    host_config,
    node_globals,
    run_config,
    running,
    then_stop,
    tiny_corpus,
    verdicts,
    verifier_node,
)
from trainer.node import VAL_BATCHES, HostNode

STEPS = 3


def test_three_honest_hosts_three_outer_steps_loss_falls(tmp_path: Path) -> None:
    corpus = tiny_corpus()
    chain = LockstepChain()
    cfg = run_config(corpus, max_outer_steps=STEPS)
    run_id = create_run(chain, cfg)
    verifiers = [verifier_node(tmp_path, 20 + i, run_id, corpus) for i in range(2)]
    logs: list[dict[str, Any]] = []
    hosts = [
        HostNode(host_config(tmp_path, i, run_id), chain, corpus=corpus, log=logs.append, patience=QUICK_HOST)
        for i in range(1, 4)
    ]
    statuses: list[dict[str, Any]] = []
    with running(
        [lambda h=h: h.run(linger=True) for h in hosts] + [then_stop(v.run, hosts) for v in verifiers], chain
    ):
        pass
    # every host verified by replay, all accepted, every step
    assert verdicts(chain, run_id, STEPS) == sorted((n, h.address, 0) for n in range(STEPS) for h in hosts)
    for n in range(STEPS):
        step = chain.query("outer_step", run_id=run_id, step=n)
        assert step["accepted"] == sorted(h.address for h in hosts)
        assert step["phase"] == "DONE"
    # the recorded G_3 is bitwise the same on every host's disk
    final = chain.run(run_id)["global_model_hash"]
    for h in hosts:
        assert node_globals(h.dir).load(final).hash == final
        statuses.append(h.snapshot())
    # the global validation loss falls, and every host computed the same figure
    model = build_model(SPEC)  # G_0
    initial = eval_loss(model, corpus.val, VAL_BATCHES, cfg.seed, batch_size=4, seq_len=cfg.seq_len)
    curves = [[s["val_loss"][str(n)] for n in range(STEPS)] for s in statuses]
    assert curves[0] == curves[1] == curves[2]
    curve = curves[0]
    print(f"global val loss: G_0 {initial:.4f} -> " + " -> ".join(f"{x:.4f}" for x in curve))
    assert initial > curve[0] > curve[1] > curve[2], (initial, curve)
    assert all(s["accepted"] == STEPS and s["rejected"] == 0 and s["commits"] == STEPS for s in statuses)
    assert not [e for e in logs if e["event"] in ("sitting_out", "delta_unavailable", "fetching_global")]


def test_only_revealed_blobs_are_served_and_status_metrics_answer(tmp_path: Path) -> None:
    """One host, one step, looked at over HTTP at each point: nothing of its trajectory is served
    after the commit, exactly the opened states and the Δ after the reveal, no states once
    finalized; /status and /metrics answer from the same server."""
    corpus = tiny_corpus()
    chain = LockstepChain()
    cfg = run_config(corpus, inner_steps=20, segment_len=5, sampled_segments=2, max_outer_steps=1)
    run_id = create_run(chain, cfg)
    verifier = verifier_node(tmp_path, 9, run_id, corpus)
    seen: dict[str, Any] = {}
    node: HostNode

    def codes(http: httpx.Client) -> dict[str, int]:
        record = json.loads((node.dir / "commits" / "0.json").read_bytes())
        out = {
            f"state{i}": http.get(f"/blobs/state/{leaf}").status_code
            for i, leaf in enumerate(record["leaves"])
        }
        out["delta"] = http.get(f"/blobs/delta/{record['delta_hash']}").status_code
        return out

    def log(event: dict[str, Any]) -> None:
        if event["event"] in ("committed", "revealed", "outer_step_applied", "lingering"):
            with httpx.Client(base_url=node.server.url, timeout=5) as http:
                seen[event["event"]] = codes(http)
                if event["event"] == "outer_step_applied":
                    seen["model"] = http.get(f"/blobs/model/{event['model_hash']}").status_code
                if event["event"] == "revealed":
                    seen["segments"] = event["segments"]
                    seen["status"] = http.get("/status").json()
                    seen["metrics"] = http.get("/metrics").text

    node = HostNode(host_config(tmp_path, 1, run_id), chain, corpus=corpus, log=log, patience=QUICK_HOST)
    with running([lambda: node.run(linger=True), then_stop(verifier.run, [node])], chain):
        pass
    assert set(seen["committed"].values()) == {404}
    # bitwise mode, sampling windows: each window's start but segment 0's (rebuilt from G_n) and
    # θ_H (the last boundary: checkers whose window ends short of it fetch its parameters); a
    # window's other boundaries are replayed
    assert cfg.replay_mode is ReplayMode.BITWISE and cfg.windowed
    (challenge,) = chain.query("challenges", run_id=run_id, step=0)["challenges"]
    n = cfg.n_segments
    assert seen["segments"] == windows_opened(challenge["windows"], n, cfg.window_len)
    opened = {f"state{s}" for s in challenge["windows"] if s > 0} | {f"state{n}"}
    assert {k for k, c in seen["revealed"].items() if c == 200} == opened | {"delta"}
    assert {k for k, c in seen["lingering"].items() if c == 200} == {"delta"}  # finalized: states pruned
    assert seen["model"] == 200  # G_1, by its hash, as soon as it is computed
    status = seen["status"]
    assert status["role"] == "host" and status["address"] == node.address and status["phase"] == "REVEALED"
    assert status["outer_step"] == 0 and status["commits"] == 1 and status["loss"] > 0
    metrics = seen["metrics"]
    assert "gonka_host_inner_steps_total 20.0" in metrics
    assert 'gonka_host_phase{gonka_host_phase="REVEALED"} 1.0' in metrics
    assert "gonka_host_commits_total 1.0" in metrics


def test_rejected_delta_never_reaches_the_global_model(tmp_path: Path) -> None:
    """Two honest hosts and a sign-flipping one: G_1 is exactly the outer step over the two
    accepted Δs (recomputed here from their committed payloads), not over all three."""
    from gonka_diloco.adversaries import resolve_host
    from protocol.codecs import decode

    corpus = tiny_corpus()
    chain = LockstepChain()
    cfg = run_config(corpus, max_outer_steps=1)
    run_id = create_run(chain, cfg)
    verifier = verifier_node(tmp_path, 9, run_id, corpus)
    honest = [
        HostNode(host_config(tmp_path, i, run_id), chain, corpus=corpus, log=lambda e: None,
            patience=QUICK_HOST)
        for i in (1, 2)
    ]
    cheat = HostNode(
        host_config(tmp_path, 3, run_id),
        chain,
        corpus=corpus,
        behaviour=resolve_host("sign_flip"),
        log=lambda e: None,
        patience=QUICK_HOST,
    )
    hosts = [*honest, cheat]
    with running([lambda h=h: h.run(linger=True) for h in hosts] + [then_stop(verifier.run, hosts)], chain):
        pass
    step = chain.query("outer_step", run_id=run_id, step=0)
    assert step["outcomes"][cheat.address] == "rejected"
    assert step["accepted"] == sorted(h.address for h in honest)
    g0 = GlobalModel.from_module(build_model(SPEC))

    def delta_of(node: HostNode) -> tuple[str, int, dict]:
        record = json.loads((node.dir / "commits" / "0.json").read_bytes())
        payload = ContentStore(node.dir / "store").read_bytes("delta", record["delta_hash"])
        return node.address, cfg.tokens_per_outer_step, decode(payload, g0.layout)

    only_accepted = g0.apply([delta_of(h) for h in honest], cfg.outer)
    with_cheat = g0.apply([delta_of(h) for h in hosts], cfg.outer)
    assert step["result_hash"] == only_accepted.hash != with_cheat.hash
    for node in hosts:  # the cheat computes the same G_1 too: it follows the chain like anyone
        assert node_globals(node.dir).load(only_accepted.hash).hash == only_accepted.hash
    assert cheat.snapshot()["rejected"] == 1
