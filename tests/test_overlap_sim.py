"""The eager schedule in the benchmark's simulation (issue 16): replay stays exact from the
eager start, rejected Δs never reach a global model, and the time model's arithmetic."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from bench.overlap_convergence import steps_to_reach, wall_seconds
from bench.sim import Setup, run_diloco
from replay.step import configure_determinism

TINY = Setup(
    hosts=3, inner_steps=2, outer_steps=3, segment_len=1, sampled_segments=2, batch_size=2, seq_len=16,
    eval_batches=1, model=(("n_layer", 1), ("n_head", 2), ("n_embd", 16), ("block_size", 64)),
)  # fmt: skip


def test_eager_schedule_replays_exactly_and_keeps_rejected_deltas_out() -> None:
    # host 2 forges a consistent sign-flipped Δ every step; verified against each host's eager
    # start, the honest hosts are accepted and the liar rejected every time, so every global
    # model is the honest-only run's, bit for bit.
    configure_determinism(1)  # what the benchmark's child processes run with (the env is checked)
    attacked = run_diloco(TINY, attack="sign_flip", adversaries=1, verify=True, eager=True)
    assert attacked["verdicts"].get("honest:ACCEPT") == 2 * TINY.outer_steps
    assert sum(v for k, v in attacked["verdicts"].items() if k.startswith("adversary")) == TINY.outer_steps
    assert "adversary:ACCEPT" not in attacked["verdicts"]
    honest_only = run_diloco(TINY, adversaries=1, exclude_adversaries=True, eager=True)
    assert attacked["final_global_hash"] == honest_only["final_global_hash"]
    assert [p["val_loss"] for p in attacked["curve"]] == [p["val_loss"] for p in honest_only["curve"]]
    # the schedule is really different from today's
    assert (
        honest_only["final_global_hash"]
        != run_diloco(TINY, adversaries=1, exclude_adversaries=True)["final_global_hash"]
    )


def test_time_model_arithmetic() -> None:
    curve = [{"outer_step": 0, "val_loss": 5.0}, {"outer_step": 1, "val_loss": 4.0},
             {"outer_step": 2, "val_loss": 3.0}]  # fmt: skip
    assert steps_to_reach(curve, 3.5) == pytest.approx(1.5)
    assert steps_to_reach(curve, 4.0) == 1.0 and steps_to_reach(curve, 2.0) is None
    # 10 steps of 2 s training + 18 s after: 200 s in a row; overlapped, 9 periods of 18 s + 20 s
    assert wall_seconds(10, 2.0, 18.0, overlapped=False) == 200.0
    assert wall_seconds(10, 2.0, 18.0, overlapped=True) == 9 * 18.0 + 20.0
    assert wall_seconds(10, 18.0, 18.0, overlapped=True) == pytest.approx(9 * 18 + 36)  # ≈ 2× faster
    assert wall_seconds(0, 2.0, 18.0, overlapped=True) == 0.0



def losses(run: dict[str, Any]) -> list[float]:
    return [p["val_loss"] for p in run["curve"]]


def test_mid_step_result_dial_spans_sequential_to_eager() -> None:
    # the research dial of bench §1d: moving by G_latest − start at inner step c·H is the sequential
    # schedule at c = 0 (the host trains from G_latest) and eager at c = 1 (the move lands after
    # training: Δ is measured from the eager start), up to float rounding of start + (G − start)
    configure_determinism(1)
    setup = dataclasses.replace(TINY, inner_steps=4)
    eager = {"eager": True}
    ends = {c: run_diloco(setup, **eager, correct_at=c) for c in (0.0, 0.5, 1.0)}
    assert losses(ends[0.0]) == pytest.approx(losses(run_diloco(setup)), rel=1e-4)
    assert losses(ends[1.0]) == pytest.approx(losses(run_diloco(setup, **eager)), rel=1e-4)
    assert losses(ends[0.5]) != pytest.approx(losses(ends[0.0]), rel=1e-4)
    assert losses(ends[0.5]) != pytest.approx(losses(ends[1.0]), rel=1e-4)


def test_dial_time_model_waits_for_the_previous_result() -> None:
    # the result is needed after c of the training: the host waits for what is left of it
    def wall(train: float, post: float, c: float) -> float:
        return wall_seconds(10, train, post, overlapped=True, c=c)

    assert wall(18.0, 18.0, 1.0) == wall_seconds(10, 18.0, 18.0, overlapped=True)
    assert wall(18.0, 18.0, 0.0) == pytest.approx(wall_seconds(10, 18.0, 18.0, overlapped=False))
    assert wall(20.0, 5.0, 0.25) == pytest.approx(9 * 20.0 + 25.0)  # 5 s fit in 5 s of training
    assert wall(20.0, 10.0, 0.25) == pytest.approx(9 * 25.0 + 30.0)  # 5 s of waiting per step
