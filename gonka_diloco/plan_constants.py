"""Machine constants for the cost model, read from the benchmarks' results where they exist.

`gonka-diloco plan` shows, next to each constant, the file it came from (or "default": the value
in `gonka_diloco.plan.Constants`), so an operator can tell a measurement from an assumption and
re-measure on their own machine with the command in `bench/RESULTS.md`.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gonka_diloco.plan import Constants

RESULTS = Path(__file__).resolve().parent.parent / "bench" / "results"
MAX_RESULT_BYTES = 16 << 20
SCALE_EFFICIENCY_KEYS = ("hash_efficiency", "hashing_ratio")
"""Where `bench.scale` reports parallel leaf hashing ÷ (cores × one core's SHA-256)
(`hashing_ratio` in results written before the key was aligned)."""


def _read(folder: Path, name: str) -> tuple[dict[str, Any], str] | None:
    """(the JSON, a source line) of the full run if there is one, else the latest run; None if absent
    or unreadable (a broken results file must not break the planner)."""
    for fname in (f"{name}.full.json", f"{name}.json"):
        path = folder / fname
        try:
            if not path.is_file() or path.stat().st_size > MAX_RESULT_BYTES:
                continue
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(data, dict):
            continue
        kind = "quick" if data.get("quick") else "full"
        when = datetime.fromtimestamp(path.stat().st_mtime, UTC).strftime("%Y-%m-%d")
        return data, f"bench/results/{fname} ({kind} run, {when})"
    return None


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, int | float) and not isinstance(x, bool) and x > 0 else None


def load_constants(folder: Path = RESULTS) -> Constants:
    """Constants from `folder`'s results, each falling back to its default with 'default' as source."""
    base = Constants()
    values: dict[str, Any] = {}
    sources = {
        "sha256_bytes_per_s": "default",
        "hash_efficiency": "default (the scale pipeline's goal; not yet measured)",
        "codec_ratio": "default",
        "codec_speed": "default",
        "codec_error": "default",
        "chain_ms_per_msg": "default",
        "state_code": "default (states sent uncoded)",
    }
    if (found := _read(folder, "hashing")) and (gbs := _num(found[0].get("hashlib_sha256_gb_s"))):
        values["sha256_bytes_per_s"] = gbs * 1e9
        sources["sha256_bytes_per_s"] = found[1]
    if found := _read(folder, "scale"):
        eff = next((_num(found[0].get(k)) for k in SCALE_EFFICIENCY_KEYS if _num(found[0].get(k))), None)
        if eff is not None:
            values["hash_efficiency"] = min(eff, 1.0)
            sources["hash_efficiency"] = found[1]
    if found := _read(folder, "codecs"):
        rows = {r.get("codec"): r for r in found[0].get("rows", []) if isinstance(r, dict)}
        ratio, enc, dec, err = (dict(base.codec_ratio), dict(base.codec_encode), dict(base.codec_decode),
                                dict(base.codec_error))  # fmt: skip
        seen = False
        for codec in ratio:
            r = rows.get(codec)
            if not r or _num(r.get("ratio_vs_fp32")) is None:
                continue
            seen = True
            ratio[codec] = float(r["ratio_vs_fp32"])
            enc[codec] = (_num(r.get("encode_mb_s")) or enc[codec] / 1e6) * 1e6
            dec[codec] = (_num(r.get("decode_mb_s")) or dec[codec] / 1e6) * 1e6
            if isinstance(r.get("rel_l2_error"), int | float):
                err[codec] = float(r["rel_l2_error"])
        if seen:
            values.update(codec_ratio=ratio, codec_encode=enc, codec_decode=dec, codec_error=err)
            for key in ("codec_ratio", "codec_speed", "codec_error"):
                sources[key] = found[1]
    if (found := _read(folder, "chain_sim")) and (ms := _num(found[0].get("module_ms_per_msg"))):
        values["chain_ms_per_msg"] = ms
        sources["chain_ms_per_msg"] = found[1]
    if (found := _read(folder, "statecode")) and isinstance(planner := found[0].get("planner"), dict):
        ratio = dict(base.state_code_ratio)
        speeds: dict[str, list[float]] = {"encode": [], "decode": []}
        for fmt in ratio:
            row = planner.get(fmt)
            if not isinstance(row, dict) or (measured := _num(row.get("ratio"))) is None:
                continue
            ratio[fmt] = measured
            for side, got in speeds.items():
                if (v := _num(row.get(f"{side}_mb_s"))) is not None:
                    got.append(v * 1e6)
        # its `theta_h` (θ_H's parameters alone) is not read: no check the planner counts fetches
        # them (only a dispute panel does, specs §6), so r_θ stays a measurement in the results
        if ratio != base.state_code_ratio:
            values["state_code_ratio"] = ratio
            sources["state_code"] = found[1]
        if slowest := {side: min(got) for side, got in speeds.items() if got}:
            values["state_code_speed"] = {**base.state_code_speed, **slowest}
    return Constants(**{**_defaults(base), **values, "sources": sources})


def _defaults(c: Constants) -> dict[str, Any]:
    return {k: getattr(c, k) for k in c.__dataclass_fields__ if k != "sources"}
