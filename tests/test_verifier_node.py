"""The verifier node against the in-process chain, with real host nodes serving over HTTP.

Two outer steps, five hosts (honest, free rider, garbage states, reveals-but-serves-nothing, copycat)
and three verifiers (honest, lazy, malicious) with v = 3: the honest host is accepted, every
adversary is rejected, the lazy and malicious verifiers are outvoted by stake in the disputes their
verdicts open and slashed (the lazy one at the fraud rate), the honest one is not, and it answered
the bomb and the silent host with the right reasons while judging the others, following G_n from
one outer step to the next.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from gonka_diloco.adversaries import resolve_host, resolve_verifier
from nodekit.blobs import BlobClient
from protocol.config import Sampling
from tests.support.nodes import (
    IMPATIENT,
    IMPATIENT_VERIFIER,
    QUICK_HOST,
    QUICK_VERIFIER,
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
from verifier.job import MissingData
from verifier.node import VerifierNode
from verifier.node_config import ConfigError, load_verifier_config
from verifier.source import HttpSource

HOSTS = {1: "honest", 2: "zero", 3: "malformed", 4: "no_reveal", 5: "copycat"}
HOST_PARAMS: dict[str, dict[str, Any]] = {
    "malformed": {"kind": "garbage_state"},
    "no_reveal": {"mode": "serve"},
}
VERIFIERS = {11: "honest", 12: "lazy", 13: "malicious"}
def test_adversaries_rejected_and_dishonest_verifiers_outvoted_and_slashed(tmp_path: Path) -> None:
    corpus = tiny_corpus()
    chain = LockstepChain()
    # 3 segments, 2 opened by every verifier (segment sampling): one start is neither segment 0
    # (rebuilt from G_n) nor the end of a replayed segment, so the verifier must fetch it (what the
    # withholding adversaries withhold). With windows a checker whose window starts at segment 0
    # needs nothing from the host, and honest work it fully replayed is accepted whatever the host
    # serves (tests/test_windows_nodes.py).
    cfg = run_config(
        corpus, max_outer_steps=2, verifiers_per_contribution=3, sampled_segments=2, inner_steps=15,
        sampling=Sampling.SEGMENTS,
    )
    run_id = create_run(chain, cfg)
    logs: list[dict[str, Any]] = []
    quick: dict[str, Any] = {"log": logs.append, "patience": IMPATIENT}
    hosts = {
        i: HostNode(host_config(tmp_path, i, run_id), chain, corpus=corpus,
                    behaviour=resolve_host(name, HOST_PARAMS.get(name)), **quick)
        for i, name in HOSTS.items()
    }  # fmt: skip
    verifiers = {
        i: VerifierNode(verifier_config(tmp_path, i, run_id, max_concurrent=2), chain, corpus=corpus,
                        behaviour=resolve_verifier(name), **{**quick, "patience": IMPATIENT_VERIFIER})
        for i, name in VERIFIERS.items()
    }  # fmt: skip
    with running([n.run for n in [*hosts.values(), *verifiers.values()]], chain):
        pass

    addr = {name: hosts[i].address for i, name in HOSTS.items()}
    steps = [chain.query("outer_step", run_id=run_id, step=n) for n in (0, 1)]
    bad = {addr[n]: "rejected" for n in ("zero", "malformed", "no_reveal")}
    # the copycat has nothing to copy in step 0 and works honestly; in step 1 it copies the honest Δ
    assert steps[0]["outcomes"] == {addr["honest"]: "accepted", addr["copycat"]: "accepted", **bad}
    assert steps[1]["outcomes"] == {addr["honest"]: "accepted", addr["copycat"]: "rejected", **bad}
    assert all(s["phase"] == "DONE" for s in steps)

    honest, lazy, malicious = (verifiers[i] for i in VERIFIERS)
    seen = honest.snapshot()["verdicts"]
    for n in (0, 1):
        assert seen[f"{n}:{addr['honest']}"] == "ACCEPT"  # at step 1 from G_1 and its carried optimizer
        assert seen[f"{n}:{addr['zero']}"] == "REPLAY_MISMATCH"
        assert seen[f"{n}:{addr['malformed']}"] == "MALFORMED_BLOB"  # garbage served, and it kept working
        assert seen[f"{n}:{addr['no_reveal']}"] == "MISSING_DATA"  # revealed on chain, never served
    assert seen[f"1:{addr['copycat']}"] == "REPLAY_MISMATCH"
    assert set(lazy.snapshot()["verdicts"].values()) == {"ACCEPT"}
    assert malicious.snapshot()["verdicts"][f"0:{addr['honest']}"] == "REPLAY_MISMATCH"

    stakes = {p["address"]: p["stake"] for p in chain.query("participants", run_id=run_id)["participants"]}

    def contradicted(verifier: str) -> int:  # verdicts on chain that the final outcome overturned
        count = 0
        for n, s in enumerate(steps):
            for v in chain.query("verdicts", run_id=run_id, step=n)["verdicts"]:
                outcome = s["outcomes"][v["host"]]
                count += v["verifier"] == verifier and (outcome == "accepted") != (v["reason"] == 0)
        return count

    def slashed(times: int, bps: int) -> int:  # each slash takes its fraction of what is left
        stake = STAKE
        for _ in range(times):
            stake -= stake * bps // 10_000
        return stake

    assert contradicted(honest.address) == 0 and stakes[honest.address] == STAKE
    outcomes = [o for s in steps for o in s["outcomes"].values()]
    assert contradicted(lazy.address) == outcomes.count("rejected") == 7  # accepted every bad one
    assert contradicted(malicious.address) == outcomes.count("accepted") == 3  # rejected every good one
    # every reject disputed, decided by the stake majority (honest + the other): the lazy ACCEPTs
    # were contradicted by confirmed rejections (fraud), the malicious REJECTs by confirmed accepts
    assert stakes[lazy.address] == slashed(7, cfg.stake.fraud_verifier_slash_bps)
    assert stakes[malicious.address] == slashed(3, cfg.stake.verifier_slash_bps)
    assert stakes[addr["honest"]] == STAKE and stakes[addr["zero"]] < STAKE

    # the honest verifier followed both outer steps: it computed the chain's G_1 and G_2 itself
    for n in (1, 2):
        g = steps[n - 1]["result_hash"]
        assert any(e["event"] == "outer_step_applied" and e["model_hash"] == g and e["node"] == "verifier-11"
                   for e in logs), n  # fmt: skip
        assert (tmp_path / "verifier-11" / "store" / "global" / f"{g}.model").is_file()
    text = json.dumps([e for e in logs if e.get("node", "").startswith("verifier")])
    assert "verify_error" not in text and "abstain" not in text


class FlakyChain(LockstepChain):
    """The chain's HTTP endpoint refuses a few of the verifier's calls (`assignments` is only its
    own query), as when the chain process restarts under it."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    def query(self, name: str, **params: Any) -> Any:
        if name == "assignments" and self.failures > 0:
            self.failures -= 1
            raise httpx.ConnectError("[Errno 111] Connection refused")
        return super().query(name, **params)


def test_verifier_rides_out_a_chain_outage_and_still_judges(tmp_path: Path) -> None:
    corpus = tiny_corpus()
    chain = FlakyChain(failures=0)
    cfg = run_config(corpus, max_outer_steps=1)
    run_id = create_run(chain, cfg)
    logs: list[dict[str, Any]] = []
    host = HostNode(host_config(tmp_path, 1, run_id), chain, corpus=corpus, log=logs.append,
        patience=QUICK_HOST)
    node = VerifierNode(verifier_config(tmp_path, 11, run_id), chain, corpus=corpus, log=logs.append,
                        patience=QUICK_VERIFIER, retry_backoff=0)  # fmt: skip
    chain.failures = 4
    with running([host.run, node.run], chain):
        pass
    assert chain.failures == 0 and sum(e["event"] == "interrupted" for e in logs) == 4
    assert node.snapshot()["verdicts"] == {f"0:{host.address}": "ACCEPT"}
    assert chain.query("outer_step", run_id=run_id, step=0)["accepted"] == [host.address]


def test_verifier_node_metrics_and_status_are_served(tmp_path: Path) -> None:
    node = VerifierNode(verifier_config(tmp_path, 11, 1), chain=None, log=lambda e: None)  # type: ignore[arg-type]
    node.server.start()
    try:
        with httpx.Client() as c:
            status = c.get(f"{node.server.url}/status").json()
            metrics = c.get(f"{node.server.url}/metrics").text
    finally:
        node.server.stop()
    assert status["role"] == "verifier" and status["address"] == node.address
    assert 'verifier_verdicts_total{reason="REPLAY_MISMATCH"} 0.0' in metrics
    assert "verifier_cost_fraction" in metrics and "verifier_bytes_fetched_total" in metrics


def test_unreachable_host_is_missing_data_fast() -> None:
    from nodekit.objects import ObjectPolicy
    from replay.spec import build_model

    cfg = run_config(tiny_corpus())
    objects = ObjectPolicy.of(build_model(cfg.model), cfg)
    with BlobClient([], timeout=2, retries=1, backoff=0) as client:
        source = HttpSource(client, "http://127.0.0.1:9", objects)  # discard port: refused
        with pytest.raises(MissingData, match="not served"):
            source.state("ab" * 32)
        with pytest.raises(MissingData):
            source.delta("cd" * 32)


def test_verifier_toml(tmp_path: Path) -> None:
    good = tmp_path / "verifier.toml"
    good.write_text(
        'chain_url = "http://127.0.0.1:26657"\nrun_id = 1\ndata_dir = "v0"\nbehaviour = "malicious"\n'
        "max_concurrent = 4\nmax_states_in_memory = 6\n[key]\ntest_index = 5\n"
    )
    cfg = load_verifier_config(good)
    assert cfg.data_path == tmp_path / "v0" and cfg.workers == 3 and cfg.behaviour == "malicious"
    assert load_verifier_config(good).model_copy(update={"max_states_in_memory": 4}).workers == 2
    base = 'chain_url = "http://x"\nrun_id = 1\ndata_dir = "d"\n'
    cases = {
        base + "typo = 1\n[key]\ntest_index = 1\n": "typo",
        base + "max_states_in_memory = 1\n[key]\ntest_index = 1\n": "max_states_in_memory",
        base + "[key]\ntest_index = 1\nmnemonic_file = 'm'\n": "exactly one",
        "[[[": "not valid TOML",
    }
    for body, needle in cases.items():
        bad = tmp_path / "bad.toml"
        bad.write_text(body)
        with pytest.raises(ConfigError, match=needle):
            load_verifier_config(bad)
    with pytest.raises(ConfigError, match="cannot read"):
        load_verifier_config(tmp_path / "missing.toml")


def test_a_restarted_verifier_comes_back_on_its_port(tmp_path: Path) -> None:
    """Issue 22 (chaos): a verifier listening on port 0 came back from a restart on a new port,
    while the chain kept the endpoint it joined with, so no peer could fetch the Δs and states it
    holds for the rest of the run. Like a host, it now picks a port once and keeps it."""
    first = VerifierNode(verifier_config(tmp_path, 11, 1), chain=None, log=lambda e: None)  # type: ignore[arg-type]
    port = first.server.port
    first.server.stop()  # the process is gone (killed): its socket with it
    second = VerifierNode(verifier_config(tmp_path, 11, 1), chain=None, log=lambda e: None)  # type: ignore[arg-type]
    try:
        assert second.server.port == port
    finally:
        second.server.stop()
    taken = VerifierNode(verifier_config(tmp_path, 12, 1), chain=None, log=lambda e: None)  # type: ignore[arg-type]
    logs: list[dict[str, Any]] = []
    (tmp_path / "verifier-12" / "listen.json").write_text(json.dumps({"port": taken.server.port}))
    try:  # its port taken meanwhile: any free one, said in the log (the chain still has the old one)
        again = VerifierNode(verifier_config(tmp_path, 12, 1), chain=None, log=logs.append)  # type: ignore[arg-type]
        again.server.stop()
    finally:
        taken.server.stop()
    assert again.server.port != taken.server.port and [e["event"] for e in logs] == ["port_taken"]
