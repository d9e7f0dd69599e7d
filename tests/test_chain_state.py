"""ChainState: canonical JSON round-trips exactly, app hash commits to every field, bank helpers."""

from __future__ import annotations

import pytest
from test_chain_module import AUTH, HOSTS, STRANGER, addr, make_state, reveal_msg, started, to_reveal

from chain.state import (
    app_hash,
    balance_of,
    get_or_create_account,
    state_from_json,
    state_to_json,
    total_supply,
    transfer,
)


def test_round_trip_of_a_state_with_runs_commitments_and_reveals() -> None:
    sim = started()
    to_reveal(sim, HOSTS[:2])
    sim.ok(reveal_msg(sim, HOSTS[0]))
    text = state_to_json(sim.state)
    back = state_from_json(text)
    assert back == sim.state
    assert state_to_json(back) == text and app_hash(back) == app_hash(sim.state)
    assert isinstance(next(iter(back.runs)), int) and 0 in back.runs[1].steps


def test_app_hash_changes_with_any_field() -> None:
    state = make_state()
    before = app_hash(state)
    state.accounts[AUTH].sequence += 1
    assert app_hash(state) != before
    state.accounts[AUTH].sequence -= 1
    assert app_hash(state) == before


def test_new_accounts_get_increasing_numbers() -> None:
    state = make_state()
    first = get_or_create_account(state, addr("n1"))
    second = get_or_create_account(state, addr("n2"))
    assert second.number == first.number + 1
    assert get_or_create_account(state, addr("n1")) is first


def test_transfer_conserves_supply_and_refuses_overdraft() -> None:
    state = make_state()
    supply = total_supply(state)
    transfer(state, STRANGER, addr("n3"), 5)
    assert balance_of(state, addr("n3")) == 5 and total_supply(state) == supply
    with pytest.raises(ValueError, match="not covered"):
        transfer(state, addr("n3"), STRANGER, 6)
    with pytest.raises(ValueError, match="not covered"):
        transfer(state, STRANGER, addr("n3"), -1)
    assert total_supply(state) == supply
