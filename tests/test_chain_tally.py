"""The result round's tallies kept beside an outer step (chain.module.vote_weights /
accepted_weight) always equal the definition recomputed from scratch, whatever the order of votes,
new rounds (a fresh `result_votes`), re-votes or changes of the accepted set."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from chain.module import accepted_weight, result_weight, vote_weights
from chain.state import Contribution, OuterStep

HOSTS = [f"h{i}" for i in range(6)]


def _step(tokens: list[int]) -> OuterStep:
    step = OuterStep(
        index=0, open_height=1, train_start=2, commit_deadline=3, reveal_deadline=4, verify_deadline=5,
        base_model_hash="00" * 32,
    )  # fmt: skip
    for host, t in zip(HOSTS, tokens, strict=True):
        step.contributions[host] = Contribution(
            host=host, height=2, tx_hash="", base_model_hash="", trajectory_root="", leaf_count=2,
            delta_hash="", final_optimizer_hash="", codec="int8", tokens=t, env={},
        )  # fmt: skip
    return step


def _naive(step: OuterStep) -> dict[str, int]:
    out: dict[str, int] = {}
    for model_hash in set(step.result_votes.values()):
        voters = [h for h, v in step.result_votes.items() if v == model_hash]
        out[model_hash] = result_weight(step, voters)
    return out


ACTIONS = st.lists(
    st.one_of(
        st.tuples(st.just("vote"), st.sampled_from(HOSTS), st.sampled_from(["a", "b", "c"])),
        st.tuples(st.just("round"), st.just(""), st.just("")),
        st.tuples(st.just("accept"), st.sampled_from(HOSTS), st.just("")),
    ),
    max_size=30,
)


Action = tuple[str, str, str]


@settings(max_examples=200, deadline=None)
@given(tokens=st.lists(st.integers(1, 10**6), min_size=6, max_size=6), actions=ACTIONS)
def test_the_kept_tallies_equal_the_definition(tokens: list[int], actions: list[Action]) -> None:
    step = _step(tokens)
    step.accepted = list(HOSTS)
    for kind, host, value in actions:
        if kind == "vote":
            step.result_votes[host] = value  # a re-vote overwrites in place
        elif kind == "round":
            step.result_votes = {}
        else:
            step.accepted = sorted(set(step.accepted) ^ {host})
        assert {k: v for k, v in vote_weights(step).items() if v} == _naive(step)
        assert accepted_weight(step) == result_weight(step, step.accepted)
