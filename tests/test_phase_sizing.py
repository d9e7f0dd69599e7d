"""Phase sizing from measured compute (issue 16): the formula, `run create`'s flags, the devnet."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gonka_diloco.cli import app
from gonka_diloco.devnet_config import DEVNET_MARGIN, PhaseSeconds, load_config
from gonka_diloco.phase_sizing import (
    COMMIT_SLACK_BLOCKS,
    MEASURE_STEPS,
    MIN_MARGIN,
    PhaseSizingError,
    measure_step_seconds,
    noise_margin,
    overlapped_period_blocks,
    post_training_blocks,
    train_phase_blocks,
    train_phase_seconds,
)

RUN = """
name = "sizing-test"
inner_steps = 10
segment_len = 5
sampled_segments = 1
batch_size = 2
seq_len = 32
[model]
factory = "trainer.model:small_gpt"
config = { n_layer = 1, n_head = 2, n_embd = 16, block_size = 32 }
[phases]
join_blocks = 7
"""


def test_train_blocks_cover_the_work_with_margin_and_commit_slack() -> None:
    # 50 steps × 0.1 s × 1.5 = 7.5 s = 15 blocks of 0.5 s, + 2 to see the step open and commit
    assert train_phase_blocks(50, 0.1, 0.5) == 15 + COMMIT_SLACK_BLOCKS == 17
    assert train_phase_blocks(50, 0.1, 0.5, margin=1.0, slack_seconds=0.6, slack_blocks=0) == 12
    assert train_phase_blocks(500, 59.6, 5.0, margin=1.2) == math.ceil(500 * 59.6 * 1.2 / 5.0) + 2  # 30B
    assert train_phase_blocks(1, 1e-6, 5.0) == 1 + COMMIT_SLACK_BLOCKS  # never a zero-length phase
    assert train_phase_seconds(10, 2.0, margin=1.25, slack_seconds=1.0) == 26.0
    for bad in (
        lambda: train_phase_blocks(0, 0.1, 0.5),
        lambda: train_phase_blocks(10, 0.0, 0.5),
        lambda: train_phase_blocks(10, float("nan"), 0.5),
        lambda: train_phase_blocks(10, 0.1, 0.0),
        lambda: train_phase_blocks(10, 0.1, 0.5, margin=0.9),
        lambda: train_phase_blocks(10, 0.1, 0.5, slack_blocks=-1),
    ):
        with pytest.raises(PhaseSizingError):
            bad()


def _create(tmp_path: Path, *flags: str, text: str = RUN):
    path = tmp_path / "run.toml"
    path.write_text(text)
    return CliRunner().invoke(app, ["run", "create", str(path), "--dry-run", *flags])


def test_run_create_sizes_the_train_phase_from_a_declared_step_time(tmp_path: Path) -> None:
    plain = _create(tmp_path)
    sized = _create(tmp_path, "--step-seconds", "2.0", "--block-seconds", "5", "--margin", "1.25")
    assert plain.exit_code == 0 and sized.exit_code == 0, sized.output
    before, after = json.loads(plain.output), json.loads(sized.output)
    assert after["config"]["phases"]["train_blocks"] == 5 + COMMIT_SLACK_BLOCKS  # 10 × 2 × 1.25 / 5
    assert after["config"]["phases"]["join_blocks"] == 7  # the rest of the TOML stands
    assert after["phase_sizing"] == {"step_seconds": 2.0, "inner_steps": 10, "margin": 1.25,
                                     "block_seconds": 5.0, "train_blocks": 7, "measured": False}  # fmt: skip
    assert after["config_hash"] != before["config_hash"]  # the phase is part of what the run is bound to


def test_run_create_measure_times_the_runs_model(tmp_path: Path) -> None:
    result = _create(tmp_path, "--measure", "--block-seconds", "0.001")
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["phase_sizing"]["measured"] is True and out["phase_sizing"]["step_seconds"] > 0
    sizing = out["phase_sizing"]
    samples = sizing["samples"]  # the jitter measured: the margin covers it, and --margin at least
    assert len(samples) == MEASURE_STEPS
    assert sizing["step_seconds"] == pytest.approx(statistics.median(samples), abs=1e-6)
    assert sizing["margin"] == max(1.5, noise_margin(samples))  # the samples as measured, not rounded
    want = train_phase_blocks(10, sizing["step_seconds"], 0.001, margin=sizing["margin"])
    assert out["config"]["phases"]["train_blocks"] == want > COMMIT_SLACK_BLOCKS


@pytest.mark.parametrize(
    ("flags", "text", "message"),
    [
        (("--step-seconds", "1"), RUN + "train_blocks = 9\n", "give one of the two"),
        (("--step-seconds", "1", "--measure"), RUN, "not both"),
        (("--step-seconds", "-1"), RUN, "step seconds must be a positive number"),
        (("--step-seconds", "1", "--margin", "0.5"), RUN, "margin must be >= 1"),
        (("--measure",), RUN.replace("seq_len = 32", "seq_len = 64"), "exceeds the model's context 32"),
            (("--measure",), RUN.replace("batch_size = 2", "batch_size = 0"), "batch_size"),
    ],
)
def test_run_create_sizing_errors(tmp_path: Path, flags: tuple[str, ...], text: str, message: str) -> None:
    result = _create(tmp_path, *flags, text=text)
    assert result.exit_code == 2 and message in result.output, result.output
    assert "Traceback" not in result.output


def test_measure_step_seconds_is_positive_and_rejects_no_steps() -> None:
    from protocol.config import ModelSpec, RunConfig

    cfg = RunConfig(
        model=ModelSpec(factory="trainer.model:small_gpt", config={"n_layer": 1, "n_head": 2, "n_embd": 16,
                                                                     "block_size": 32}),
        dataset_manifest_hash="0" * 64, initial_model_hash="0" * 64, inner_steps=10, segment_len=5,
        sampled_segments=1, batch_size=2, seq_len=16,
    )  # fmt: skip
    assert 0 < measure_step_seconds(cfg, steps=2) < 5
    with pytest.raises(PhaseSizingError):
        measure_step_seconds(cfg, steps=0)


def test_devnet_sizes_train_from_compute_unless_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    calls: list[int] = []

    def fake_measure(cfg: object) -> list[float]:
        calls.append(1)
        return [0.04, 0.04, 0.04]

    # declared: 4 hosts + 2 verifiers on 2 cores run at a third of the speed:
    # 50 × 0.125 × 3 × DEVNET_MARGIN (2) + 2 blocks of 0.5 s
    declared = load_config(None, {"hosts": 4, "verifiers": 2, "step_seconds": 0.125}, measure=fake_measure)
    assert declared.phases.train == pytest.approx(37.5 + 1.0) and calls == []
    assert declared.blocks(declared.phases.train) == 77
    # measured when nothing is declared; one node per core: no contention; 50 × 0.04 × 2 + 1 = 5 s
    # is shorter than the default phase, which stays (only longer work lengthens it)
    measured = load_config(None, {"hosts": 1, "verifiers": 1, "adversaries": []}, measure=fake_measure)
    assert measured.phases.train == PhaseSeconds().train == 8.0 and calls == [1]
    longer = load_config(
        None, {"hosts": 1, "verifiers": 1, "adversaries": [], "inner_steps": 200}, measure=fake_measure
    )
    assert longer.phases.train == pytest.approx(200 * 0.04 * 2.0 + 1.0) and calls == [1, 1]
    # jittery timings (one step in four 3× slower): the margin is the measured noise, not the fixed 2
    jitter = load_config(None, {"hosts": 1, "verifiers": 1, "adversaries": [], "inner_steps": 200},
                         measure=lambda cfg: [0.04, 0.04, 0.04, 0.12])  # fmt: skip
    assert jitter.phases.train == pytest.approx(200 * 0.04 * noise_margin([0.04, 0.04, 0.04, 0.12]) + 1.0)
    assert noise_margin([0.04, 0.04, 0.04, 0.12]) > DEVNET_MARGIN
    # an explicit phases.train (flag or TOML) is never overridden, and nothing is measured
    explicit = load_config(None, {"phases": {"train": 8.0}}, measure=fake_measure)
    assert explicit.phases.train == 8.0 and calls == [1, 1]


def test_noise_margin_covers_the_slowest_sample_and_three_sigmas() -> None:
    # quiet: five equal timings measure no noise, the floor stays
    assert noise_margin([0.1] * 5) == MIN_MARGIN
    # one slow round out of six: the slowest sample ÷ median (1.5) is below median + 3σ (≈ 1.61)
    samples = [0.1, 0.1, 0.1, 0.1, 0.1, 0.15]
    assert noise_margin(samples) == pytest.approx(1 + 3 * 0.0204124 / 0.1, rel=1e-4)
    assert noise_margin(samples) >= max(samples) / 0.1
    # the slowest sample dominates when the spread is lopsided and σ small
    assert noise_margin([1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.3], sigmas=1.0) == pytest.approx(1.3)
    for bad in ([0.1], [], [0.1, 0.0], [0.1, float("nan")]):
        with pytest.raises(PhaseSizingError):
            noise_margin(bad)
    with pytest.raises(PhaseSizingError):
        noise_margin([0.1, 0.2], floor=0.9)


def test_overlapped_period_is_t_plus_one_only_while_post_training_fits() -> None:
    assert post_training_blocks(8, 29, 8) == 47  # the devnet's D measured by bench.overlap
    assert overlapped_period_blocks(43, 44) == 44.0  # D ≤ T + 1: hosts train all but one block
    assert overlapped_period_blocks(43, 47) == 45.5  # D > T + 1: every other step waits to open
    # 30B (bench.plan's setting): 500 steps × 59.6 s × 1.2 in 5 s blocks; D hours of verification
    t = train_phase_blocks(500, 59.6, 5.0, margin=1.2)
    assert overlapped_period_blocks(t, 4000) == t + 1 and overlapped_period_blocks(t, 2 * t) > t + 1
    for bad in (lambda: post_training_blocks(0, 1, 1), lambda: overlapped_period_blocks(0, 1)):
        with pytest.raises(PhaseSizingError):
            bad()
