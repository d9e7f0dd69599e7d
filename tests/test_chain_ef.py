"""The chain carries the sparse codec's error-feedback accumulator (issue 26, specs §4.1).

A sparse run's commit binds the hash of the e_next its host carries on (`final_ef_hash`); the
host's next start names the e of its last accepted contribution, exactly as it names its optimizer
state (None: zeros), and loses it with any other outcome. Dense runs carry none, and their state,
app hash and wire bytes are what they were before the field existed.
"""

from __future__ import annotations

from chain import errors, queries
from chain.errors import ChainError
from chain.params import Outcome, Phase
from chain.persist import all_rows, build_state
from chain.state import app_hash, state_from_json, state_to_json
from protocol.config import Codec, Overlap, RunConfig
from protocol.messages import MsgReportUnavailable, Reason
from tests.support.chain import (
    HOSTS,
    Sim,
    assigned,
    commit_msg,
    h32,
    make_config,
    ok_block,
    reveal_msg,
    started,
    step_of,
    verdict_msg,
    vote,
)


def sparse_config(**kw: object) -> RunConfig:
    return make_config(codec=Codec.SPARSE, codec_block_size=64, **kw)


def ef_commit(host: str, step: int = 0, base: str | None = None, **kw: object):
    return commit_msg(host, step, base, codec=Codec.SPARSE, final_ef_hash=h32("ef", host, step), **kw)


def test_a_sparse_commit_must_name_its_accumulator() -> None:
    sim = started(sparse_config())
    sim.fails(commit_msg(HOSTS[0], codec=Codec.SPARSE), errors.ErrMissingEFHash)
    sim.ok(ef_commit(HOSTS[0]))
    assert queries.commitment(sim.state, 1, HOSTS[0])["final_ef_hash"] == h32("ef", HOSTS[0], 0)
    assert sim.state.runs[1].steps[0].contributions[HOSTS[0]].final_ef_hash == h32("ef", HOSTS[0], 0)


def test_a_dense_commit_must_not_name_one() -> None:
    sim = started()
    sim.fails(commit_msg(HOSTS[0], final_ef_hash=h32("ef")), errors.ErrUnexpectedEFHash)
    sim.ok(commit_msg(HOSTS[0]))
    c = queries.commitment(sim.state, 1, HOSTS[0])
    assert c["final_ef_hash"] is None
    assert queries.start_ef_hash(sim.state, 1, HOSTS[0]) is None


def test_a_second_commit_with_another_accumulator_is_equivocation() -> None:
    sim = started(sparse_config())
    sim.ok(ef_commit(HOSTS[0]))
    sim.fails(ef_commit(HOSTS[0]), errors.ErrDuplicateCommit)
    sim.ok(commit_msg(HOSTS[0], codec=Codec.SPARSE, final_ef_hash=h32("other e")))
    assert sim.state.runs[1].steps[0].contributions[HOSTS[0]].equivocation_tx is not None


def _judged(sim: Sim, hosts: list[str], rejected: set[str], step: int = 0, base: str | None = None) -> None:
    """Commit and judge one step: the `rejected` hosts never reveal (missing_reveal), the rest are
    revealed and accepted; runs blocks until the step is finalized."""
    assert not any(isinstance(r, ChainError) for r in sim.block(*[ef_commit(h, step, base) for h in hosts]))
    sim.until(sim.step()["challenge_height"] + 1)
    txs = []
    for h in sorted(set(hosts) - rejected):
        txs += [reveal_msg(sim, h, step), verdict_msg(assigned(sim, h)[0], h, Reason.ACCEPT, step)]
    assert not any(isinstance(r, ChainError) for r in sim.block(*txs))
    while sim.step()["finalized_height"] is None:
        sim.block()


def test_the_start_accumulator_follows_the_last_accepted_contribution() -> None:
    good, bad = HOSTS[:2]
    sim = started(sparse_config(), hosts=[good, bad])
    assert queries.start_state(sim.state, 1, good)["ef_hash"] is None  # a fresh host: zeros
    _judged(sim, [good, bad], rejected={bad})
    outcomes = sim.step()["outcomes"]
    assert outcomes[good] == Outcome.ACCEPTED and outcomes[bad] != Outcome.ACCEPTED
    assert queries.start_ef_hash(sim.state, 1, good) == h32("ef", good, 0)
    assert queries.start_ef_hash(sim.state, 1, bad) is None  # its e never chains on
    assert sim.state.runs[1].prev_ef == {good: h32("ef", good, 0)}
    sim.block(vote(good, "g1"))
    assert sim.step()["outer_step"] == 1 and sim.step()["phase"] in (Phase.PENDING, Phase.TRAIN)
    sim.until(sim.step()["train_start"])
    start = queries.start_state(sim.state, 1, good, 1)
    assert start["ef_hash"] == h32("ef", good, 0) and start["optimizer_hash"] == h32("opt", good, 0)
    assert queries.start_state(sim.state, 1, bad, 1)["ef_hash"] is None

    _judged(sim, [good, bad], rejected={good}, step=1, base=h32("g1"))  # now the other way round
    assert queries.start_ef_hash(sim.state, 1, good) is None  # rejected: back to zeros
    assert queries.start_ef_hash(sim.state, 1, bad) == h32("ef", bad, 1)
    assert queries.prev_optimizer_hash(sim.state, 1, good) is None  # the same reset rule


def test_a_withheld_delta_drops_its_accumulator() -> None:
    hosts = HOSTS[:3]
    sim = started(sparse_config(), hosts=hosts)
    _judged(sim, hosts, rejected=set())
    withholder, *good = sorted(hosts)
    sim.block(*[MsgReportUnavailable(creator=g, run_id=1, outer_step=0, hosts=[withholder]) for g in good])
    sim.until(sim.step()["result_deadline"] + 1)
    assert sim.step()["outcomes"][withholder] == Outcome.WITHHELD
    assert queries.start_ef_hash(sim.state, 1, withholder) is None
    assert all(queries.start_ef_hash(sim.state, 1, g) == h32("ef", g, 0) for g in good)


def test_the_accumulator_fields_round_trip_and_leave_dense_states_as_they_were() -> None:
    dense = started()
    dense.block(*[commit_msg(h) for h in HOSTS[:2]])
    text = state_to_json(dense.state)
    assert "final_ef_hash" not in text and "prev_ef" not in text  # omitted at their defaults

    sim = started(sparse_config(), hosts=HOSTS[:2])
    _judged(sim, HOSTS[:2], rejected=set())
    text = state_to_json(sim.state)
    assert '"final_ef_hash":"' in text and '"prev_ef":{' in text
    back = state_from_json(text)
    assert state_to_json(back) == text and app_hash(back, cached=False) == app_hash(sim.state)
    assert back.runs[1].prev_ef == sim.state.runs[1].prev_ef
    for state in (dense.state, sim.state):
        rebuilt = build_state(all_rows(state))
        assert app_hash(rebuilt, cached=False) == app_hash(state)


def test_an_eager_start_carries_its_parents_accumulator() -> None:
    """Overlapped runs: the start of step n carries the e its parent (own step n − 1) committed,
    like its optimizer state; a host without a parent starts from zeros (§2.2.1)."""
    sim = started(sparse_config(overlap=Overlap.EAGER, phases={"result_blocks": 30}), hosts=HOSTS[:3])
    ok_block(sim, ef_commit(HOSTS[0]), ef_commit(HOSTS[1]))  # host 2 sits step 0 out
    sim.until(step_of(sim, 0)["commit_deadline"] + 2)
    s = queries.start_state(sim.state, 1, HOSTS[0], 1)
    assert s["ef_hash"] == h32("ef", HOSTS[0], 0) and s["parent_delta_hash"] is not None
    assert queries.start_ef_hash(sim.state, 1, HOSTS[0], 1) == s["ef_hash"]
    assert queries.start_state(sim.state, 1, HOSTS[2], 1)["ef_hash"] is None
