"""Read-only queries over `ChainState`, each returning a JSON-able dict.

Hosts and verifiers follow a run entirely through these: the phase and deadlines of the current
outer step, the challenge they must answer, the reveals they must check (`assignments` lists
audits and disputes too, so a verifier picks those up like any other assignment), the accepted
set of the current result round they must aggregate, and the previous optimizer hash a verifier
checks a start state against.
Unknown runs or steps raise `ErrUnknownRun` / `ErrWrongOuterStep` (the node answers 404).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from chain import errors
from chain.module import (
    apply_to_hash,
    disputed_windows,
    eager_parent,
    next_base,
    owes_revote,
    reveal_closes,
    run_config,
    start_ef,
    start_optimizer,
    steps_in_flight,
)
from chain.params import DENOM, MODULE_ACCOUNT, REWARD_POOL_ACCOUNT
from chain.state import ChainState, Contribution, OuterStep, Run, app_hash, total_supply
from protocol.messages import Role


def _run(state: ChainState, run_id: int) -> Run:
    run = state.runs.get(run_id)
    if run is None:
        raise errors.ErrUnknownRun(f"run {run_id}")
    return run


def _step(run: Run, outer_step: int | None) -> OuterStep:
    index = run.current_step if outer_step is None else outer_step
    step = run.steps.get(index)
    if step is None:
        raise errors.ErrWrongOuterStep(f"run {run.id} has no outer step {index}")
    return step


def params(state: ChainState) -> dict[str, Any]:
    return {
        "chain_id": state.chain_id,
        "authority": state.authority,
        "denom": DENOM,
        "module_account": MODULE_ACCOUNT,
        "reward_pool_account": REWARD_POOL_ACCOUNT,
        "params": dict(state.params),
    }


def status(state: ChainState) -> dict[str, Any]:
    return {"height": state.height, "app_hash": app_hash(state).hex(), "total_supply": total_supply(state)}


def _run_summary(run: Run) -> dict[str, Any]:
    step = run.steps[run.current_step]
    return {
        "run_id": run.id,
        "name": run.config["name"],
        "creator": run.creator,
        "status": run.status,
        "config_hash": run.config_hash,
        "created_height": run.created_height,
        "global_model_hash": run.global_model_hash,
        "current_step": run.current_step,
        "phase": step.phase,
        "overlap": run.config.get("overlap", "none"),
        "steps_in_flight": [s.index for s in steps_in_flight(run)],
        "hosts": sum(1 for p in run.participants.values() if p.role == Role.HOST),
        "verifiers": sum(1 for p in run.participants.values() if p.role == Role.VERIFIER),
    }


def runs(state: ChainState) -> dict[str, Any]:
    return {"runs": [_run_summary(state.runs[i]) for i in sorted(state.runs)]}


def run(state: ChainState, run_id: int) -> dict[str, Any]:
    """The summary plus the full `RunConfig` (as JSON) the run is bound to."""
    r = _run(state, run_id)
    return {**_run_summary(r), "config": r.config}


def outer_step(state: ChainState, run_id: int, step: int | None = None) -> dict[str, Any]:
    """Phase, every deadline, the model hash commits must build on, and the outcome so far."""
    r = _run(state, run_id)
    s = _step(r, step)
    return {
        "run_id": r.id,
        "outer_step": s.index,
        "phase": s.phase,
        "height": state.height,
        "open_height": s.open_height,
        "train_start": s.train_start,
        "commit_deadline": s.commit_deadline,
        "challenge_height": s.commit_deadline + 2,
        "reveal_deadline": s.reveal_deadline,
        "reveal_closes": reveal_closes(s, run_config(r).phases),
        "verify_deadline": s.verify_deadline,
        "round": s.round,
        "round_deadline": s.round_deadline,
        "audit_height": s.audit_height,
        "result_deadline": s.result_deadline,
        "result_round": s.result_round,
        "base_model_hash": s.base_model_hash,
        "apply_to_hash": apply_to_hash(r, s),
        "challenge_seed": s.challenge_seed,
        "audit_seed": s.audit_seed,
        "committed": sorted(s.contributions),
        "finalized_height": s.finalized_height,
        "accepted": list(s.accepted),
        "dropped": list(s.dropped),
        "outcomes": {h: s.contributions[h].outcome for h in sorted(s.contributions)},
        "reviews": {h: s.contributions[h].review for h in sorted(s.contributions)},
        "result_hash": s.result_hash,
        "result_votes": dict(sorted(s.result_votes.items())),
        "result_losses": dict(sorted(s.result_losses.items())),  # voter -> val_loss_ppm of its vote
        "unavailable": dict(sorted(s.unavailable.items())),
        "done_height": s.done_height,
    }


_COMMIT_FIELDS = (
    "host",
    "height",
    "tx_hash",
    "base_model_hash",
    "trajectory_root",
    "leaf_count",
    "delta_hash",
    "final_optimizer_hash",
    "codec",
    "tokens",
    "env",
    "equivocation_tx",
    "final_ef_hash",
)


def _commitment(c: Contribution) -> dict[str, Any]:
    return {name: getattr(c, name) for name in _COMMIT_FIELDS}


def commitments(state: ChainState, run_id: int, step: int | None = None) -> dict[str, Any]:
    s = _step(_run(state, run_id), step)
    return {
        "outer_step": s.index,
        "commitments": [_commitment(s.contributions[h]) for h in sorted(s.contributions)],
    }


def commitment(state: ChainState, run_id: int, host: str, step: int | None = None) -> dict[str, Any] | None:
    s = _step(_run(state, run_id), step)
    c = s.contributions.get(host)
    return None if c is None else _commitment(c)


def _windows(c: Contribution) -> dict[str, Any]:
    slots = dict(sorted(c.slots.items()))
    owed = [v for v in slots if owes_revote(c, v)]
    return {"windows": list(c.windows), "slots": slots, "disputed": disputed_windows(c), "revotes_owed": owed}


def challenges(state: ChainState, run_id: int, step: int | None = None) -> dict[str, Any]:
    """Per host: the segments to open and the verifiers (with the round each was drawn in: the
    initial rounds, then the audit and the dispute panel, if any); windowed runs add each slot's
    window start, the verifiers' slots and the windows a dispute panel replays (§2.3, §2.5.3)."""
    s = _step(_run(state, run_id), step)
    items = [
        {
            "host": c.host,
            "segments": list(c.sampled_segments),
            "verifiers": list(c.verifiers),
            "verifier_rounds": dict(sorted(c.verifier_rounds.items())),
            "review": c.review,
            "audited": c.audited,
            **(_windows(c) if c.windows else {}),
        }
        for c in (s.contributions[h] for h in sorted(s.contributions))
    ]
    return {
        "outer_step": s.index,
        "challenge_height": s.challenge_height,
        "seed": s.challenge_seed,
        "round": s.round,
        "challenges": items if s.challenge_seed is not None else [],
    }


def assignments(state: ChainState, run_id: int, verifier: str, step: int | None = None) -> dict[str, Any]:
    """What one verifier must judge now: hosts it is assigned to (initial round, escalation, audit or
    dispute panel) that are undecided and unjudged, or in a windowed dispute owe its revote."""
    s = _step(_run(state, run_id), step)
    hosts = [
        h
        for h in sorted(s.contributions)
        if verifier in s.contributions[h].verifier_rounds
        and (verifier not in s.contributions[h].verdicts or owes_revote(s.contributions[h], verifier))
        and s.contributions[h].outcome is None
    ]
    return {"outer_step": s.index, "phase": s.phase, "round_deadline": s.round_deadline, "hosts": hosts}


def reveals(state: ChainState, run_id: int, step: int | None = None) -> dict[str, Any]:
    r = _run(state, run_id)
    s = _step(r, step)
    items = [
        {
            "host": c.host,
            "height": c.reveal_height,
            "endpoint": r.participants[c.host].endpoint if c.host in r.participants else None,
            "delta_hash": c.delta_hash,
            "openings": [dataclasses.asdict(o) for o in c.openings],
        }
        for c in (s.contributions[h] for h in sorted(s.contributions))
        if c.reveal_height is not None
    ]
    return {"outer_step": s.index, "reveals": items}


def verdicts(state: ChainState, run_id: int, step: int | None = None) -> dict[str, Any]:
    s = _step(_run(state, run_id), step)
    items = [
        dataclasses.asdict(c.verdicts[v]) | {"host": c.host}
        for c in (s.contributions[h] for h in sorted(s.contributions))
        for v in sorted(c.verdicts)
    ]
    return {"outer_step": s.index, "verdicts": items}


def accepted(state: ChainState, run_id: int, step: int | None = None) -> dict[str, Any]:
    """The current result round's accepted set with what aggregation needs: each Δ's hash, tokens
    and blob endpoint. It shrinks when a round drops Δs reported unavailable (`dropped`); a reward
    is non-zero once the result is adopted."""
    r = _run(state, run_id)
    s = _step(r, step)
    items = [
        {
            "host": h,
            "delta_hash": s.contributions[h].delta_hash,
            "tokens": s.contributions[h].tokens,
            "codec": s.contributions[h].codec,
            "endpoint": r.participants[h].endpoint if h in r.participants else None,
            "reward": s.contributions[h].reward,
        }
        for h in s.accepted
    ]
    return {
        "outer_step": s.index,
        "finalized_height": s.finalized_height,
        "base_model_hash": s.base_model_hash,
        "apply_to_hash": apply_to_hash(r, s),
        "result_round": s.result_round,
        "result_deadline": s.result_deadline,
        "dropped": list(s.dropped),
        "accepted": items,
    }


def participants(state: ChainState, run_id: int) -> dict[str, Any]:
    r = _run(state, run_id)
    return {
        "run_id": r.id,
        "participants": [dataclasses.asdict(r.participants[a]) for a in sorted(r.participants)],
    }


def prev_optimizer_hash(state: ChainState, run_id: int, host: str, step: int | None = None) -> str | None:
    """The optimizer hash the host's start state of outer step `step` (default: the current one)
    must carry; None = fresh optimizer (specs §2.2.1, §2.6)."""
    return start_optimizer(_run(state, run_id), host, step)


def start_ef_hash(state: ChainState, run_id: int, host: str, step: int | None = None) -> str | None:
    """The error-feedback accumulator the host's start state of outer step `step` (default: the
    current one) carries in a sparse run; None = zeros (specs §4.1)."""
    return start_ef(_run(state, run_id), host, step)


def start_state(state: ChainState, run_id: int, host: str, step: int | None = None) -> dict[str, Any]:
    """What the host's start state of outer step `step` (default: the current one) is made of
    (specs §2.2.1): the base model, the eager parent (the host's own step n − 1 Δ the outer step
    is applied with, or null) and the optimizer state (null = fresh)."""
    run = _run(state, run_id)
    s = _step(run, step)
    parent = eager_parent(run, host, s.index)
    return {
        "base_model_hash": s.base_model_hash,
        "parent_delta_hash": None if parent is None else parent.delta_hash,
        "parent_codec": None if parent is None else parent.codec,
        "parent_outer_step": None if parent is None else s.index - 1,
        "optimizer_hash": start_optimizer(run, host, s.index),
        "ef_hash": start_ef(run, host, s.index),
    }


def next_start_state(state: ChainState, run_id: int, host: str) -> dict[str, Any] | None:
    """The host's start state of the step after the newest, before that step opens, once every
    part of it is fixed (`module.next_base`; overlapped runs only), else null: the same answer
    `start_state` will give when it opens, so the host can train it while the window of the newest
    step is still open (specs §2.2.1)."""
    run = _run(state, run_id)
    base = next_base(run)
    if base is None:
        return None
    index = run.current_step + 1
    parent = eager_parent(run, host, index)
    return {
        "outer_step": index,
        "base_model_hash": base,
        "parent_delta_hash": None if parent is None else parent.delta_hash,
        "parent_codec": None if parent is None else parent.codec,
        "parent_outer_step": None if parent is None else index - 1,
        "optimizer_hash": start_optimizer(run, host, index),
        "ef_hash": start_ef(run, host, index),
    }


def account(state: ChainState, address: str) -> dict[str, Any] | None:
    a = state.accounts.get(address)
    return None if a is None else dataclasses.asdict(a)


def balance(state: ChainState, address: str) -> dict[str, Any]:
    a = state.accounts.get(address)
    return {"address": address, "denom": DENOM, "amount": a.balance if a else 0}


def balances(state: ChainState) -> dict[str, Any]:
    return {"denom": DENOM, "balances": {a: state.accounts[a].balance for a in sorted(state.accounts)}}


def stakes(state: ChainState, address: str) -> dict[str, Any]:
    """Every bond of one address across runs."""
    bonds = [
        {"run_id": r.id, **dataclasses.asdict(r.participants[address])}
        for r in (state.runs[i] for i in sorted(state.runs))
        if address in r.participants
    ]
    return {"address": address, "bonds": bonds, "total": sum(b["stake"] for b in bonds)}
