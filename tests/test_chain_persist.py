"""Row-wise state persistence (chain/persist.py): a block writes what it changed, and the rows
always rebuild exactly the state, whatever field or key changed, including deletions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from chain.persist import RowDelta, RowError, RowTracker, all_rows, build_state, path_key, subtree_range
from chain.state import app_hash, state_from_json, state_to_json
from protocol.messages import MsgLeaveRun
from tests.support.chain import (
    HOSTS,
    VERIFIERS,
    Sim,
    apply_mutation,
    assigned,
    commit_msg,
    history,
    mutations,
    reveal_msg,
    started,
    verdict_msg,
)
from tests.support.txs import APP_GENESIS, app_send_tx


class Rows:
    """A stand-in database: path key -> body, updated the way chain.store applies a delta."""

    def __init__(self) -> None:
        self.rows: dict[str, str] = {}

    def apply(self, delta: RowDelta) -> None:
        for path in delta.deletes:
            low, high = subtree_range(path)
            key = path_key(path)
            self.rows = {k: v for k, v in self.rows.items() if not (k == key or low <= k < high)}
        self.rows.update(delta.upserts)

    def state(self) -> Any:
        return build_state(list(self.rows.items()))


def persisted_sim() -> tuple[Sim, RowTracker, Rows]:
    sim = started()
    tracker, rows = RowTracker(), Rows()
    app_hash(sim.state)
    rows.apply(tracker.delta(sim.state))
    return sim, tracker, rows


def commit(sim: Sim, tracker: RowTracker, rows: Rows) -> RowDelta:
    """What a node does after each block: app hash first (the header), then the rows."""
    app_hash(sim.state)
    delta = tracker.delta(sim.state)
    rows.apply(delta)
    return delta


def test_rows_rebuild_the_state_block_after_block_through_a_whole_outer_step() -> None:
    sim, tracker, rows = persisted_sim()
    written: list[int] = []
    for msgs in (
        [commit_msg(h) for h in HOSTS[:2]],
        [],
    ):
        sim.block(*msgs)
        written.append(len(commit(sim, tracker, rows).upserts))
    sim.until(sim.step()["challenge_height"] + 1)
    commit(sim, tracker, rows)
    for host in HOSTS[:2]:
        sim.ok(reveal_msg(sim, host))
        commit(sim, tracker, rows)
        sim.ok(verdict_msg(assigned(sim, host)[0], host))
        commit(sim, tracker, rows)
    sim.ok(MsgLeaveRun(creator=VERIFIERS[2], run_id=1))
    commit(sim, tracker, rows)
    while sim.state.runs[1].steps[0].phase != "AWAITING_RESULT":
        sim.block()
        commit(sim, tracker, rows)
    rebuilt = rows.state()
    assert rebuilt == sim.state and state_to_json(rebuilt) == state_to_json(sim.state)
    assert app_hash(rebuilt) == app_hash(sim.state)
    assert written[0] >= 2 and written[1] == 1  # two commits (and more); then an idle block


def test_an_idle_block_writes_the_root_row_only() -> None:
    sim = history()
    tracker, rows = RowTracker(), Rows()
    app_hash(sim.state)
    rows.apply(tracker.delta(sim.state))
    sim.block()
    delta = commit(sim, tracker, rows)
    assert [k for k, _ in delta.upserts] == ["[]"] and delta.deletes == []
    assert json.loads(delta.upserts[0][1])["height"] == sim.height


def test_a_finished_outer_step_is_written_once_and_never_visited_again() -> None:
    sim = history()  # outer step 0 is DONE, step 1 is live
    tracker, rows = RowTracker(), Rows()
    app_hash(sim.state)
    first = tracker.delta(sim.state)
    rows.apply(first)
    sealed = sim.state.runs[1].steps[0]
    assert any(k.startswith('["runs",1,"steps",0,') for k, _ in first.upserts)
    # history keeps no cached text in memory: neither its contributions nor their verdicts
    below = [c for c in sealed.contributions.values()] + [
        v for c in sealed.contributions.values() for v in c.verdicts.values()
    ]
    assert below and not any("_own_cache" in x.__dict__ for x in below)
    # The module never writes a DONE step; if something did without `touched`, the app hash would
    # not see it either, and nor does the walk: proof that it skips the sealed subtree.
    sealed.contributions[HOSTS[0]].reward += 1
    assert tracker.delta(sim.state).upserts == []
    sealed.contributions[HOSTS[0]].reward -= 1
    sim.block()
    assert not any('"steps",0' in k for k, _ in commit(sim, tracker, rows).upserts)


def test_a_departed_participant_and_its_subtree_are_deleted() -> None:
    sim, tracker, rows = persisted_sim()
    leaver = VERIFIERS[2]
    key = f'["runs",1,"participants","{leaver}"]'
    assert key in rows.rows
    sim.ok(MsgLeaveRun(creator=leaver, run_id=1))  # unbonds when the outer step finalizes
    deletes: list[Any] = list(commit(sim, tracker, rows).deletes)
    for _ in range(60):
        if leaver not in sim.state.runs[1].participants:
            break
        sim.block()
        deletes += commit(sim, tracker, rows).deletes
    assert leaver not in sim.state.runs[1].participants
    assert deletes == [("runs", 1, "participants", leaver)] and key not in rows.rows
    assert rows.state() == sim.state


def test_any_field_or_key_changed_anywhere_is_written() -> None:
    """The walk is generic: every leaf and map key of the state, changed, reaches the rows."""
    sim = history()
    base = state_to_json(sim.state)
    tree = json.loads(base)
    checked = 0
    for i, (path, kind, change) in enumerate(mutations(tree)):
        if i % 3:  # a third of the ~500 mutations keeps this fast and still covers every table
            continue
        try:
            mutated = state_from_json(json.dumps(apply_mutation(tree, path, kind, change)))
        except (KeyError, TypeError, ValueError):
            continue
        original = state_from_json(base)
        tracker, rows = RowTracker(), Rows()
        rows.apply(tracker.delta(original))
        delta = tracker.delta(mutated)
        assert delta.upserts or delta.deletes, f"{kind} at {path} was not written"
        rows.apply(delta)
        assert state_to_json(rows.state()) == state_to_json(mutated), f"{kind} at {path}"
        checked += 1
    assert checked > 100


def test_rows_that_do_not_fit_are_refused() -> None:
    sim = started()
    rows = dict(all_rows(sim.state))
    orphan = dict(rows)
    del orphan['["runs",1]']
    with pytest.raises(RowError, match="no parent"):
        build_state(list(orphan.items()))
    with pytest.raises(RowError, match="no map of rows"):
        build_state([*rows.items(), ('["nothing",1]', "{}")])
    with pytest.raises(RowError, match="is not a int"):
        build_state([*rows.items(), ('["runs","1"]', "{}")])
    bad_fields = dict(rows)
    bad_fields["[]"] = json.dumps({**json.loads(rows["[]"]), "extra": 1})
    with pytest.raises(RowError, match="fields"):
        build_state(list(bad_fields.items()))
    with pytest.raises(RowError, match="no root"):
        build_state([(k, v) for k, v in rows.items() if k != "[]"])


def test_the_store_restarts_from_rows_and_writes_little(tmp_path: Path) -> None:
    """Store: commit after commit, reopen, same state and app hash; an idle block is one row."""
    from chain.app import App
    from chain.genesis import genesis_state
    from chain.store import Store

    app = App(genesis_state(APP_GENESIS))
    store = Store(tmp_path / "db.sqlite")
    store.init_genesis(app.state, APP_GENESIS.model_dump_json())
    store.load_state()
    busy = store.commit_block(app.deliver_block([app_send_tx(app)], 10**18), app.state)
    idle = store.commit_block(app.deliver_block([], 10**18), app.state)
    assert busy.rows >= 2 and idle.rows == 1 and idle.bytes < 2000
    expected = app_hash(app.state)
    store.close()
    reopened = Store(tmp_path / "db.sqlite")
    state, header, _ = reopened.load_state()
    assert app_hash(state) == expected and header is not None and header["height"] == state.height
    reopened.close()


def test_a_subtree_range_holds_the_descendants_and_nothing_else() -> None:
    low, high = subtree_range(("runs", 1))
    assert low == '["runs",1,' and low < '["runs",1,"steps",0]' < high
    assert not (low <= '["runs",10]' < high) and not (low <= '["runs",1]' < high)
    assert path_key(()) == "[]"


def test_only_float_free_flat_nodes_are_cached_by_their_values() -> None:
    """1 == 1.0 but they print differently: a flat node with a float field is re-serialized."""
    from dataclasses import dataclass

    from chain.state import Account, layout

    @dataclass
    class Priced:
        name: str
        price: float | None = None

    assert layout(Account).flat and not layout(Priced).flat


def test_a_tampered_row_is_refused_on_restart_and_a_stale_state_on_commit(tmp_path: Path) -> None:
    """Restart adopts each row as its node's text without re-serializing it; the header's app hash
    is what vouches for them, so one edited row (still valid JSON, still a valid state) is refused.
    And a state that is not the one the header's app hash commits to is never written."""
    import sqlite3

    from chain.app import App
    from chain.genesis import genesis_state
    from chain.store import Store, StoreError

    app = App(genesis_state(APP_GENESIS))
    store = Store(tmp_path / "db.sqlite")
    store.init_genesis(app.state, APP_GENESIS.model_dump_json())
    store.load_state()
    store.commit_block(app.deliver_block([app_send_tx(app)], 10**18), app.state)
    block = app.deliver_block([], 10**18)
    app.state.accounts[APP_GENESIS.authority].balance += 1  # after the header's app hash was computed
    with pytest.raises(StoreError, match="app hash"):
        store.commit_block(block, app.state)
    store.close()
    db = sqlite3.connect(tmp_path / "db.sqlite")
    key = path_key(("accounts", APP_GENESIS.authority))
    (body,) = db.execute("SELECT body FROM state_rows WHERE path = ?", (key,)).fetchone()
    row = json.loads(body)
    row["balance"] += 1
    db.execute("UPDATE state_rows SET body = ? WHERE path = ?", (json.dumps(row), key))
    db.commit()
    db.close()
    with pytest.raises(StoreError, match="does not match"):
        Store(tmp_path / "db.sqlite").load_state()
