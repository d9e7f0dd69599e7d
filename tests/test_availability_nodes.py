"""Issue 10's availability attackers against real nodes (in-process chain, nodes serving over HTTP).

`withhold` (serves its verifiers, then refuses its Δ), `forge_result` (withholds and votes for a
G_{n+1} it made up) and `silent_after_accept` (serves, votes and commits nothing once accepted),
each next to honest hosts, one outer step each, v = 1, bitwise mode:

1. Honest verifiers keep and serve the Δs they derived, so the honest hosts fetch the withheld Δs
   from them: the attacks hurt nobody (the forged vote is a minority, the honest majority's
   G_{n+1} is adopted in round 0, nobody is dropped or slashed). The same run has every holder of
   an honest host's Δ drop out for the first two blocks of the result phase: the other hosts retry
   every block, report it once half the round has passed, fetch it when it is back and vote,
   which withdraws their reports; it is neither dropped nor slashed.
2. Lazy verifiers accept without fetching anything, so nobody but its author holds a Δ: the
   honest hosts report the withheld Δs, a majority's reports drop and slash them round by round
   (the withholder, which can fetch the honest Δs, reports the other two first), and the honest
   hosts re-vote in every round until their G_{n+1} over the reduced set is adopted.
3. Two hosts, one silent after acceptance: the honest vote is half the weight, never a majority,
   and nobody can report a Δ the verifier serves, so the step closes with G_{n+1} = G_n after its
   result rounds, the honest host adopts G_n and the next step (without the silent one) moves on.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from chain.inprocess import InProcessChain
from nodekit.blobs import BlobCatalog, Served
from tests.support.nodes import (
    IMPATIENT,
    STAKE,
    LockstepChain,
    diagnosis,
    nodes,
    run_config,
    running,
    stakes,
    start,
    tiny_corpus,
)


def events(chain: InProcessChain, kind: str) -> list[dict[str, str]]:
    return [dict(e.attributes) for b in chain.blocks for e in b.all_events() if e.type == kind]


def outage(catalog: BlobCatalog, down: Any) -> None:
    """Make a node's server answer 404 for an object while `down(kind, hash)` holds."""
    lookup = catalog.lookup

    def maybe(kind: str, blob_hash: str) -> Served | None:
        return None if down(kind, blob_hash) else lookup(kind, blob_hash)

    catalog.lookup = maybe  # type: ignore[method-assign]


def test_withheld_deltas_come_from_verifiers_the_forged_vote_loses_and_an_outage_is_ridden_out(
    tmp_path: Path,
) -> None:
    chain = LockstepChain()
    cfg = run_config(tiny_corpus(), max_outer_steps=1)
    names = {1: "honest", 2: "honest", 3: "honest", 4: "honest", 5: "withhold", 6: "forge_result",
             7: "silent_after_accept"}  # fmt: skip
    logs: list[dict[str, Any]] = []
    run_id, hosts, verifiers = start(tmp_path, chain, cfg, names, {11: "honest", 12: "honest"}, logs)
    addr = {i: n.address for i, n in hosts.items()}
    flaky = addr[3]  # every holder of its Δ is down for the first two blocks of the result phase

    def down(kind: str, blob_hash: str) -> bool:
        step = chain.query("outer_step", run_id=run_id, step=0)
        mine = chain.query("commitment", run_id=run_id, host=flaky, step=0)
        if kind != "delta" or mine is None or blob_hash != mine["delta_hash"]:
            return False
        return step["finalized_height"] is None or chain.height() < step["finalized_height"] + 2

    for node in [*hosts.values(), *verifiers.values()]:
        outage(node.catalog, down)
    with running(nodes(hosts, verifiers), chain):
        pass

    step = chain.query("outer_step", run_id=run_id, step=0)
    assert step["phase"] == "DONE" and step["result_round"] == 0 and step["dropped"] == []
    assert set(step["outcomes"].values()) == {"accepted"}, diagnosis(step, addr, logs)  # honest work
    g = step["result_hash"]
    assert g == chain.run(run_id)["global_model_hash"] != cfg.initial_model_hash
    assert step["result_votes"][addr[6]] != g  # the forged vote: a minority, never adopted
    assert addr[7] not in step["result_votes"]  # silent
    # adopted on the 4th honest vote of 7 (the flaky host's own came first): a later one in the
    # same block finds the step closed; every node computed and adopted the same G_1
    honest_votes = {h: v for h, v in step["result_votes"].items() if h != addr[6]}
    assert len(honest_votes) == 4 and set(honest_votes.values()) == {g} and addr[3] in honest_votes
    applied = {e["node"]: e["model_hash"] for e in logs if e["event"] == "outer_step_applied"}
    assert set(applied) == {*(f"host-{i}" for i in hosts), "verifier-11", "verifier-12"}
    assert set(applied.values()) == {g}

    # the flaky Δ was reported by a majority of the weight (4 of 7) after half the round ...
    reports = [e for e in events(chain, "report_unavailable") if e["hosts"] == flaky]
    assert {e["reporter"] for e in reports} == {addr[i] for i in (1, 2, 4, 5)}
    # ... and the reports were withdrawn by the reporters' votes once it was back: nobody slashed
    assert events(chain, "withheld") == []
    assert all(s == STAKE for s in stakes(chain, run_id).values())
    rewards = {e["host"]: int(e["amount"]) for e in events(chain, "reward")}
    assert set(rewards) == set(addr.values()) and min(rewards.values()) > 0

    # the withheld Δs came from the verifiers that derived them (and from peers that had fetched
    # them), never from their authors
    urls = {i: n.url for i, n in hosts.items()}
    verifier_urls = {v.url for v in verifiers.values()}
    for i in (5, 6, 7):
        got = [
            e for e in logs if e["event"] == "fetched" and e.get("host") == addr[i] and e["kind"] == "delta"
        ]
        fetchers = sorted(e["node"] for e in got if e["node"].startswith("host-"))  # verifiers log theirs too
        assert fetchers == [f"host-{j}" for j in hosts if j != i], (i, fetchers)
        assert all(urls[i] not in e["chunks_from"] for e in got), (i, got)
        assert any(set(e["chunks_from"]) <= verifier_urls for e in got), i


def test_withholders_nobody_else_serves_are_dropped_and_slashed_round_by_round(tmp_path: Path) -> None:
    chain = LockstepChain()
    cfg = run_config(tiny_corpus(), max_outer_steps=1)
    names = {1: "honest", 2: "honest", 3: "withhold", 4: "forge_result", 5: "silent_after_accept"}
    logs: list[dict[str, Any]] = []
    run_id, hosts, verifiers = start(tmp_path, chain, cfg, names, {11: "lazy", 12: "lazy"}, logs)
    with running(nodes(hosts, verifiers), chain):
        pass

    addr = {i: n.address for i, n in hosts.items()}
    step = chain.query("outer_step", run_id=run_id, step=0)
    honest, bad = [addr[1], addr[2]], [addr[3], addr[4], addr[5]]
    assert step["phase"] == "DONE" and step["accepted"] == sorted(honest)
    assert step["outcomes"] == {**dict.fromkeys(honest, "accepted"), **dict.fromkeys(bad, "withheld")}
    # round 0 drops the forger and the silent host (reported by both honest hosts and the
    # withholder, 3 of 5), round 1 the withholder (2 of 3), round 2 adopts the honest result
    dropped = [(e["host"], int(e["amount"]) > 0) for e in events(chain, "withheld")]
    assert dropped == [(h, True) for h in sorted([addr[4], addr[5]])] + [(addr[3], True)]
    assert step["result_round"] == 2
    rounds = [int(e["round"]) for e in events(chain, "result_round")]
    assert rounds == [1, 2]
    g = step["result_hash"]
    assert g == chain.run(run_id)["global_model_hash"] != cfg.initial_model_hash
    assert step["result_votes"] == dict.fromkeys(honest, g)  # re-voted in the last round
    forged = {e["model_hash"] for e in logs if e["event"] == "result" and e["node"] == "host-4"}
    assert forged and g not in forged  # it voted a made-up model in every round it was in: never adopted
    votes = [e for e in logs if e["event"] == "result" and e["node"] in ("host-1", "host-2")]
    assert [e["round"] for e in votes] == [2, 2]  # no vote while a Δ of the round was missing

    s = stakes(chain, run_id)
    assert all(s[h] == 1000 for h in honest)
    assert all(s[h] == 1000 - 1000 * cfg.stake.host_slash_bps // 10_000 for h in bad)
    rewards = {e["host"] for e in events(chain, "reward")}
    assert rewards == set(honest)  # only the Δs in the adopted model are paid
    # every node followed the same G_1: the verifiers computed it over the reduced set themselves
    applied = {e["node"]: e["model_hash"] for e in logs if e["event"] == "outer_step_applied"}
    assert applied["host-1"] == applied["host-2"] == applied["verifier-11"] == g


def test_a_silent_half_closes_the_step_with_g_n_and_the_next_step_moves_on(tmp_path: Path) -> None:
    chain = LockstepChain()
    cfg = run_config(tiny_corpus(), max_outer_steps=2)
    logs: list[dict[str, Any]] = []
    run_id, hosts, verifiers = start(tmp_path, chain, cfg, {1: "honest", 2: "silent_after_accept"},
                                     {11: "honest"}, logs)  # fmt: skip
    with running(nodes(hosts, verifiers), chain):
        pass

    steps = [chain.query("outer_step", run_id=run_id, step=n) for n in (0, 1)]
    g0 = cfg.initial_model_hash
    assert steps[0]["result_hash"] == g0 and steps[0]["result_round"] == cfg.phases.result_rounds - 1
    assert steps[0]["dropped"] == []  # its Δ was served by the verifier: nobody could report it
    assert steps[1]["base_model_hash"] == g0 and steps[1]["committed"] == [hosts[1].address]
    assert steps[1]["result_hash"] not in (None, g0)
    assert events(chain, "reward") and {e["outer_step"] for e in events(chain, "reward")} == {"1"}
    unchanged = [e for e in logs if e["event"] == "outer_step_unchanged" and e["node"] == "host-1"]
    assert [e["outer_step"] for e in unchanged] == [0]
    votes = [
        e["round"] for e in logs if e["event"] == "result" and e["node"] == "host-1" and e["outer_step"] == 0
    ]
    assert votes == list(range(cfg.phases.result_rounds))  # a vote in every round


@pytest.mark.parametrize("verifiers", ["honest", "lazy"])
def test_a_trickling_author_cannot_stall_the_step(tmp_path: Path, verifiers: str) -> None:
    """Issue 23: an accepted host that serves its own Δ at a byte a second. The fetch drops it at
    the rate floor (a 2 s grace here, 30 s by default) instead of waiting for every byte, so the
    honest hosts vote on time: with honest verifiers, which serve the Δ they derived, the Δ comes
    from them and everyone is in the new model; with lazy ones nobody else holds it, so it is
    reported like a withheld Δ, dropped and slashed, and the honest majority's model is adopted."""
    chain = LockstepChain()
    cfg = run_config(tiny_corpus(), max_outer_steps=1)
    names = {1: "honest", 2: "honest", 3: "honest", 4: "trickle"}
    logs: list[dict[str, Any]] = []
    run_id, hosts, vs = start(
        tmp_path, chain, cfg, names, {11: verifiers, 12: verifiers}, logs,
        {"patience": replace(IMPATIENT, blob_timeout=2.0)},
    )
    with running(nodes(hosts, vs), chain):
        pass

    addr = {i: n.address for i, n in hosts.items()}
    honest, trickler = [addr[1], addr[2], addr[3]], addr[4]
    step = chain.query("outer_step", run_id=run_id, step=0)
    assert step["phase"] == "DONE", diagnosis(step, addr, logs)
    g = step["result_hash"]
    assert g == chain.run(run_id)["global_model_hash"] != cfg.initial_model_hash  # a new model
    assert set(step["result_votes"].values()) == {g}  # a vote came in time, none for another model
    applied = {e["node"]: e["model_hash"] for e in logs if e["event"] == "outer_step_applied"}
    assert all(applied[f"host-{i}"] == g for i in (1, 2, 3)), applied  # every honest host adopted it
    s = stakes(chain, run_id)
    assert all(s[h] == STAKE for h in honest)
    if verifiers == "honest":  # the others fetched the Δ (from the verifiers, hedged)
        assert step["outcomes"] == dict.fromkeys(addr.values(), "accepted"), diagnosis(step, addr, logs)
        assert step["dropped"] == [] and events(chain, "withheld") == []
        got = [e for e in logs if e["event"] == "fetched" and e.get("host") == trickler]
        assert {"host-1", "host-2", "host-3"} <= {e["node"] for e in got}  # (a verifier may fetch it too)
    else:  # only its author holds it: unavailable, dropped and slashed like a withheld Δ
        assert step["accepted"] == sorted(honest)
        assert step["outcomes"] == {**dict.fromkeys(honest, "accepted"), trickler: "withheld"}
        assert [e["host"] for e in events(chain, "withheld")] == [trickler]
        assert s[trickler] == STAKE - STAKE * cfg.stake.host_slash_bps // 10_000
        slow = [e for e in logs if e["event"] == "delta_unavailable" and e.get("host") == trickler]
        assert slow, "the honest hosts never gave up on the trickle"
