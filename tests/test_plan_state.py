"""The planner's state sizes (issue 35): an opened state on the wire is its canonical size for the
run's moment format ÷ the measured lossless ratio, read from bench.statecode's results."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gonka_diloco.plan import (
    Constants,
    Inputs,
    optimizer_wire_bytes,
    state_canonical_bytes,
    state_wire_bytes,
    states_by_kind,
)
from gonka_diloco.plan_constants import load_constants
from protocol.inner import Moments


def test_state_wire_bytes_by_hand() -> None:
    i = Inputs(params=30e9)
    c = Constants(state_code_ratio={"fp32": 1.25, "int8": 1.28})
    assert state_canonical_bytes(30e9, Moments.FP32) == 360e9
    assert state_canonical_bytes(30e9) == state_canonical_bytes(30e9, Moments.INT8) == 6.03125 * 30e9
    assert state_wire_bytes(i, c, Moments.FP32) == pytest.approx(360e9 / 1.25)
    assert state_wire_bytes(i, c) == pytest.approx(6.03125 * 30e9 / 1.28)  # RunConfig's default: int8
    assert state_wire_bytes(i, Constants(), Moments.FP32) == 360e9  # nothing measured: sent uncoded
    assert optimizer_wire_bytes(i, Moments.FP32) == 240e9 and optimizer_wire_bytes(i) == 2.03125 * 30e9


def test_ratios_come_from_statecode_results(tmp_path: Path) -> None:
    planner = {"fp32": {"ratio": 1.2, "encode_mb_s": 300, "decode_mb_s": 500},
               "int8": {"ratio": 1.3, "encode_mb_s": 250, "decode_mb_s": 600}}  # fmt: skip
    (tmp_path / "statecode.json").write_text(json.dumps({"quick": True, "planner": planner}))
    c = load_constants(tmp_path)
    assert c.state_code_ratio == {"fp32": 1.2, "int8": 1.3}
    assert c.state_code_speed == {"encode": 250e6, "decode": 500e6}
    assert "statecode.json (quick run" in c.sources["state_code"]
    (tmp_path / "statecode.json").write_text(json.dumps({"planner": {"fp32": {"ratio": "x"}}}))
    assert load_constants(tmp_path).state_code_ratio == Constants().state_code_ratio
    assert load_constants(tmp_path / "absent").sources["state_code"].startswith("default")


def test_theta_h_measurement_stays_out_of_the_planner(tmp_path: Path) -> None:
    """bench.statecode still measures θ_H's parameters alone (its planner's `theta_h`), but no check
    the planner counts fetches them any more (only the check that ends at θ_H checks Δ, specs §6):
    neither their ratio nor their speeds enter the constants, and bitwise checks fetch no θ_H."""
    planner = {"fp32": {"ratio": 1.2, "encode_mb_s": 300, "decode_mb_s": 500},
               "int8": {"ratio": 1.3, "encode_mb_s": 250, "decode_mb_s": 600},
               "theta_h": {"fp32": {"ratio": 1.1, "encode_mb_s": 200, "decode_mb_s": 700},
                           "int8": {"ratio": 1.15, "encode_mb_s": 400, "decode_mb_s": 450}}}  # fmt: skip
    (tmp_path / "statecode.full.json").write_text(json.dumps({"quick": False, "planner": planner}))
    c = load_constants(tmp_path)
    assert c.state_code_ratio == {"fp32": 1.2, "int8": 1.3}
    assert c.state_code_speed == {"encode": 250e6, "decode": 500e6}  # the whole states' alone
    assert not hasattr(c, "theta_h_code_ratio") and "theta_h_code" not in c.sources
    assert states_by_kind(Inputs(), c)["theta_h"] == 0.0
