"""bench.devnet_codec reads a devnet's snapshot.json and bench.report renders it (issue 26)."""

from __future__ import annotations

from typing import Any

from bench.devnet_codec import parse_cases, summarize
from bench.report import devnet_codec


def snapshot(codec: str, delta_bytes: int, reason: str) -> dict[str, Any]:
    def contrib(host: str, step: int, outcome: str, why: str) -> dict[str, Any]:
        reasons = [f"verifier-0: {why}", f"verifier-1: {why}"]
        return {
            "host": host,
            "outer_step": step,
            "outcome": outcome,
            "reasons": reasons,
            "delta_bytes": delta_bytes,
        }

    return {
        "config": {"codec": codec, "codec_topk": 64, "codec_block_size": 4096},
        "nodes": [
            {"name": "chain", "role": "chain", "behaviour": "honest"},
            {"name": "host-0", "role": "host", "behaviour": "honest"},
            {"name": "host-1", "role": "host", "behaviour": "ef_forge"},
        ],
        "steps": [
            {"index": 1, "phase": "DONE", "val_loss": 4.0},
            {"index": 0, "phase": "DONE", "val_loss": 5.0},
        ],
        "contributions": [contrib("host-0", s, "accepted", "ACCEPT") for s in (0, 1)]
        + [contrib("host-1", s, "rejected", reason) for s in (1, 0)],
        "wall_s": 100.0,
        "failures": [],
    }


def test_summary_counts_the_adversary_and_orders_the_loss_by_step() -> None:
    s = summarize(snapshot("sparse", 4424, "DELTA_MISMATCH"))
    assert (s["accepted"], s["rejected"], s["adversary_rejected"], s["adversary_total"]) == (2, 2, 2, 2)
    assert s["adversaries"] == {"host-1": "ef_forge"}
    assert s["val_loss"] == [5.0, 4.0]
    assert [o["outer_step"] for o in s["adversary_outcomes"]] == [0, 1]
    assert s["delta_bytes_per_host_step"]["median"] == 4424


def test_report_gives_the_bytes_ratio_and_the_verdicts() -> None:
    cases = [
        {"case": c, "passed": True, "wall_s": 110.0, **summarize(snapshot(*args))}
        for c, args in (
            ("int8:noise", ("int8", 8848, "DELTA_MISMATCH")),
            ("sparse:ef_forge", ("sparse", 4424, "DELTA_MISMATCH")),
        )
    ]
    text = "\n".join(devnet_codec({"cases": cases, "loadavg_before": "1", "loadavg_after": "2"}))
    assert "int8 ÷ sparse: **2.00×**" in text
    assert "steps 0–1: rejected (verifier-0 DELTA_MISMATCH, verifier-1 DELTA_MISMATCH)" in text
    assert "Every adversary contribution rejected: **yes**" in text and "fell in every run: **yes**" in text
    assert parse_cases("int8:noise, sparse:ef_forge:1@bench/x.toml") == [
        ("int8", "noise", ""), ("sparse", "ef_forge:1", "bench/x.toml")]
