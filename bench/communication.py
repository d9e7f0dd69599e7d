"""Communication: bytes per host per outer step for each codec vs data-parallel for the same H steps.

Data-parallel side (analytic): a ring all-reduce of fp32 gradients every step sends (and
receives) 2·(M−1)/M · 4 · params bytes per worker, H times. DiLoCo side (measured): the real zstd
blob of a real Δ = θ_0 − θ_H after H AdamW steps of one host, for every codec: a host uploads it
once per outer step (the headline ratio) and downloads the M−1 others' (the download ratio).
Also counted, because the protocol needs it: what a host serves its v verifiers per outer step
(s sampled start states as safetensors, plus the Δ blob again). Then the ratio at EQUAL final loss, from the
convergence runs: the DP bytes needed to reach our final validation loss / our bytes.

Run: `.venv/bin/python -m bench.communication [--quick]` (after `bench.convergence`, whose JSON
it reads for the equal-loss ratio) → bench/results/communication.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
from typing import Any

from bench.sim import RESULTS_DIR, Host, Setup, make_env, n_params, ring_allreduce_bytes, write_result
from nodekit.statestore import state_to_bytes
from protocol.codecs import encode, to_blob
from protocol.config import Codec
from replay.spec import build_model
from replay.step import configure_determinism, training_state
from trainer.commit import param_tensors

M = 8  # workers in the data-parallel ring (the DiLoCo paper's 8)
VERIFIERS = 1  # v, the protocol default


def codec_rows(setup: Setup) -> dict[str, Any]:
    """Train one host H steps from the initial model, then measure every codec's blob."""
    env = make_env(setup)
    g = param_tensors(build_model(setup.spec()))
    host = Host.new(env, env.hosts[0])
    c = host.contribute(env, 0, g, "0" * 64, None)
    p = n_params(g)
    dp = ring_allreduce_bytes(M, p, setup.inner_steps)
    state_bytes = len(state_to_bytes(training_state(host.model, host.opt)))
    rows = []
    for codec in Codec:
        blob = len(to_blob(encode(c.delta, codec, env.cfg.codec_block_size)))
        verification = VERIFIERS * (setup.sampled_segments * state_bytes + blob)
        rows.append({
            "codec": codec.value, "blob_bytes": blob, "dp_bytes": dp, "ratio": dp / blob,
            "ratio_download": dp / ((M - 1) * blob),
            "verification_bytes": verification, "ratio_with_verification": dp / (blob + verification),
        })  # fmt: skip
    return {
        "H": setup.inner_steps, "params": p, "hosts_in_ring": M, "state_bytes": state_bytes,
        "sampled_segments": setup.sampled_segments, "verifiers": VERIFIERS, "rows": rows,
    }  # fmt: skip


def dp_bytes_to_reach(curve: list[dict[str, Any]], target: float) -> float | None:
    """Bytes per worker when DP's validation loss first reaches `target` (linear between evals)."""
    for a, b in itertools.pairwise(curve):
        if b["val_loss"] <= target:
            drop = a["val_loss"] - b["val_loss"]
            frac = (a["val_loss"] - target) / drop if a["val_loss"] > target else 0.0
            return a["bytes_per_host"] + frac * (b["bytes_per_host"] - a["bytes_per_host"])
    return None


def equal_loss(setting: dict[str, Any]) -> dict[str, Any] | None:
    """The cheapest DP baseline's bytes to reach our final loss / our bytes.

    If no DP run reaches our loss with the same compute, the best DP run's whole traffic is a
    LOWER bound on what it would need, and the ratio is reported as such.
    """
    runs = {r["label"].split("/", 1)[1]: r for r in setting["runs"]}
    ours = runs.get("ours_int8_verified", {})
    dps = {k: r for k, r in runs.items() if k.startswith("data_parallel") and "curve" in r}
    if "curve" not in ours or not dps:
        return None
    target = ours["final_val_loss"]
    reached = {k: b for k, r in dps.items() if (b := dp_bytes_to_reach(r["curve"], target)) is not None}
    if reached:
        name = min(reached, key=lambda k: reached[k])
        dp_bytes = reached[name]
    else:
        name = min(dps, key=lambda k: dps[k]["final_val_loss"])
        dp_bytes = dps[name]["bytes_per_host"]
    st = setting["setup"]
    per_baseline = {
        k: (reached[k] if k in reached else dps[k]["bytes_per_host"]) / ours["bytes_per_host"] for k in dps
    }
    return {
        "H": st["inner_steps"], "hosts": st["hosts"], "outer_steps": st["outer_steps"],
        "warm_start": st.get("warm_start", 0), "ours_final_loss": target, "dp_baseline": name,
        "dp_final_loss": dps[name]["final_val_loss"],
        "ours_bytes": ours["bytes_per_host"], "dp_reached": bool(reached), "dp_bytes": dp_bytes,
        "ratio": dp_bytes / ours["bytes_per_host"], "ratio_per_baseline": per_baseline,
        "reached_per_baseline": {k: k in reached for k in dps},
    }  # fmt: skip


def main(quick: bool = False) -> dict[str, Any]:
    configure_determinism(1)
    hs = [500] if quick else [50, 500]
    tables = [codec_rows(Setup(hosts=M, inner_steps=h, segment_len=h // 10)) for h in hs]
    conv_path = RESULTS_DIR / "convergence.json"
    equal = []
    if conv_path.exists():
        conv = json.loads(conv_path.read_text())
        equal = [e for s in conv.get("settings", []) if (e := equal_loss(s)) is not None]
    result = {"quick": quick, "codec_tables": tables, "equal_loss": equal}
    for t in tables:
        print(f"\nH={t['H']}, {t['params']} params, DP ring of {M}: {t['rows'][0]['dp_bytes'] / 1e6:.1f} MB "
              f"per worker per H steps")  # fmt: skip
        print("| codec | Δ blob bytes | ratio vs DP | download ratio | + verification bytes "
              "| ratio incl. verif. |")
        print("|---|---|---|---|---|---|")
        for r in t["rows"]:
            print(f"| {r['codec']} | {r['blob_bytes']} | {r['ratio']:.0f}x | {r['ratio_download']:.0f}x "
                  f"| {r['verification_bytes']} | {r['ratio_with_verification']:.0f}x |")  # fmt: skip
    for e in equal:
        bound = "" if e["dp_reached"] else " (DP never reached it: lower bound)"
        print(f"equal loss, M={e['hosts']} H={e['H']} warm start {e['warm_start']}: "
              f"ours {e['ours_final_loss']:.4f} with "
              f"{e['ours_bytes'] / 1e6:.2f} MB/host; DP needs {e['dp_bytes'] / 1e6:.1f} MB "
              f"→ {e['ratio']:.0f}x{bound}")  # fmt: skip
    write_result("communication", result)
    return result


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    main(quick=ap.parse_args().quick)
