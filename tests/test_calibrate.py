"""Tolerance calibration: honest replays in two processes, attack signals, and the proposal rule."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gonka_diloco.adversaries.lab import tiny_config
from gonka_diloco.verifier_cli import app
from protocol.config import InnerOptim, Moments, RunConfig
from verifier.calibrate import CONFIG_FIELDS, FLOOR, calibrate, propose, table, to_json
from verifier.tolerance import CUMULATIVE_CHECKS, TOLERANCE_CHECKS

CORPUS = "synthetic:40000:0"
FP32 = InnerOptim(moments=Moments.FP32)
"""Tolerance mode's moments: calibration is of float32 moments (the default, int8, is refused)."""


def test_proposal_takes_the_largest_k_whose_attacks_clear_factor_times_noise() -> None:
    ks = [1, 5, 10, 20]
    noise = [1e-6, 1e-4, 1e-3, 5e-3]
    skip = [1.0, 5e-2, 1e-2, 1e-2]
    swap = [1.0, 5e-2, 9e-3, 2e-2]
    p = propose(ks, noise, skip, swap, factor=8)
    assert [r.ok for r in p.rows] == [True, True, True, False]
    assert p.k == 10 and p.tolerance == pytest.approx(8e-3)
    assert propose(ks, noise, skip, swap, factor=10).k == 5  # 1e-2 no longer clears 10 × 1e-3
    none = propose([5], [1e-2], [1e-2], [1e-2])
    assert none.k is None and none.tolerance is None and "no k keeps" in table(none)
    exact = propose([5], [0.0], [1e-3], [1e-3])
    assert exact.rows[0].threshold == {"param": FLOOR} and exact.k == 5
    # no parameter noise seen while the moments differed: a floor that would reject honest hosts
    sporadic = propose([5], [{"param": 0.0, "exp_avg": 1e-8}], [{"param": 1e-3, "exp_avg": 1e-3}],
                       [{"param": 1e-3, "exp_avg": 1e-3}], noisy=[0.5])  # fmt: skip
    assert "warning: no honest noise seen in param at k = 5" in table(sporadic)
    assert "warning" not in table(propose([5], [0.0], [1e-3], [1e-3], noisy=[0.0]))  # bit-identical


def test_each_group_gets_its_own_threshold_and_an_attack_needs_to_clear_only_one() -> None:
    noise = {"param": 1e-4, "exp_avg": 1e-3, "exp_avg_sq": 1e-2}
    skip = {"param": 5e-4, "exp_avg": 2e-2, "exp_avg_sq": 1e-2}  # seen only in exp_avg
    swap = {"param": 1e-2, "exp_avg": 0.0, "exp_avg_sq": 0.0}  # seen only in the params
    p = propose([5], [noise], [skip], [swap], factor=8)
    assert p.k == 5 and p.tolerances == {g: 8 * v for g, v in noise.items()}
    want = {"tolerance": 8e-4, "tolerance_exp_avg": 8e-3, "tolerance_exp_avg_sq": 8e-2}
    assert p.run_config_fields() == want
    hidden = propose([5], [noise], [{**skip, "exp_avg": 1e-3}], [swap], factor=8)
    assert hidden.k is None and "no k keeps" in table(hidden)


def test_same_environment_in_two_processes_has_zero_noise() -> None:
    p = calibrate(tiny_config(inner=FP32), CORPUS, ks=(2, 4), threads=(1, 1), trials=1, warmup=2)
    for r in p.rows:  # bitwise across processes, every distance: the protocol's footing
        assert set(r.noise) == {*TOLERANCE_CHECKS, *CUMULATIVE_CHECKS} and set(r.noise.values()) == {0.0}
    assert [r.noisy for r in p.rows] == [0.0, 0.0]
    assert all(min(r.skip.values()) > 1e-3 and min(r.swap.values()) > 1e-3 for r in p.rows) and p.k == 4
    assert set(p.run_config_fields()) == set(CONFIG_FIELDS.values()) == {
        "tolerance", "tolerance_exp_avg", "tolerance_exp_avg_sq", "tolerance_update", "tolerance_denominator",
        "tolerance_cumulative", "tolerance_cumulative_update",
    }
    RunConfig(**{**tiny_config(inner=FP32).model_dump(), "replay_mode": "tolerance", **p.run_config_fields()})
    with pytest.raises(ValueError, match=r"tolerance calibration needs inner\.moments = 'fp32'"):
        calibrate(tiny_config(), CORPUS, ks=(2,), threads=(1, 1), trials=1, warmup=2)


def test_one_versus_two_threads_noise_is_far_below_the_attack_signals() -> None:
    p = calibrate(tiny_config(inner=FP32), CORPUS, ks=(1, 3), threads=(1, 2), trials=1, warmup=2)
    for r in p.rows:
        for g in TOLERANCE_CHECKS:
            assert r.noise[g] < 1e-3 < min(r.skip[g], r.swap[g]), (g, r)
        for g in CUMULATIVE_CHECKS:  # whole trajectories: no attack signal of their own
            assert r.noise[g] < 1e-3 and g not in r.skip
    assert math.isinf(p.rows[0].skip["param"])  # skipping the only step of k = 1 leaves the start state
    data = json.loads(json.dumps(to_json(p)))  # strict JSON: no Infinity
    assert data["rows"][0]["skip"]["param"] is None and data["k"] == 3
    assert set(data["run_config"]) == set(CONFIG_FIELDS.values())


def test_cli_lists_behaviours_and_refuses_a_bad_config(tmp_path: Path) -> None:
    runner = CliRunner()
    listed = runner.invoke(app, ["behaviours"])
    assert listed.exit_code == 0 and "malicious" in listed.output and "lazy(fraction=0.5" in listed.output
    bad = tmp_path / "verifier.toml"
    bad.write_text("run_id = 'x'\n")
    result = runner.invoke(app, ["run", "--config", str(bad)])
    assert result.exit_code == 2 and "run_id" in result.output
    typo = tmp_path / "typo.toml"
    typo.write_text('chain_url = "http://127.0.0.1:9"\nrun_id = 1\ndata_dir = "v"\nbehaviour = "lazzy"\n'
                    "[key]\ntest_index = 1\n")  # fmt: skip
    result = runner.invoke(app, ["run", "--config", str(typo)])
    assert result.exit_code == 2 and "unknown verifier behaviour 'lazzy'" in result.output
    assert runner.invoke(app, ["calibrate", "--ks", "a,b"]).exit_code == 2


def test_cumulative_noise_is_the_worst_summed_set_of_every_count() -> None:
    """Count-independent (specs §6.4): the largest over every set of two or more segments (one is
    its own per-segment check). Residuals that cancel in pairs score 0; one beside an exact segment
    scores its own ratio ÷ √2; three aligned ones √3 times it."""
    import torch

    from protocol.config import InnerOptim
    from verifier.calibrate import cumulative_noise, summed_sets

    def st(p: float, m: float) -> dict[str, torch.Tensor]:
        return {"param/w": torch.tensor([p, 1.0]), "exp_avg/w": torch.tensor([m, 0.5]),
                "exp_avg_sq/w": torch.tensor([0.25, 0.25]), "step": torch.tensor(3.0)}  # fmt: skip

    start, replay = st(0.0, 0.5), st(1.0, 0.5)
    up, down = st(1.0 + 2**-10, 0.5), st(1.0 - 2**-10, 0.5)
    inner = InnerOptim()
    both = cumulative_noise([(replay, up, start), (replay, down, start)], inner)
    assert both == {"cumulative": 0.0, "cumulative_update": 0.0}  # the pair cancels; singles not summed
    moved = 1 + 2**-10  # ‖up − start‖; ‖replay − start‖ = 1
    beside = cumulative_noise([(replay, up, start), (replay, replay, start)], inner)
    assert beside["cumulative"] == pytest.approx(2**-10 / math.sqrt(moved**2 + 1), rel=1e-6)
    aligned = cumulative_noise([(replay, up, start)] * 3, inner)
    assert aligned["cumulative"] == pytest.approx(math.sqrt(3) * 2**-10 / moved, rel=1e-6)
    assert cumulative_noise([(replay, up, start)], inner) == {"cumulative": 0.0, "cumulative_update": 0.0}
    sets = {tuple(int(i) for i in row.nonzero()) for rows in summed_sets(4) for row in rows}
    assert len(sets) == 2**4 - 1 - 4  # every set of two or more of 4: runs, drawn sets, all
    big = sum(len(rows) for rows in summed_sets(30))  # 30 segments: every run, then ≤ 1000 sets per count
    assert big == 29 * 30 // 2 + 2 * 435 + 30 + 25 * 1000  # C(30, m) ≤ 1000 only for m ∈ {2, 28, 29}


def test_summed_noise_from_the_runs_fewest_summed_segments() -> None:
    """Thresholds for sets of m₀ or more (`RunConfig.summed_least`): a residual pair beside an exact
    third segment scores √2·ρ/√2 over sets of two, but over sets of three only what the three sum
    to. Honest noise per √(Σ wᵢ²) falls with the count, so calibrating from the run's m₀ rather
    than from 2 is tighter and still holds for every set the run sums."""
    import torch

    from protocol.config import InnerOptim
    from verifier.calibrate import cumulative_noise, summed_sets

    def st(p: float) -> dict[str, torch.Tensor]:
        return {"param/w": torch.tensor([p, 1.0]), "exp_avg/w": torch.tensor([0.5, 0.5]),
                "exp_avg_sq/w": torch.tensor([0.25, 0.25]), "step": torch.tensor(3.0)}  # fmt: skip

    start, replay, up = st(0.0), st(1.0), st(1.0 + 2**-10)
    segs = [(replay, up, start), (replay, up, start), (replay, replay, start)]
    inner = InnerOptim()
    two, three = cumulative_noise(segs, inner, 2), cumulative_noise(segs, inner, 3)
    moved = 1 + 2**-10
    assert two["cumulative"] == pytest.approx(2 * 2**-10 / math.sqrt(2 * moved**2), rel=1e-6)  # the pair
    assert three["cumulative"] == pytest.approx(2 * 2**-10 / math.sqrt(2 * moved**2 + 1), rel=1e-6)
    assert three["cumulative"] < two["cumulative"]
    sizes = {int(row.sum()) for rows in summed_sets(5, 3) for row in rows}
    assert sizes == {3, 4, 5}


@pytest.mark.parametrize(
    ("fields", "least"),
    [
        ({"inner_steps": 50, "segment_len": 5}, 3),  # windows of 3: [0,3) [3,6) [6,9) and a lone [9]
        ({"inner_steps": 40, "segment_len": 5}, 2),  # 8 segments: the last block [6, 8) sums 2
        ({"inner_steps": 50, "segment_len": 5, "window_segments": 5}, 5),
        ({"inner_steps": 50, "segment_len": 5, "window_segments": 1}, 2),  # a panel's two windows
        ({"inner_steps": 50, "segment_len": 5, "sampling": "segments", "sampled_segments": 2}, 2),
        ({"inner_steps": 50, "segment_len": 5, "sampling": "segments", "sampled_segments": 4}, 3),
    ],
)
def test_run_config_names_the_fewest_segments_its_rule_sums(fields: dict[str, object], least: int) -> None:
    from tests.support.replay import tiny_cfg

    assert tiny_cfg(**fields).summed_least == least


@pytest.mark.parametrize(("h", "w", "lone"), [(50, 3, True), (45, 3, False), (15, 3, False), (25, 1, True)])
def test_a_lone_last_block_is_named_and_taken_on_by_the_window_before(h: int, w: int, lone: bool) -> None:
    """n mod w = 1 (n > w): the last block is segment n − 1 alone; a tolerance window ending there
    replays on into it (`Job.replays`, specs §6.4), a bitwise one does not need to."""
    from protocol.config import ReplayMode
    from tests.support.replay import tiny_cfg
    from verifier.job import Job

    cfg = tiny_cfg(inner_steps=h, segment_len=5, window_segments=w)
    assert cfg.lone_last is lone
    n = cfg.n_segments
    before = list(range(max(0, n - 1 - w), n - 1))  # the window ending where segment n − 1 begins
    tol = cfg.model_copy(update={"replay_mode": ReplayMode.TOLERANCE})
    for c, takes in ((cfg, False), (tol, lone)):
        job = Job.__new__(Job)
        object.__setattr__(job, "cfg", c)
        object.__setattr__(job, "window", tuple(before))
        object.__setattr__(job, "sampled", ())
        assert job.replays == ([*before, n - 1] if takes else before)


def test_a_whole_trajectorys_segments_count_as_honest_noise_samples() -> None:
    """The per-segment noise is sporadic (most segments replay bit-identically across thread
    counts): a calibration whose trials saw none proposed the floor and rejected 2 of 20 honest
    2-thread hosts (RESULTS §3; 0 of 20 with the trajectories' segments). The whole trajectories'
    segments are samples too: the largest of their per-segment distances, and how many differed."""
    import torch

    from protocol.config import InnerOptim
    from verifier.calibrate import segment_noise

    def st(p: float) -> dict[str, torch.Tensor]:
        return {"param/w": torch.tensor([p, 1.0]), "exp_avg/w": torch.tensor([0.5, 0.5]),
                "exp_avg_sq/w": torch.tensor([0.25, 0.25]), "step": torch.tensor(3.0)}  # fmt: skip

    start, replay = st(0.0), st(1.0)
    exact, off = (replay, replay, start), (replay, st(1.0 + 2**-12), start)
    worst, differed = segment_noise([exact, off, exact], InnerOptim())
    assert differed == 1 and worst["param"] == pytest.approx(2**-12 / (1 + 2**-12), rel=1e-6)
    assert segment_noise([exact, exact], InnerOptim()) == (dict.fromkeys(worst, 0.0), 0)


def test_cli_calibrates_the_tiny_model_for_the_runs_windows(tmp_path: Path) -> None:
    """`verifier calibrate --size tiny` runs (its sequences fit the tiny model's context) and
    records the fewest segments its summed thresholds hold for, from `--window-segments`."""
    out = tmp_path / "cal.json"
    args = ["calibrate", "--size", "tiny", "--ks", "2,4", "--trials", "1", "--window-segments", "2",
            "--out", str(out)]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["cumulative_least_segments"] == 2 and "proposal: segment_len" in result.output
