"""Convergence against the baselines: same model, same data, same total inner-step compute, seeded.

Contenders (one run, child processes two at a time):
  (a) synchronous data-parallel: M workers, gradients averaged every step (ring all-reduce), at
      the DiLoCo inner lr and at 4× that lr (its batch is M× larger: a better-tuned baseline);
  (b) ours: committed inner loop per host, every contribution replay-verified, int8 Δ blobs,
      `protocol.outer.outer_update` over the accepted Δs; also with fp32 Δs;
  (c) torchft's `DiLoCo` (gloo, in-process Lighthouse), same inner/outer optimizers and H;
  plus ours with another data seed: the seed-to-seed spread that "agree within noise" means.

Run: `.venv/bin/python -m bench.convergence [--quick]` → bench/results/convergence.json.
"""

from __future__ import annotations

import argparse
from typing import Any

from bench.sim import Setup, run_jobs, write_result

DP_LR_SCALE = 4  # a second data-parallel baseline with a 4× inner lr for its M× larger batch


def settings(quick: bool) -> list[tuple[Setup, bool]]:
    """(setup, with torchft and the fp32/seed variants). Full adds an H = 500 run for the comm ratio."""
    if quick:
        return [(Setup(hosts=4, inner_steps=10, outer_steps=6, eval_batches=8), True)]
    return [
        (Setup(hosts=8, inner_steps=50, outer_steps=24), True),
        (Setup(hosts=8, inner_steps=500, outer_steps=4, segment_len=50), False),
        # as the DiLoCo paper does: start from a (data-parallel) checkpoint, not from random weights
        (Setup(hosts=8, inner_steps=500, outer_steps=4, segment_len=50, warm_start=1000), False),
    ]


def setting_tag(setup: Setup) -> str:
    warm = f"_warm{setup.warm_start}" if setup.warm_start else ""
    return f"M{setup.hosts}_H{setup.inner_steps}{warm}"


def jobs_for(setup: Setup, full_set: bool, tmp: str) -> list[dict[str, Any]]:
    s = setup.to_json()
    tag = setting_tag(setup)
    jobs: list[dict[str, Any]] = [
        {"label": f"{tag}/data_parallel", "kind": "data_parallel", "setup": s},
        {"label": f"{tag}/data_parallel_lr_x{DP_LR_SCALE}", "kind": "data_parallel", "setup": s,
         "lr_scale": DP_LR_SCALE},
        {"label": f"{tag}/ours_int8_verified", "kind": "diloco", "setup": s, "verify": True},
    ]
    if full_set:
        jobs += [
            {"label": f"{tag}/ours_fp32_verified", "kind": "diloco", "setup": {**s, "codec": "fp32"},
             "verify": True, "save_params": f"{tmp}/{tag}_ours_fp32.safetensors"},
            {"label": f"{tag}/torchft", "kind": "torchft", "setup": s,
             "save_params": f"{tmp}/{tag}_torchft.safetensors"},
            {"label": f"{tag}/ours_int8_seed1", "kind": "diloco", "setup": {**s, "seed": 1}, "verify": True},
        ]  # fmt: skip
    return jobs


def param_diff(a_path: str, b_path: str) -> dict[str, float]:
    """Max abs and relative L2 difference between two saved global models."""
    from safetensors.torch import load_file

    a, b = load_file(a_path), load_file(b_path)
    num = sum(float((a[n] - b[n]).double().square().sum()) for n in a)
    den = sum(float(b[n].double().square().sum()) for n in a)
    return {"max_abs": max(float((a[n] - b[n]).abs().max()) for n in a), "rel_l2": (num / den) ** 0.5}


def summarize(setup: Setup, runs: list[dict[str, Any]], tmp: str) -> dict[str, Any]:
    by = {r["label"].split("/", 1)[1]: r for r in runs}
    rows = []
    for name, r in by.items():
        if "error" in r:
            rows.append({"contender": name, "error": r["error"][-600:]})
            continue
        l0, lf = r["curve"][0]["val_loss"], r["final_val_loss"]
        mb = r["bytes_per_host"] / 1e6
        rows.append({
            "contender": name, "final_val_loss": lf, "mb_per_host": mb,
            "loss_drop_per_mb": (l0 - lf) / mb if mb else None, "wall_s": r.get("wall_s"),
            "verdicts": r.get("verdicts"), "replay_fraction": r.get("replay_fraction"),
        })  # fmt: skip
    out: dict[str, Any] = {"setup": setup.to_json(), "rows": rows, "runs": runs}
    tft, fp32, int8, seed1 = (by.get(k, {}) for k in ("torchft", "ours_fp32_verified", "ours_int8_verified",
                                                       "ours_int8_seed1"))  # fmt: skip
    if all("final_val_loss" in r for r in (tft, fp32, int8, seed1)):
        tag = setting_tag(setup)
        noise = abs(int8["final_val_loss"] - seed1["final_val_loss"])
        out["agreement"] = {
            "ours_fp32_vs_torchft_loss": abs(fp32["final_val_loss"] - tft["final_val_loss"]),
            "ours_int8_vs_torchft_loss": abs(int8["final_val_loss"] - tft["final_val_loss"]),
            "seed_noise_loss": noise,
            "ours_fp32_vs_torchft_params": param_diff(
                f"{tmp}/{tag}_ours_fp32.safetensors", f"{tmp}/{tag}_torchft.safetensors"
            ),
            "within_noise": abs(int8["final_val_loss"] - tft["final_val_loss"]) <= noise
            and abs(fp32["final_val_loss"] - tft["final_val_loss"]) <= noise,
        }
    return out


def main(quick: bool = False) -> dict[str, Any]:
    import tempfile

    result: dict[str, Any] = {"quick": quick, "settings": []}
    with tempfile.TemporaryDirectory() as tmp:
        plan = [(setup, full, jobs_for(setup, full, tmp)) for setup, full in settings(quick)]
        runs = run_jobs([j for _, _, jobs in plan for j in jobs])
        i = 0
        for setup, _, jobs in plan:
            result["settings"].append(summarize(setup, runs[i : i + len(jobs)], tmp))
            i += len(jobs)
    for s in result["settings"]:
        st = s["setup"]
        print(f"\nM={st['hosts']} H={st['inner_steps']} T={st['outer_steps']} (same inner-step compute)")
        print("| contender | final val loss | MB sent per host | loss drop per MB |")
        print("|---|---|---|---|")
        for r in s["rows"]:
            if "error" in r:
                print(f"| {r['contender']} | error: {r['error'][:80]} | | |")
                continue
            print(f"| {r['contender']} | {r['final_val_loss']:.4f} | {r['mb_per_host']:.2f} "
                  f"| {r['loss_drop_per_mb']:.4f} |")  # fmt: skip
        if "agreement" in s:
            a = s["agreement"]
            print(f"ours(fp32) vs torchft: |Δloss| {a['ours_fp32_vs_torchft_loss']:.2e}, params max abs diff "
                  f"{a['ours_fp32_vs_torchft_params']['max_abs']:.2e}; ours(int8) vs torchft |Δloss| "
                  f"{a['ours_int8_vs_torchft_loss']:.2e}; seed noise {a['seed_noise_loss']:.2e}; "
                  f"within noise: {a['within_noise']}")  # fmt: skip
    write_result("convergence", result)
    return result


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    main(quick=ap.parse_args().quick)
