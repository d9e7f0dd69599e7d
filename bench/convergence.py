"""Convergence against the baselines: same model, same data, same total inner-step compute, seeded.

Contenders (one run, child processes two at a time):
  (a) synchronous data-parallel: M workers, gradients averaged every step (ring all-reduce), at
      the DiLoCo inner lr and at 4× that lr (its batch is M× larger: a better-tuned baseline);
  (b) ours: committed inner loop per host, every contribution replay-verified, int8 Δ blobs,
      `protocol.outer.outer_update` over the accepted Δs; also with fp32 Δs;
  (c) torchft's `DiLoCo` (gloo, in-process Lighthouse), same inner/outer optimizers and H;
  plus ours with another data seed: the seed-to-seed spread that "agree within noise" means.

Part two, the tuned comparison (`--only sweep`, → convergence_sweep.json): a Llama-style model
(`trainer.hf:llama`) on the token-shard path (Shakespeare's prepared byte manifest), both
contenders tuned with the SAME sweep of inner learning rates (DiLoCo also over two outer
lr/momentum pairs), warm-up and cosine decay as the DiLoCo paper, from scratch and from a
data-parallel warm start computed once; the best of each is reported, with the bytes each
needed to reach the best DiLoCo's final loss.

Part three, the sparse codec (`--only sparse`, → convergence_sparse.json; issue 26): the same
Llama path with M = 4 hosts, every contender over the same inner-lr sweep at equal compute, from
the same warm start: data-parallel, int8 DiLoCo (Nesterov), and the sparse codec (top-k 64 of
4096, 2-bit values) through each host's error-feedback accumulator, with either outer rule —
DiLoCo's Nesterov over the sparse mean, or SparseLoCo's plain average (momentum replaced by error
feedback; β = 1 and 0.95). In the quick run every DiLoCo contribution is replay-verified, the
sparse ones also rebuilt from the verifier's θ_H and the host's carried e (all accepted); the full
run skips verification, which changes no loss, to fit the 2 shared cores.

Part four, int8 AdamW moments (`--only moments`, → convergence_moments.json; issue 35): the same
run with float32 and with block-wise 8-bit moments (`InnerOptim.moments`, specs §6.2.1), two data
seeds each (the seed-to-seed spread is the noise floor), on the small GPT (M = 8, H = 50, T = 24)
and on Llama-tiny from a warm start (M = 4, H = 50, T = 12); the bar is a final loss within 1% of
float32's at the same seed. The quick run (M = 2, H = 10, T = 12) verifies every contribution.

Run: `.venv/bin/python -m bench.convergence [--quick] [--only compare|sweep|sparse|moments]`
→ bench/results/convergence.json, convergence_sweep.json, convergence_sparse.json,
convergence_moments.json.
"""

from __future__ import annotations

import argparse
import itertools
from typing import Any

from bench.sim import Setup, ring_allreduce_bytes, run_jobs, write_result

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
        {
            "label": f"{tag}/data_parallel_lr_x{DP_LR_SCALE}",
            "kind": "data_parallel",
            "setup": s,
            "lr_scale": DP_LR_SCALE,
        },
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


def main(quick: bool = False, only: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    if only in ("", "compare"):
        out["compare"] = compare(quick)
    if only in ("", "sweep"):
        out["sweep"] = sweep(quick)
    if only in ("", "sparse"):
        out["sparse"] = sparse(quick)
    if only in ("", "moments"):
        out["moments"] = moments(quick)
    return out


def compare(quick: bool = False) -> dict[str, Any]:
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


# ---------------------------------------------------------------- part two: tuned sweep, Llama


def sweep_plan(
    quick: bool, outer_steps: int | None = None, inner_lrs: list[float] | None = None
) -> dict[str, Any]:
    """The grid both contenders share, and the run shape (same total inner-step compute);
    `outer_steps` lengthens the full run (warm-up stays 5% of each host's steps)."""
    from replay.hf import spec_config

    if quick:
        shape = dict(hosts=4, inner_steps=10, outer_steps=6, segment_len=5, eval_batches=8, warmup_steps=6)
        plan = {"inner_lrs": [1e-3, 4e-3], "outers": [(0.7, 0.9)], "warm_start": 60, "verify": True}
    else:
        # Sized for 2 CPU cores shared by several engineers (≈ 20 CPU-minutes in all): M·H·T = 3,000
        # batches per contender; DiLoCo unverified here (the quick run and the tests show honest
        # contributions replay bitwise and are all accepted, so verification changes no loss).
        shape = dict(hosts=2, inner_steps=500, outer_steps=3, segment_len=50, warmup_steps=75, eval_batches=8)
        plan = {"inner_lrs": [2e-3, 5e-3], "outers": [(0.7, 0.9), (1.0, 0.9)], "warm_start": 500,
                "verify": False}  # fmt: skip
    if inner_lrs:
        plan["inner_lrs"] = inner_lrs
    if outer_steps is not None:
        steps = outer_steps * int(shape["inner_steps"])
        shape.update(outer_steps=outer_steps, warmup_steps=max(1, steps // 20))
    model = tuple(spec_config("llama", "tiny").items())
    plan["base"] = Setup(**shape, factory="trainer.hf:llama", model=model, cosine=True)  # type: ignore[arg-type]
    return plan


def sweep_jobs(plan: dict[str, Any], warm: str | None) -> list[dict[str, Any]]:
    """Every contender of one starting point: DP at each inner lr, DiLoCo at each (inner, outer)."""
    base = plan["base"].to_json()
    start = {"init_params": warm} if warm else {}
    tag = "warm" if warm else "scratch"
    jobs = [
        {"label": f"{tag}/dp_lr{lr:g}", "kind": "data_parallel", "setup": {**base, **start, "inner_lr": lr}}
        for lr in plan["inner_lrs"]
    ]
    for lr, (olr, mom) in itertools.product(plan["inner_lrs"], plan["outers"]):
        setup = {**base, **start, "inner_lr": lr, "outer_lr": olr, "outer_momentum": mom}
        label = f"{tag}/diloco_lr{lr:g}_outer{olr:g}_mu{mom:g}"
        jobs.append({"label": label, "kind": "diloco", "verify": plan["verify"], "setup": setup})
    return jobs


def sweep_row(r: dict[str, Any]) -> dict[str, Any]:
    """One contender's line: its hyper-parameters, final loss and traffic (or its error)."""
    setup, diloco = r["job"]["setup"], r["job"]["kind"] == "diloco"
    return {
        "label": r["label"].split("/", 1)[1], "kind": r["job"]["kind"], "inner_lr": setup["inner_lr"],
        "outer_lr": setup["outer_lr"] if diloco else None,
        "outer_momentum": setup["outer_momentum"] if diloco else None,
        "final_val_loss": r.get("final_val_loss"),
        "mb_per_host": r["bytes_per_host"] / 1e6 if "bytes_per_host" in r else None,
        "verdicts": r.get("verdicts"), "wall_s": r.get("wall_s"), "error": r.get("error", "")[-400:],
    }  # fmt: skip


def sweep_summary(plan: dict[str, Any], runs: list[dict[str, Any]], start: str) -> dict[str, Any]:
    from bench.communication import dp_bytes_to_reach

    ok = [r for r in runs if "final_val_loss" in r]
    dps = [r for r in ok if r["job"]["kind"] == "data_parallel"]
    dls = [r for r in ok if r["job"]["kind"] == "diloco"]
    rows = [sweep_row(r) for r in runs]
    out: dict[str, Any] = {"start": start, "setup": plan["base"].to_json(), "rows": rows, "runs": runs}
    if not dps or not dls:
        return out
    best_dp = min(dps, key=lambda r: r["final_val_loss"])
    best_dl = min(dls, key=lambda r: r["final_val_loss"])
    target = best_dl["final_val_loss"]
    reach = {r["label"]: b for r in dps if (b := dp_bytes_to_reach(r["curve"], target)) is not None}
    if reach:
        cheapest = min(reach, key=lambda k: reach[k])
        dp_bytes = reach[cheapest]
    else:  # no DP run gets there with the same compute: its whole traffic is a lower bound
        cheapest, dp_bytes = best_dp["label"], best_dp["bytes_per_host"]
    st = plan["base"]
    out["best"] = {
        "dp": best_dp["label"].split("/", 1)[1], "dp_loss": best_dp["final_val_loss"],
        "diloco": best_dl["label"].split("/", 1)[1], "diloco_loss": target,
        "diloco_le_dp": target <= best_dp["final_val_loss"],
        "equal_loss_dp_run": cheapest.split("/", 1)[1], "dp_reached": bool(reach),
        "dp_bytes_to_equal_loss": dp_bytes, "diloco_bytes": best_dl["bytes_per_host"],
        "ratio_at_equal_loss": dp_bytes / best_dl["bytes_per_host"],
        "ratio_same_steps": ring_allreduce_bytes(st.hosts, best_dp["params"], st.inner_steps * st.outer_steps)
        / best_dl["bytes_per_host"],
    }  # fmt: skip
    return out


def sweep(
    quick: bool = False,
    outer_steps: int | None = None,
    inner_lrs: list[float] | None = None,
    scratch: bool = True,
) -> dict[str, Any]:
    """Both starting points (or only the warm one: `scratch=False`), the best of each contender."""
    import tempfile

    plan = sweep_plan(quick, outer_steps, inner_lrs)
    name = "convergence_sweep" if outer_steps is None else f"convergence_sweep_T{outer_steps}"
    result: dict[str, Any] = {"quick": quick, "inner_lrs": plan["inner_lrs"], "outers": plan["outers"],
                              "warm_start": plan["warm_start"], "verify": plan["verify"],
                              "settings": []}  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        warm = f"{tmp}/warm.safetensors"
        pre = {**plan["base"].to_json(), "warm_start": plan["warm_start"]}
        print(f"  warm start: {plan['warm_start']} data-parallel steps, once, for every warm contender")
        pre_job = {"label": "pretrain", "kind": "pretrain", "setup": pre, "save_params": warm}
        # the warm start runs beside the first scratch contenders; results are written per setting
        if scratch:
            first = run_jobs([pre_job, *sweep_jobs(plan, None)], per_child=1)
            pretrained = first[0]
            result["settings"].append(sweep_summary(plan, first[1:], "scratch"))
            write_result(name, result)
            runs = run_jobs(sweep_jobs(plan, warm), per_child=1) if "error" not in pretrained else []
        else:  # the warm start first, alone, then every warm contender
            pretrained = run_jobs([pre_job])[0]
            runs = run_jobs(sweep_jobs(plan, warm), per_child=1) if "error" not in pretrained else []
        result["warm_start_loss"] = pretrained.get("final_val_loss")
        if runs:
            result["settings"].append(sweep_summary(plan, runs, "warm"))
    for s in result["settings"]:
        print(f"\n{s['start']}: Llama-tiny, M={s['setup']['hosts']} H={s['setup']['inner_steps']} "
              f"T={s['setup']['outer_steps']}, warm-up {s['setup']['warmup_steps']} + cosine")  # fmt: skip
        print("| contender | inner lr | outer lr/μ | final val loss | MB/host |\n|---|---|---|---|---|")
        for r in s["rows"]:
            outer = f"{r['outer_lr']:g}/{r['outer_momentum']:g}" if r["outer_lr"] is not None else "-"
            loss = f"{r['final_val_loss']:.4f}" if r["final_val_loss"] is not None else "error"
            mb = f"{r['mb_per_host']:.2f}" if r["mb_per_host"] is not None else ""
            print(f"| {r['label']} | {r['inner_lr']:g} | {outer} | {loss} | {mb} |")
        if "best" in s:
            b = s["best"]
            print(f"best DP {b['dp']} {b['dp_loss']:.4f}; best DiLoCo {b['diloco']} {b['diloco_loss']:.4f} "
                  f"(≤ DP: {b['diloco_le_dp']}); bytes to equal loss {b['ratio_at_equal_loss']:.0f}x"
                  + ("" if b["dp_reached"] else " (DP never reached it: lower bound)"))  # fmt: skip
    write_result(name, result)
    return result


# ---------------------------------------------------------------- part three: the sparse codec


_NESTEROV = {"outer_lr": 0.7, "outer_momentum": 0.9}
_AVERAGE = {"codec": "sparse", "outer_rule": "average", "outer_lr": 1.0}
SPARSE_CONTENDERS: dict[str, dict[str, Any]] = {
    "dp": {"kind": "data_parallel"},
    "int8_nesterov": {"kind": "diloco", "setup": {"codec": "int8", **_NESTEROV}},
    "sparse_nesterov": {"kind": "diloco", "setup": {"codec": "sparse", **_NESTEROV}},
    "sparse_average": {"kind": "diloco", "setup": _AVERAGE},
    "sparse_average_b0.95": {"kind": "diloco", "setup": {**_AVERAGE, "ef_decay": 0.95}},
    # the mean of M sparse Δs with (mostly) different supports moves a coordinate one host kept by
    # v/M while that host's accumulator drops all of v: larger outer lrs make up for it
    "sparse_average_lr2": {"kind": "diloco", "setup": {**_AVERAGE, "outer_lr": 2.0}},
    "sparse_average_lr4": {"kind": "diloco", "setup": {**_AVERAGE, "outer_lr": 4.0}},
    # denser: what it takes to reach int8's loss (`--sparse-contenders …k256 --sparse-name density`)
    **{f"sparse_average_lr2_k{k}": {"kind": "diloco", "setup": {**_AVERAGE, "outer_lr": 2.0, "codec_topk": k}}
       for k in (128, 256, 512, 1024)},
}
"""Contenders of the sparse comparison; each runs at every inner lr of the sweep."""

_SPARSE_KNOBS: dict[str, tuple[str, type]] = {
    "lr": ("outer_lr", float), "mu": ("outer_momentum", float), "k": ("codec_topk", int),
    "b": ("ef_decay", float), "C": ("codec_chunk", int),
}  # fmt: skip


def sparse_contender(name: str) -> dict[str, Any]:
    """A contender by name: one of `SPARSE_CONTENDERS`, or `sparse_<nesterov|average>` followed by
    `_`-separated knobs (issue 37): `contrib` (the mean over the hosts that kept a coordinate,
    `outer.sparse_mean`), `efreset` (no error feedback carried), `lr<x>` outer lr, `mu<x>` outer
    momentum, `k<n>` entries per chunk, `C<n>` chunk, `b<x>` β; e.g. `sparse_average_contrib_k128`."""
    if name in SPARSE_CONTENDERS:
        return SPARSE_CONTENDERS[name]
    parts = name.split("_")
    if parts[:1] != ["sparse"] or len(parts) < 2 or parts[1] not in ("nesterov", "average"):
        raise ValueError(f"unknown sparse contender {name!r}")
    setup: dict[str, Any] = dict(_AVERAGE if parts[1] == "average" else {"codec": "sparse", **_NESTEROV})
    for knob in parts[2:]:
        if knob == "contrib":
            setup["sparse_mean"] = "contributors"
        elif knob == "efreset":
            setup["ef_reset"] = True
        elif (key := knob.rstrip("0123456789.")) and key in _SPARSE_KNOBS and knob[len(key):]:
            field, kind = _SPARSE_KNOBS[key]
            setup[field] = kind(knob[len(key):])
        else:
            raise ValueError(f"unknown knob {knob!r} in sparse contender {name!r}")
    return {"kind": "diloco", "setup": setup}


def sparse_plan(quick: bool, shape_ht: tuple[int, int] | None = None) -> dict[str, Any]:
    """M = 4 hosts on Llama-tiny; full: H = 100, T = 6 (2,400 batch gradients per contender,
    sized for 2 shared cores), quick: H = 10, T = 6. `shape_ht` (H, T): another split of the same
    compute (e.g. H = 25, T = 24: SparseLoCo's regime of many short outer steps)."""
    from replay.hf import spec_config

    if quick:
        shape = dict(hosts=4, inner_steps=10, outer_steps=6, segment_len=5, eval_batches=8, warmup_steps=3)
        plan = {"inner_lrs": [2e-3, 5e-3], "warm_start": 60}
    else:
        shape = dict(hosts=4, inner_steps=100, outer_steps=6, segment_len=20, eval_batches=8, warmup_steps=30)
        plan = {"inner_lrs": [2e-3, 5e-3], "warm_start": 500}
    if shape_ht is not None:
        h, t = shape_ht
        shape.update(inner_steps=h, outer_steps=t, segment_len=5 if h % 5 == 0 else 1)
    model = tuple(spec_config("llama", "tiny").items())
    plan["base"] = Setup(**shape, factory="trainer.hf:llama", model=model, cosine=True,  # type: ignore[arg-type]
                         codec_chunk=4096, codec_topk=64)  # fmt: skip
    plan["verify"] = quick  # the full run unverified, as part two: honest work replays bitwise (quick)
    return plan


def sparse_jobs(plan: dict[str, Any], warm: str, only: list[str] | None = None) -> list[dict[str, Any]]:
    base = {**plan["base"].to_json(), "init_params": warm}
    jobs = []
    for lr in plan["inner_lrs"]:
        for name in only or list(SPARSE_CONTENDERS):
            c = sparse_contender(name)
            job: dict[str, Any] = {"label": f"{name}/lr{lr:g}", "kind": c["kind"],
                                   "setup": {**base, **c.get("setup", {}), "inner_lr": lr}}  # fmt: skip
            if c["kind"] == "diloco":
                job["verify"] = plan["verify"]
            jobs.append(job)
    return jobs


def sparse_summary(plan: dict[str, Any], runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Best inner lr per contender; bytes vs int8; bytes data-parallel needs to reach each loss."""
    from bench.communication import dp_bytes_to_reach

    rows = []
    for r in runs:
        name, lr = r["label"].split("/lr")
        rows.append({"contender": name, "inner_lr": float(lr), "final_val_loss": r.get("final_val_loss"),
                     "mb_per_host": r["bytes_per_host"] / 1e6 if "bytes_per_host" in r else None,
                     "verdicts": r.get("verdicts"), "wall_s": r.get("wall_s"),
                     "flushed": r.get("final_val_loss_flushed"),  # sparse: θ_T with every e applied
                     "error": r.get("error", "")[-400:]})  # fmt: skip
    ok = [r for r in runs if "final_val_loss" in r]
    best: dict[str, dict[str, Any]] = {}
    for r in ok:
        name = r["label"].split("/lr")[0]
        if name not in best or r["final_val_loss"] < best[name]["final_val_loss"]:
            best[name] = r
    dps = [r for r in ok if r["job"]["kind"] == "data_parallel"]
    out: dict[str, Any] = {"setup": plan["base"].to_json(), "inner_lrs": plan["inner_lrs"], "rows": rows,
                           "runs": runs, "best": {}}  # fmt: skip
    int8 = best.get("int8_nesterov")
    for name, r in best.items():
        entry: dict[str, Any] = {"label": r["label"], "final_val_loss": r["final_val_loss"],
                                 "bytes_per_host": r["bytes_per_host"]}  # fmt: skip
        if r["job"]["kind"] == "diloco":
            reach = [b for d in dps if (b := dp_bytes_to_reach(d["curve"], r["final_val_loss"])) is not None]
            entry["dp_reached"] = bool(reach)
            dp_bytes = min(reach) if reach else max((d["bytes_per_host"] for d in dps), default=None)
            entry["dp_bytes_to_equal_loss"] = dp_bytes
            entry["ratio_vs_dp_at_equal_loss"] = dp_bytes / r["bytes_per_host"] if dp_bytes else None
            if int8 is not None:
                entry["bytes_vs_int8"] = int8["bytes_per_host"] / r["bytes_per_host"]
                entry["loss_le_int8"] = r["final_val_loss"] <= int8["final_val_loss"]
                entry["loss_vs_int8"] = r["final_val_loss"] / int8["final_val_loss"]  # issue 37: ≤ 1.01
        out["best"][name] = entry
    return out


def sparse(
    quick: bool = False, shape_ht: tuple[int, int] | None = None, only: list[str] | None = None,
    suffix: str = "",
    inner_lrs: list[float] | None = None,
    workers: int = 2,
) -> dict[str, Any]:
    """The comparison of part three; the warm start is computed once, before the contenders.
    `shape_ht`, `only`: another (H, T) split of the same compute, some contenders only
    (→ convergence_sparse_H<H>_T<T>.json)."""
    import os
    import tempfile

    plan = sparse_plan(quick, shape_ht)
    if inner_lrs:
        plan["inner_lrs"] = inner_lrs
    result: dict[str, Any] = {"quick": quick, "load_before": os.getloadavg()}
    with tempfile.TemporaryDirectory() as tmp:
        warm = f"{tmp}/warm.safetensors"
        pre = {**plan["base"].to_json(), "warm_start": plan["warm_start"]}
        pre_job = {"label": "pretrain", "kind": "pretrain", "setup": pre, "save_params": warm}
        pretrained = run_jobs([pre_job])[0]
        result["warm_start_loss"] = pretrained.get("final_val_loss")
        jobs = sparse_jobs(plan, warm, only)
        runs = run_jobs(jobs, workers=workers, per_child=1) if "error" not in pretrained else []
    result["load_after"] = os.getloadavg()
    result["warm_start"] = plan["warm_start"]
    result["setting"] = sparse_summary(plan, runs)
    st = result["setting"]["setup"]
    print(f"\nsparse codec: Llama-tiny, M={st['hosts']} H={st['inner_steps']} T={st['outer_steps']}, "
          f"top-k {st['codec_topk']} of {st['codec_chunk']}")  # fmt: skip
    print("| contender | inner lr | final val loss | MB/host | verdicts |\n|---|---|---|---|---|")
    for r in result["setting"]["rows"]:
        loss = f"{r['final_val_loss']:.4f}" if r["final_val_loss"] is not None else "error"
        mb = f"{r['mb_per_host']:.4g}" if r["mb_per_host"] is not None else ""
        flushed = f" (flushed {r['flushed']:.4f})" if r.get("flushed") is not None else ""
        print(f"| {r['contender']} | {r['inner_lr']:g} | {loss}{flushed} | {mb} | {r['verdicts'] or ''} |")
    for name, b in result["setting"]["best"].items():
        extra = ""
        if "bytes_vs_int8" in b:
            extra = (f"; {b['bytes_vs_int8']:.1f}x fewer bytes than int8, loss {b['loss_vs_int8']:.4f}x "
                     f"int8's (≤ int8: {b['loss_le_int8']})")  # fmt: skip
        if b.get("ratio_vs_dp_at_equal_loss"):
            extra += (f"; DP needs {b['ratio_vs_dp_at_equal_loss']:.0f}x the bytes to reach it"
                      + ("" if b["dp_reached"] else " (never reached: lower bound)"))  # fmt: skip
        print(f"best {name}: {b['label']} {b['final_val_loss']:.4f}{extra}")
    name = "convergence_sparse" if shape_ht is None else f"convergence_sparse_H{shape_ht[0]}_T{shape_ht[1]}"
    name += f"_{suffix}" if suffix else ""
    write_result(name, result)
    return result


# ---------------------------------------------------------------- part four: int8 AdamW moments


MOMENT_FORMATS = ("fp32", "int8")
MOMENT_SEEDS = (0, 1)


def moments_settings(quick: bool) -> list[tuple[str, Setup, int, bool]]:
    """(name, setup, warm-start steps (0: none), verify) of each comparison."""
    if quick:
        return [("gpt", Setup(hosts=2, inner_steps=10, outer_steps=12, eval_batches=8), 0, True)]
    from replay.hf import spec_config

    llama = Setup(hosts=4, inner_steps=50, outer_steps=12, segment_len=5, eval_batches=8, warmup_steps=30,
                  factory="trainer.hf:llama", model=tuple(spec_config("llama", "tiny").items()),
                  inner_lr=2e-3, outer_lr=1.0, outer_momentum=0.9, cosine=True)  # fmt: skip
    # unverified, as parts two and three: the quick run and tests/test_moments.py show honest int8
    # contributions replay bitwise and are accepted; verification changes no loss
    return [("gpt", Setup(hosts=8, inner_steps=50, outer_steps=24), 0, False), ("llama", llama, 500, False)]


def moments_summary(setup: Setup, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Final losses per (format, seed); int8's relative gap to fp32 at the same seed, and the
    fp32 seed-to-seed gap (the noise floor)."""
    rows, loss = [], {}
    for r in runs:
        fmt, seed = r["job"]["setup"]["moments"], r["job"]["setup"]["seed"]
        rows.append({"moments": fmt, "seed": seed, "final_val_loss": r.get("final_val_loss"),
                     "verdicts": r.get("verdicts"), "wall_s": r.get("wall_s"),
                     "error": r.get("error", "")[-400:]})  # fmt: skip
        if "final_val_loss" in r:
            loss[(fmt, seed)] = r["final_val_loss"]
    out: dict[str, Any] = {"setup": setup.to_json(), "rows": rows}
    gaps = {s: abs(loss[("int8", s)] - loss[("fp32", s)]) / loss[("fp32", s)]
            for s in MOMENT_SEEDS if ("int8", s) in loss and ("fp32", s) in loss}  # fmt: skip
    if gaps:
        out["int8_vs_fp32_rel"] = {str(s): g for s, g in gaps.items()}
        out["max_rel_gap"] = max(gaps.values())
        out["within_1pct"] = max(gaps.values()) <= 0.01
    if all(("fp32", s) in loss for s in MOMENT_SEEDS):
        a, b = (loss[("fp32", s)] for s in MOMENT_SEEDS)
        out["fp32_seed_noise_rel"] = abs(a - b) / a
    return out


def moments(quick: bool = False) -> dict[str, Any]:
    """Part four: float32 vs int8 moments, two seeds each, per setting."""
    import os
    import tempfile

    result: dict[str, Any] = {"quick": quick, "load_before": os.getloadavg(), "settings": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for name, setup, warm, verify in moments_settings(quick):
            base = setup.to_json()
            if warm:
                path = f"{tmp}/{name}_warm.safetensors"
                pre = {"label": f"{name}/pretrain", "kind": "pretrain", "setup": {**base, "warm_start": warm},
                       "save_params": path}  # fmt: skip
                pretrained = run_jobs([pre])[0]
                if "error" in pretrained:
                    result["settings"][name] = {"error": pretrained["error"][-600:]}
                    continue
                base = {**base, "init_params": path}
            jobs = [{"label": f"{name}/{fmt}_seed{seed}", "kind": "diloco", "verify": verify,
                     "setup": {**base, "moments": fmt, "seed": seed}}
                    for seed in MOMENT_SEEDS for fmt in MOMENT_FORMATS]  # fmt: skip
            result["settings"][name] = moments_summary(setup, run_jobs(jobs, per_child=1))
            write_result("convergence_moments", result)
    result["load_after"] = os.getloadavg()
    for name, s in result["settings"].items():
        if "setup" not in s:
            print(f"\n{name}: error {s.get('error', '')[:200]}")
            continue
        st = s["setup"]
        print(f"\n{name}: M={st['hosts']} H={st['inner_steps']} T={st['outer_steps']}, "
              f"inner lr {st['inner_lr']:g}")  # fmt: skip
        print("| moments | seed | final val loss | verdicts |\n|---|---|---|---|")
        for r in s["rows"]:
            lf = f"{r['final_val_loss']:.4f}" if r["final_val_loss"] is not None else "error"
            print(f"| {r['moments']} | {r['seed']} | {lf} | {r['verdicts'] or ''} |")
        if "max_rel_gap" in s:
            noise = 100 * s.get("fp32_seed_noise_rel", float("nan"))
            print(f"int8 vs fp32 (same seed): max {100 * s['max_rel_gap']:.2f}% (within 1%: "
                  f"{s['within_1pct']}); fp32 seed-to-seed {noise:.2f}%")  # fmt: skip
    write_result("convergence_moments", result)
    return result


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", choices=["compare", "sweep", "sparse", "moments"], default="")
    ap.add_argument("--outer-steps", type=int, default=None, help="sweep only: a longer full run (T)")
    ap.add_argument("--inner-lrs", default="", help="sweep only: comma-separated inner lrs (both contenders)")
    ap.add_argument("--warm-only", action="store_true", help="sweep only: skip the from-scratch contenders")
    ap.add_argument("--sparse-shape", default="", help="sparse only: HxT, another split of the same compute")
    ap.add_argument("--sparse-contenders", default="", help="sparse only: comma-separated contender names")
    ap.add_argument("--sparse-name", default="", help="sparse only: a suffix of the results file")
    ap.add_argument("--workers", type=int, default=2, help="sparse only: child processes at a time")
    args = ap.parse_args()
    if args.sparse_shape or args.sparse_contenders:
        shape_ht = tuple(int(x) for x in args.sparse_shape.split("x")) if args.sparse_shape else None
        names = [x for x in args.sparse_contenders.split(",") if x] or None
        lrs = [float(x) for x in args.inner_lrs.split(",") if x] or None
        sparse(args.quick, shape_ht, names, args.sparse_name, lrs, args.workers)  # type: ignore[arg-type]
    elif args.outer_steps is not None or args.inner_lrs or args.warm_only:
        lrs = [float(x) for x in args.inner_lrs.split(",") if x]
        sweep(args.quick, args.outer_steps, lrs or None, scratch=not args.warm_only)
    else:
        main(quick=args.quick, only=args.only)
