"""Random message sequences and block advances against the module's invariants.

Every failed message is already checked to leave the state byte-identical (`Sim.block`); here we
add: total supply conserved, no negative stake or balance, at most one recorded commit per host
per outer step, the same sequence replayed from genesis gives the same app hash, and (liveness)
whatever was sent, the step in progress ends within the bound of specs/protocol.md §2.7 once
everybody falls silent.
"""

from __future__ import annotations

from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chain import queries
from chain.state import app_hash, total_supply
from protocol.messages import (
    Coin,
    MsgCreateRun,
    MsgLeaveRun,
    MsgReportUnavailable,
    MsgSend,
    MsgSubmitOuterResult,
    Reason,
    Role,
)
from tests.support.chain import (
    AUTH,
    GNK,
    HOSTS,
    STRANGER,
    VERIFIERS,
    Sim,
    commit_msg,
    h32,
    join,
    make_config,
    make_state,
    reveal_msg,
    verdict_msg,
)

PEOPLE = HOSTS + VERIFIERS[:3]
Action = tuple[str, int, int]

actions = st.lists(
    st.tuples(
        st.sampled_from(
            [
                "commit",
                "equivocate",
                "reveal",
                "bad_reveal",
                "verdict",
                "result",
                "report",
                "send",
                "join",
                "leave",
                "wait",
                "wait",
            ]
        ),
        st.integers(0, len(PEOPLE) - 1),
        st.integers(0, 3),
    ),
    min_size=1,
    max_size=60,
)


def _message(sim: Sim, kind: str, who: int, variant: int) -> object | None:
    step = queries.outer_step(sim.state, 1)["outer_step"]
    host = HOSTS[who % len(HOSTS)]
    base = queries.run(sim.state, 1)["global_model_hash"]
    if kind == "commit":
        return commit_msg(host, step=step, base=base)
    if kind == "equivocate":
        return commit_msg(host, step=step, base=base, salt=str(variant))
    if kind in ("reveal", "bad_reveal"):
        challenge = [c for c in queries.challenges(sim.state, 1)["challenges"] if c["host"] == host]
        segments = challenge[0]["segments"] if challenge else [1]
        return reveal_msg(sim, host, step=step, segments=segments, salt="bad" if kind == "bad_reveal" else "")
    if kind == "verdict":
        reason = Reason.ACCEPT if variant < 2 else Reason.REPLAY_MISMATCH
        return verdict_msg(VERIFIERS[variant % 3], host, reason, step=step)
    if kind == "result":
        return MsgSubmitOuterResult(
            creator=host, run_id=1, outer_step=step, model_hash=h32("g", step, variant % 2)
        )
    if kind == "report":
        others = [h for h in HOSTS[:3] if h != host][: variant % 2 + 1]
        return MsgReportUnavailable(creator=host, run_id=1, outer_step=step, hosts=others)
    if kind == "send":
        return MsgSend(from_address=PEOPLE[who], to_address=STRANGER, amount=[Coin(amount=variant * GNK)])
    if kind == "join":
        return join(Role.VERIFIER if who >= len(HOSTS) else Role.HOST, PEOPLE[who])
    if kind == "leave":
        return MsgLeaveRun(creator=PEOPLE[who], run_id=1)
    return None


def _play(script: list[Action]) -> tuple[Sim, Counter[tuple[int, str]]]:
    sim = Sim(make_state())
    config = make_config(verifiers_per_contribution=2, audit_bps=5000, phases={"max_escalations": 1})
    sim.ok(MsgCreateRun(creator=AUTH, config=config))
    sim.block(*[join(Role.HOST, h) for h in HOSTS[:3]], *[join(Role.VERIFIER, v) for v in VERIFIERS[:3]])
    supply = total_supply(sim.state)
    commits: Counter[tuple[int, str]] = Counter()
    for kind, who, variant in script:
        if kind == "wait":
            for _ in range(variant + 1):
                sim.block()
        else:
            msg = _message(sim, kind, who, variant)
            (result,) = sim.block(msg)
            if isinstance(result, list):
                for e in result:
                    if e.type == "commit":
                        commits[(int(e.attributes["outer_step"]), e.attributes["host"])] += 1
        assert total_supply(sim.state) == supply
        for run in sim.state.runs.values():
            assert all(p.stake >= 0 for p in run.participants.values())
            for step in run.steps.values():
                assert all(host == c.host for host, c in step.contributions.items())
        assert all(a.balance >= 0 for a in sim.state.accounts.values())
    assert all(n == 1 for n in commits.values())
    return sim, commits


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(actions)
def test_random_sequences_keep_the_invariants_and_replay_to_the_same_app_hash(script: list[Action]) -> None:
    first, _ = _play(script)
    second, _ = _play(script)
    assert first.height == second.height
    assert app_hash(first.state) == app_hash(second.state)
    ph = make_config().phases
    step = queries.outer_step(first.state, 1)
    bound = (
        ph.escalation_blocks * 1
        + 2
        + ph.audit_blocks
        + ph.confirm_blocks
        + ph.result_rounds * ph.result_blocks
    )
    last = max(step["verify_deadline"], first.height) + bound
    while queries.outer_step(first.state, 1)["outer_step"] == step["outer_step"] and first.height <= last:
        first.block()  # nobody sends anything any more
    assert queries.outer_step(first.state, 1, step["outer_step"])["phase"] == "DONE"
