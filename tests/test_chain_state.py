"""ChainState: canonical JSON round-trips exactly, app hash commits to every field, bank helpers.

The app hash caches digests (a contribution's until the module touches it, a DONE step's for good);
these tests pin down that the cached value is a pure function of the state's content: every field
and key anywhere changes it, a JSON round-trip keeps it, and an idle block re-hashes nothing sealed.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from typing import Any

import pytest

from chain import state as chain_state
from chain.module import BlockContext, TxContext, begin_block, end_block, process_msg
from chain.params import Outcome, Phase, RunStatus
from chain.state import (
    app_hash,
    balance_of,
    get_or_create_account,
    state_from_json,
    state_to_json,
    total_supply,
    transfer,
)
from protocol.messages import Role
from tests.support.chain import (
    AUTH,
    HOSTS,
    STRANGER,
    addr,
    apply_mutation,
    assigned,
    h32,
    history,
    make_state,
    mutations,
    reveal_msg,
    started,
    to_reveal,
    verdict_msg,
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


# ---------------------------------------------------------------- app hash: a hash tree with cached digests


ENUM_FIELDS = {"role", "phase", "status", "outcome", "review", "codec"}
"""Typed fields (StrEnums): a value outside the enum is refused when the state is read."""


def test_changing_any_field_or_key_anywhere_changes_the_app_hash() -> None:
    sim = history()
    before = app_hash(sim.state)
    tree = json.loads(state_to_json(sim.state))
    seen: Counter[str] = Counter()
    for path, kind, change in mutations(tree):
        try:
            mutated = state_from_json(json.dumps(apply_mutation(tree, path, kind, change)))
        except (KeyError, TypeError, ValueError):  # a renamed dataclass field: not a state at all
            assert kind == "key" or path[-1] in ENUM_FIELDS, (kind, path)  # nor a phase nobody knows
            continue
        assert app_hash(mutated) != before, f"{kind} at {path} is not committed to"
        where = "/".join(map(str, path[:4])) if path[:3] == ("runs", "1", "steps") else str(path[:1])
        seen[f"{where} {kind}"] += 1
    # the walk really went through accounts, the sealed step 0 and the live step 1, keys included
    assert seen["('accounts',) key"] > 5 and seen["('accounts',) value"] > 20
    assert seen["runs/1/steps/0 value"] > 50 and seen["runs/1/steps/0 key"] > 5
    assert seen["runs/1/steps/1 value"] > 30 and seen["runs/1/steps/1 key"] > 5


def test_app_hash_is_content_only_and_survives_json_round_trips() -> None:
    sim = history()
    warm = app_hash(sim.state)  # every digest cached by the blocks so far
    assert warm == app_hash(sim.state, cached=False)
    cold = state_from_json(state_to_json(sim.state))
    assert app_hash(cold) == warm and app_hash(cold, cached=False) == warm
    assert app_hash(state_from_json(state_to_json(cold))) == warm
    assert state_to_json(cold) == state_to_json(sim.state)  # the cache is never serialized


def test_a_write_inside_a_sealed_step_or_an_account_changes_the_hash() -> None:
    sim = history()
    before = app_hash(sim.state)
    sealed = sim.state.runs[1].steps[0].contributions[HOSTS[0]]
    sealed.reward += 1  # the module never does this; a tampered snapshot would
    assert app_hash(sim.state, cached=False) != before
    assert app_hash(state_from_json(state_to_json(sim.state))) != before
    chain_state.touched(sealed)
    chain_state.touched(sim.state.runs[1].steps[0])
    assert app_hash(sim.state) != before
    sealed.reward -= 1
    chain_state.touched(sealed)
    chain_state.touched(sim.state.runs[1].steps[0])
    assert app_hash(sim.state) == before
    sim.state.accounts[STRANGER].balance += 1
    assert app_hash(sim.state) != before


def test_an_idle_block_rehashes_no_contribution_and_no_sealed_step(monkeypatch: pytest.MonkeyPatch) -> None:
    sim = history()
    app_hash(sim.state)
    calls: Counter[str] = Counter()
    digest = chain_state._digest

    def counting(cls: type, own: str, children: str) -> str:
        calls[chain_state.kind(cls)] += 1
        return digest(cls, own, children)

    monkeypatch.setattr(chain_state, "_digest", counting)
    h = sim.height + 1
    ctx = BlockContext(height=h, time_ns=h, prev_block_hash=sim.prev_hash)
    begin_block(sim.state, ctx)
    end_block(sim.state, ctx)
    app_hash(sim.state)
    assert calls == Counter({"app": 1, "run": 1, "outer-step": 1})  # the root, the run, its live step
    calls.clear()
    msg = verdict_msg(assigned(sim, HOSTS[1])[0], HOSTS[1], step=1)
    process_msg(sim.state, msg, TxContext(height=h, time_ns=h, tx_hash=h32("tx"), signer=msg.creator))
    app_hash(sim.state)
    # + the judged contribution and its new verdict; no account, participant or sealed step
    assert calls == Counter({"app": 1, "run": 1, "outer-step": 1, "contribution": 1, "verdict": 1})
    assert app_hash(sim.state) == app_hash(sim.state, cached=False)


NODE_MAPS = {
    "app": {"accounts": "account", "runs": "run"},
    "run": {"participants": "participant", "steps": "outer-step"},
    "outer-step": {"contributions": "contribution"},
    "contribution": {"verdicts": "verdict", "revotes": "verdict"},
}
"""specs/protocol.md §2.8's table: which maps of each kind of node hold nodes."""


def _spec_app_hash(z: dict[str, Any]) -> bytes:
    """specs/protocol.md §2.8 written out over the state JSON alone, independently of chain.state."""

    def canon(x: Any) -> str:
        return json.dumps(x, sort_keys=True, separators=(",", ":"))

    def d(kind: str, node: dict[str, Any]) -> str:
        maps = NODE_MAPS.get(kind, {})
        own = {k: v for k, v in node.items() if k not in maps}
        children = {m: {key: d(maps[m], child) for key, child in node[m].items()} for m in maps if m in node}
        data = f"gonka-diloco/{kind}/v2\x00{canon(own)}\x00{canon(children)}".encode()
        return hashlib.sha256(data).hexdigest()

    return bytes.fromhex(d("app", z))


def test_the_app_hash_is_the_one_the_spec_defines() -> None:
    sim = history()
    assert app_hash(sim.state) == _spec_app_hash(json.loads(state_to_json(sim.state)))
    assert app_hash(make_state()) == _spec_app_hash(json.loads(state_to_json(make_state())))
    classes = (chain_state.Account, chain_state.Participant, chain_state.Verdict, chain_state.OuterStep)
    assert [chain_state.kind(c) for c in classes] == ["account", "participant", "verdict", "outer-step"]


def test_phases_outcomes_and_roles_are_enums_in_the_state_and_plain_strings_in_its_json() -> None:
    """Issue 24: the state holds StrEnums, read back as such; their JSON (and so the app hash and
    every vector) is the bare value, and a value outside an enum is refused on read."""
    sim = history()
    text = state_to_json(sim.state)
    back = state_from_json(text)
    run = back.runs[1]
    assert isinstance(run.status, RunStatus) and all(isinstance(s.phase, Phase) for s in run.steps.values())
    assert all(isinstance(p.role, Role) for p in run.participants.values())
    outcomes = [c.outcome for s in run.steps.values() for c in s.contributions.values() if c.outcome]
    assert outcomes and all(isinstance(o, Outcome) for o in outcomes)
    assert state_to_json(back) == text and app_hash(back) == app_hash(sim.state)
    assert '"phase":"DONE"' in text
    with pytest.raises(ValueError, match="not a valid Phase"):
        state_from_json(text.replace('"phase":"DONE"', '"phase":"DONNE"', 1))
