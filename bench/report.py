"""Collect bench/results/*.json into bench/RESULTS.md: one section per issue item, plots as PNG.

Every section names the command that reproduces it and says whether its figures come from a
`--quick` run. Results of modules this file does not know are rendered generically (scalars as a
key/value table, lists of records as tables), so a new benchmark shows up without code here.

Run: `.venv/bin/python -m bench.report` (the `python -m bench` runner calls it at the end).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"
OUT = Path(__file__).parent / "RESULTS.md"

Lines = list[str]


def fmt(v: Any) -> str:
    if isinstance(v, bool) or v is None:
        return str(v)
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) < 1e5 else f"{v:,.0f}"
    if isinstance(v, int):
        return f"{v:,}" if abs(v) >= 10_000 else str(v)
    if isinstance(v, list) and all(not isinstance(x, dict | list) for x in v):
        return ", ".join(fmt(x) for x in v)
    return str(v).replace("|", "/").replace("\n", " ")


def table(header: list[str], rows: list[list[Any]]) -> Lines:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(fmt(c) for c in r) + " |" for r in rows]
    return [*out, ""]


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


# ---------------------------------------------------------------- convergence


def convergence(d: dict[str, Any]) -> Lines:
    out: Lines = []
    plt = _plt()
    for s in d["settings"]:
        st = s["setup"]
        tag = f"M{st['hosts']}_H{st['inner_steps']}"
        tag += f"_warm{st['warm_start']}" if st.get("warm_start") else ""
        warm = f", after a {st['warm_start']}-step data-parallel warm start" if st.get("warm_start") else ""
        out.append(
            f"**M = {st['hosts']} hosts, H = {st['inner_steps']}, T = {st['outer_steps']} outer "
            f"steps{warm}** "
            f"(k = {st['segment_len']}, s = {st['sampled_segments']}, "
            f"batch {st['batch_size']}×{st['seq_len']}; "
            f"every contender does M·H·T = {st['hosts'] * st['inner_steps'] * st['outer_steps']:,} "
            "batch-gradient computations)"
        )
        out.append("")
        rows = []
        for r in s["rows"]:
            if "error" in r:
                rows.append([r["contender"], "error: " + r["error"][-200:], "", "", ""])
            else:
                rows.append([r["contender"], r["final_val_loss"], r["mb_per_host"], r["loss_drop_per_mb"],
                             _verdicts(r.get("verdicts"))])  # fmt: skip
        header = ["contender", "final val loss", "MB sent per host", "loss drop per MB", "verdicts"]
        out += table(header, rows)
        out += ["Bytes: data-parallel and torchft send 2·(M−1)/M·4·params per worker per all-reduce (and "
                "receive as much); ours counts the host's one Δ blob upload per outer step (it downloads the "
                "M−1 others' blobs; the communication section gives both ratios).", ""]  # fmt: skip
        if a := s.get("agreement"):
            p = a["ours_fp32_vs_torchft_params"]
            out += [
                f"- ours (fp32 Δ) vs torchft: |Δ final loss| = {a['ours_fp32_vs_torchft_loss']:.2e}, "
                f"global parameters max abs diff {p['max_abs']:.2e} (relative L2 {p['rel_l2']:.2e})",
                f"- ours (int8 Δ, the protocol default) vs torchft: |Δ final loss| = "
                f"{a['ours_int8_vs_torchft_loss']:.2e}",
                f"- noise (ours, data seed 0 vs 1): |Δ final loss| = {a['seed_noise_loss']:.2e} → "
                f"**agree within noise: {a['within_noise']}**",
                "",
            ]
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
        for run in s["runs"]:
            if "curve" not in run:
                continue
            name = run["label"].split("/", 1)[1]
            xs = [c["inner_steps"] for c in run["curve"]]
            ys = [c["val_loss"] for c in run["curve"]]
            ax1.plot(xs, ys, label=name, marker="." if len(xs) < 40 else None)
            bx = _cumulative_bytes(run)
            if bx is not None:
                ax2.plot(bx[1:], ys[1:], label=name, marker=".")
        ax1.set(xlabel="inner steps per host", ylabel="validation loss", title=f"convergence {tag}")
        ax2.set(xlabel="MB sent per host (log)", ylabel="validation loss", xscale="log")
        ax2.set_title("loss vs bytes")
        ax1.legend(fontsize=8)
        ax2.legend(fontsize=8)
        out += _save(plt, fig, f"convergence_{tag}{_kind(d)}.png", tag)
    return out


def _save(plt: Any, fig: Any, png: str, alt: str) -> Lines:
    """Write a figure into bench/results/ and link it from RESULTS.md."""
    fig.tight_layout()
    fig.savefig(RESULTS / png, dpi=90)
    plt.close(fig)
    return [f"![convergence {alt}](results/{png})", ""]


def _cumulative_bytes(run: dict[str, Any]) -> list[float] | None:
    """MB per host along the curve; runs with a constant cost per outer step may only give the total."""
    curve = run["curve"]
    if all("bytes_per_host" in c for c in curve):
        return [max(c["bytes_per_host"], 1) / 1e6 for c in curve]
    if "outer_step" in curve[-1] and curve[-1]["outer_step"] and "bytes_per_host" in run:
        per_step = run["bytes_per_host"] / curve[-1]["outer_step"]
        return [max(c["outer_step"] * per_step, 1) / 1e6 for c in curve]
    return None


def _verdicts(v: dict[str, int] | None) -> str:
    return ", ".join(f"{k} {n}" for k, n in sorted(v.items())) if v else ""


# ---------------------------------------------------------------- attack


def attack(d: dict[str, Any]) -> Lines:
    st = d["setup"]
    contenders = ["mean", "median", "trimmed_mean", "centered_clipping", "ours_verified"]
    out = [
        f"M = {st['hosts']} hosts of which {d['adversaries']} adversarial (25%), H = {st['inner_steps']}, "
        f"T = {st['outer_steps']}, k = {st['segment_len']}, s = {st['sampled_segments']}. Adversaries are "
        "consistent liars (their last leaf claims θ_H = G − Δ_bad). Final validation loss, and its gap to "
        f"the honest-only run (the 6 honest hosts alone: {d['honest_only']:.4f}; all 8 honest, no attack: "
        f"{d['all_honest']:.4f}). A negative gap means the attacked run ended LOWER than honest-only (e.g. "
        "a scaled honest Δ that survives a robust rule acts as a larger outer step).",
        "",
    ]
    rows = []
    for a, row in d["table"].items():
        cells = [f"{v['final_val_loss']:.4f} ({v['vs_honest_only_pct']:+.2f}%)" if "final_val_loss" in v
                 else "error" for v in (row[c] for c in contenders)]  # fmt: skip
        rows.append([a, *cells])
    out += table(["attack", "(d) mean", "(e) median", "(f) trimmed mean", "(g) centered clipping",
                  "(h) ours, verified"], rows)  # fmt: skip
    rows = []
    for a, row in d["table"].items():
        o = row["ours_verified"]
        if "verdicts" in o:
            same = o["same_model_as_honest_only"]
            rows.append([a, _verdicts(o["verdicts"]), same, o["verify_time_fraction"]])
    out += table(["attack", "verdicts (host kind: reason × outer steps)", "(h) model bitwise = honest-only",
                  "verification time / training time"], rows)  # fmt: skip
    plt = _plt()
    attacks = list(d["table"])
    fig, axes = plt.subplots(1, len(attacks), figsize=(4 * len(attacks), 3.6), sharey=True)
    by = {r["label"]: r for r in d["runs"]}
    for ax, a in zip(axes, attacks, strict=True):
        ref = by.get("reference/honest_only", {})
        if "curve" in ref:
            ax.plot([c["inner_steps"] for c in ref["curve"]], [c["val_loss"] for c in ref["curve"]],
                    "k--", label="honest only")  # fmt: skip
        for c in contenders:
            r = by.get(f"{a}/{c}", {})
            if "curve" in r:
                ax.plot([p["inner_steps"] for p in r["curve"]], [p["val_loss"] for p in r["curve"]], label=c)
        ax.set(title=a, xlabel="inner steps per host")
    axes[0].set_ylabel("validation loss")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    png = f"attack_curves{_kind(d)}.png"
    fig.savefig(RESULTS / png, dpi=90)
    plt.close(fig)
    return [*out, f"![loss curves under attack](results/{png})", ""]


def _kind(d: dict[str, Any]) -> str:
    return "_quick" if d.get("quick") else "_full"


# ---------------------------------------------------------------- communication


def communication(d: dict[str, Any]) -> Lines:
    out: Lines = []
    for t in d["codec_tables"]:
        out.append(
            f"**H = {t['H']}**, {t['params']:,} parameters; data-parallel ring of {t['hosts_in_ring']} moves "
            f"{t['rows'][0]['dp_bytes'] / 1e6:.1f} MB per worker over H steps. Verification adds, per "
            f"contribution and verifier (v = {t['verifiers']}), s = {t['sampled_segments']} start states of "
            f"{t['state_bytes']:,} bytes plus the Δ blob."
        )
        out.append("")
        out += table(
            ["codec", "Δ blob bytes (measured)", "ratio vs DP (upload)", "download: M−1 blobs",
             "verification bytes", "ratio incl. verification"],
            [[r["codec"], r["blob_bytes"], f"{r['ratio']:.0f}×", _ratio(r.get("ratio_download")),
              r["verification_bytes"], f"{r['ratio_with_verification']:.0f}×"] for r in t["rows"]],
        )  # fmt: skip
    if d["equal_loss"]:
        out.append("**At equal final loss** (from the convergence runs: bytes until the cheapest "
                   "data-parallel baseline's validation loss first reaches ours, int8 Δs):")  # fmt: skip
        out.append("")
        out += table(
            ["M", "H", "T", "warm start", "ours final loss", "DP baseline", "DP final loss", "ours MB/host",
             "DP MB/host to that loss", "ratio"],
            [[e["hosts"], e["H"], e["outer_steps"], e.get("warm_start", 0), e["ours_final_loss"],
              e.get("dp_baseline"),
              e["dp_final_loss"], e["ours_bytes"] / 1e6,
              e["dp_bytes"] / 1e6, f"{'≥ ' if not e['dp_reached'] else ''}{e['ratio']:.0f}×"]
             for e in d["equal_loss"]],
        )  # fmt: skip
        for e in d["equal_loss"]:
            per = e.get("ratio_per_baseline", {})
            reached = e.get("reached_per_baseline", {})
            if per:
                each = ", ".join(f"{k} {'' if reached.get(k, True) else '≥ '}{v:.0f}×"
                                 for k, v in per.items())  # fmt: skip
                warm = f", after a {e['warm_start']}-step warm start" if e.get("warm_start") else ""
                out.append(f"- M = {e['hosts']}, H = {e['H']}{warm}, against each DP baseline: {each}")
        out.append("")
        out.append("(≥: data-parallel never reached our loss within the same compute; its whole run is a "
                   "lower bound on the bytes it would need.)")  # fmt: skip
        out.append("")
    return out


def _ratio(x: float | None) -> str:
    return "" if x is None else f"{x:.0f}×"


# ---------------------------------------------------------------- cost model


def plan(d: dict[str, Any]) -> Lines:
    from bench.plan import markdown

    return markdown(d)
# ---------------------------------------------------------------- collusion


def collusion(d: dict[str, Any]) -> Lines:
    """P(fake reaches the model) and the cheater's profit per outer step, measured next to exact."""
    dd = d["defaults"]
    out = [
        f"{d['keys']} verifier keys of equal stake, {d['trials_per_cell']} seeded trials per cell on the "
        "state machine (`bench/collusion.py`), the coalition playing its best strategy; *exact* is "
        "`protocol.collusion.pass_probability_keys` / `expected_profit_keys`, *bound* the many-small-keys "
        "limit q^v (1 − p + p q^a). Profit is reward − slashes of the host and its accomplices, in units "
        "of the reward R, with the run defaults' bonds (min_host_stake = reward_per_outer_step). Sampling "
        "segments (H = 4, k = 2); the same under sampling windows is §5b'.",
        "",
    ]
    rows = [
        [r["v"], r["p"], r["a"], r.get("keys", d["keys"]), f"{100 * r['share']:.0f}%",
         f"{100 * r['passed']:.2f}%", f"{100 * r['pass_exact']:.2f}%",
         f"{100 * r['pass_bound_many_keys']:.2f}%",
         f"{r['profit_per_step_R']:+.3f}", f"{r['profit_exact_R']:+.3f}"]
        for r in d["rows"]
    ]  # fmt: skip
    head = ["v", "p", "a", "keys", "accomplice stake", "fake passed", "exact", "bound", "profit/R", "exact"]
    out += table(head, rows)
    for label, s in (("Previous defaults", d.get("previous_defaults")), ("Defaults", dd)):
        if s is None:
            continue
        line = (
            f"{label} v = {s['v']}, p = {s['p']}, a = {s['a']} ({s['replays_per_contribution']:g} replays "
            f"per contribution): fake in ≤ 1% of outer steps up to an accomplice share of "
            f"{100 * s['max_share_fake_below_1pct']:.1f}% (bound); expected profit negative at every share "
            f"up to 50%: {'yes' if s['profit_negative_at_all_shares'] else 'no'}."
        )
        if w := s.get("every_minority"):
            profit = max(w["profit_bound_max_R"], w["profit_exact_max_R"])
            line += (
                f" Over every minority q < 1/2: fake ≤ {100 * w['pass_bound_sup']:.2f}% (bound, its "
                f"supremum) and ≤ {100 * w['pass_exact_max']:.2f}% (exact, every split into ≤ "
                f"{w['max_keys']} equal keys), profit ≤ {profit:+.3f} R."
            )
        out += [line, ""]
    if alt := d.get("alternatives"):
        out += [
            "Other settings meeting both goals, by the formulas (the cheapest for each v, the smallest p in "
            "1% steps; v = 7 without audits): *overturned* is the chance that a coalition's unanimous ACCEPT "
            "at q → 1/2 is audited and caught, *max R/B* the largest reward per host bond at which faking "
            "still loses for every minority.",
            "",
        ]
        rows = [[x["v"], x["p"], x["a"], x["replays_per_contribution"], f"{100 * x['pass_bound_sup']:.2f}%",
                 f"{100 * x['pass_exact_max']:.2f}%", f"{100 * x['accept_overturned_at_half']:.1f}%",
                 f"{x['max_reward_per_host_bond']:.1f}"] for x in alt]  # fmt: skip
        out += table(["v", "p", "a", "replays", "worst bound", "worst exact", "overturned", "max R/B"], rows)
    return out


def _pct(x: float, digits: int = 2) -> str:
    return f"{100 * x:.{digits}f}%"


def _fake_delta_cells(r: dict[str, Any]) -> list[Any]:
    """A fake-Δ cell's settings, its measured pass rate, the exact one and the many-keys one."""
    return [r["v"], r["p"], r["a"], r["keys"], f"{100 * r['share']:.0f}%", _pct(r["passed"]),
            _pct(r["pass_exact"]), _pct(r["pass_bound_many_keys"])]  # fmt: skip


def collusion_windows(d: dict[str, Any]) -> Lines:
    """Issue 34: the fake-Δ table rerun under windows, then hosts faking segments, each cell next to
    its exact formula and the planner's many-keys one."""
    out = [
        f"Sampling windows at H = {d['H']}, k = {d['k']}, w = {d['w']}: n = {d['n_segments']} segments, "
        f"B = {d['blocks']} blocks, v + a = 7 slots each on its own block; {d['trials_per_cell']} seeded "
        "trials per cell on the state machine (100-key cells: half as many), equal-stake keys.",
        "",
    ]
    if d.get("fake_delta_rule") == "ends_at_theta_h":
        out += [
            "**A fake Δ.** Only the check that ends at θ_H (the last block's) checks Δ against it (specs "
            "§6): a host faking Δ commits a θ_H to match, which only the replay of segment n − 1 catches, "
            "so a fake Δ is a one-block fake of the last block. Honest slot holders of windows short of "
            "θ_H accept it (their windows replay clean; they fetch the Δ only to keep it), the last "
            "block's honest holder rejects it (DELTA_MISMATCH), and so do honest panel members and "
            "revotes (Δ first). Accomplices accept on their slots (a short window's ACCEPT answers no Δ "
            "question, so it is never contradicted) and in a dispute whenever the coalition does not "
            "lose. *exact* is `window_odds_keys(A, H, B, 1)`, *planner* the many-keys `window_cheat(B, "
            "1, …)`; *rejected*: a dispute rejected it (the host's plain slash: no accomplice is "
            "contradicted, so nobody pays a fraud slash). Every cell within 3 sd of *exact*: "
            f"**{'yes' if d['fake_delta_within_3_sd'] else 'no'}**.",
            "",
        ]
        rows = [
            [*_fake_delta_cells(r),
             f"{_pct(r['rejected'], 1)} ({_pct(r['rejected_exact'], 1)})",
             f"{_pct(r['unverified'], 1)} ({_pct(r['unverified_exact'], 1)})",
             f"{r['profit_per_step_R']:+.3f} ({r['profit_exact_R']:+.3f})"]
            for r in d["rows"]
        ]  # fmt: skip
        head = ["v", "p", "a", "keys", "accomplice stake", "fake passed", "exact", "planner",
                "rejected (exact)", "unverified (exact)", "profit/R (exact)"]  # fmt: skip
    else:  # results measured before the windows rule (7c32530): every check then checked Δ
        out += [
            "**A fake Δ**, as measured before only the check ending at θ_H checked Δ (then every checker "
            "checked Δ against θ_H whatever its window, so honest verifiers rejected it with "
            "DELTA_MISMATCH and the Δ question's voters were every verifier): the formula of §5b, "
            "*exact* `pass_probability_keys` = C(A, v)/C(N, v) · (1 − p + p·C(A − v, a)/C(N − v, a)), "
            "*bound* σ^v (1 − p + p σ^a). Every cell within 3 sd of *exact*: "
            f"**{'yes' if d['fake_delta_within_3_sd'] else 'no'}**.",
            "",
        ]
        rows = [
            [*_fake_delta_cells(r), f"{r['profit_per_step_R']:+.3f}", f"{r['profit_exact_R']:+.3f}"]
            for r in d["rows"]
        ]  # fmt: skip
        head = ["v", "p", "a", "keys", "accomplice stake", "fake passed", "exact", "bound", "profit/R",
                "exact"]  # fmt: skip
    out += table(head, rows)
    cells = d["windows"]
    c0 = cells[0]
    out += [
        f"**Faked segments** (v = {c0['v']}, p = {c0['p']}, a = {c0['a']}): `lazy` f = 0.5 (50 segments in "
        "17 whole blocks) and `one_fake` (1 segment, 1 block). Honest slot holders reject iff their window "
        "holds a faked segment, honest panel members reject the disputed windows, accomplices accept on "
        "their slots and on a panel whenever the coalition does not lose the segments vote. *exact* is "
        "`protocol.collusion.window_odds_keys` (finite equal-stake keys, draws without replacement, the "
        "dispute decided among its voters: specs §9), *planner* `gonka_diloco.plan.window_cheat` "
        "(each slot an accomplice with probability σ, every dispute lost below ½). *rejected*: a dispute "
        "rejected it (host slashed host_slash_bps); *unverified*: a tied dispute; *honest slashed*: honest "
        "verdicts slashed per outer step (every honest voter of a dispute the coalition won). Profit = "
        "reward − slashes of the host and its accomplices per outer step, in units of the reward R "
        "(an honest host earns +1.000; the compute a fake saves is not in it, the planner's `economics` "
        "prices it). Every cell within 3 sd of *exact*: "
        f"**{'yes' if d['windows_within_3_sd'] else 'no'}**.",
        "",
    ]
    rows = [
        [r["adversary"], f"{r['fake_blocks']}/{r['blocks']}", r["keys"], f"{100 * r['share']:.0f}%",
         _pct(r["passed"]), _pct(r["pass_exact"]), _pct(r["pass_planner"]),
         f"{_pct(r['rejected'], 1)} ({_pct(r['rejected_exact'], 1)})",
         f"{_pct(r['unverified'], 1)} ({_pct(r['unverified_exact'], 1)})",
         f"{r['honest_slashed']:.3f} ({r['honest_slashed_exact']:.3f})",
         f"{r['profit_per_step_R']:+.3f} ({r['profit_exact_R']:+.3f})"]
        for r in cells
    ]  # fmt: skip
    head = ["host", "fake blocks", "keys", "accomplice stake", "fake passed", "exact", "planner",
            "rejected (exact)", "unverified (exact)", "honest slashed (exact)",
            "profit/R (exact)"]  # fmt: skip
    out += table(head, rows)
    minority = [r for r in cells if r["share"] < 0.5]
    gap = max(minority, key=lambda r: r["pass_exact"] - r["pass_planner"])
    won = [r for r in minority if r["honest_slashed_exact"] > 0]
    out += [
        f"Below ½ of the stake the exact odds exceed the planner's by at most "
        f"{100 * (gap['pass_exact'] - gap['pass_planner']):.2f} points ({gap['adversary']}, "
        f"{gap['keys']} keys, {100 * gap['share']:.0f}%); a minority wins a dispute (honest verdicts "
        f"slashed) in {len(won)} of {len(minority)} such cells.",
        "",
    ]
    return out


def detection_windows(d: dict[str, Any]) -> Lines:
    """Issue 34: every host adversary per outer step under windows; one_fake and lazy vs the planner."""
    c = d["detection_config"]
    out = [
        f"Tiny GPT, H = {c['H']}, k = {c['k']}, w = {c['w']} (B = {c['blocks']} blocks), v = {c['v']}, "
        f"p = {c['p']}, a = {c['a']}: per trial a fresh challenge draws the slots' windows, each drawn "
        "block's checker replays its window with `verifier.verify`; only the check whose window ends "
        "at θ_H checks Δ against it (specs §6), so a fake Δ with an honest θ_H — noise, scaled, "
        "sign_flip — is rejected by one check in four here (every block is drawn: v + a ≥ B) and, at "
        "the chain's defaults (B = 34), caught like a one-block fake (`one_fake` below); the outer "
        "step is caught when an initial slot rejects or, audited, an audit slot does (specs §2.5). *checks "
        "rejecting*: the share of those checks that rejected; *right reason*: the share of outer steps "
        "whose outcome (the first reject's reason, or ACCEPT) is the expected one. The segments-era table "
        "is §5.",
        "",
    ]
    rows = [
        [r["behaviour"], r["trials"], _pct(r["rejected"], 0), _pct(r["right_reason"], 0),
         "n/a" if r.get("checks_rejecting") is None else _pct(r["checks_rejecting"], 0),
         ", ".join(r["expected"]), ", ".join(f"{k} {v}" for k, v in sorted(r["reasons"].items()))]
        for r in d["adversaries"]
    ]  # fmt: skip
    out += table(["behaviour", "trials", "caught per outer step", "right reason", "checks rejecting",
                  "expected", "verdicts seen (checks)"], rows)  # fmt: skip
    sc = d["sweep_config"]
    out += [
        "**Detection per outer step vs the planner** (`gonka_diloco.plan.lazy_detection` / "
        f"`one_segment_detection`, split by `lazy_cheat`): {sc['seeds']} hosts per adversary, every "
        f"block's window replayed once per host, then {sc['challenges_per_host']} challenges per host "
        "judged by the chain's rule over their drawn slots (bitwise: a window's verdict does not depend on "
        f"the challenge; {sc['spot_checks_per_host']} challenges per host re-verified end to end).",
        "",
    ]
    rows = [
        [r["behaviour"], r["H"], r["k"], r["w"], r["blocks"], r["faked_segments"],
         ", ".join(map(str, r["blocks_rejected"])), r["trials"], _pct(r["detected"], 1),
         _pct(r["predicted"], 1),
         f"{_pct(r['detected_initial'], 1)} ({_pct(r['predicted_initial'], 1)})",
         f"{_pct(r['detected_audit'], 1)} ({_pct(r['predicted_audit'], 1)})",
         f"{r['spot_checks_agree']}/{r['spot_checks']}"]
        for r in d["sweep"]
    ]  # fmt: skip
    head = ["host", "H", "k", "w", "B", "faked segments", "blocks rejected", "outer steps", "caught",
            "planner", "initial slots (planner)", "audit (planner)", "spot checks agree"]  # fmt: skip
    out += table(head, rows)
    return out


# ---------------------------------------------------------------- everything else


def generic(d: Any) -> Lines:
    if not isinstance(d, dict):
        return [f"`{fmt(d)}`", ""]
    scalars = [[k, v] for k, v in d.items() if not isinstance(v, dict | list) or _flat_list(v)]
    out = table(["figure", "value"], scalars) if scalars else []
    for k, v in d.items():
        if isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            cols = [c for c in dict.fromkeys(c for x in v for c in x) if all(_cell_ok(x.get(c)) for x in v)]
            out += [f"*{k}*", "", *table(cols, [[x.get(c) for c in cols] for x in v])]
        elif isinstance(v, dict) and v and all(_cell_ok(x) for x in v.values()):
            out += [f"*{k}*", "", *table(["key", "value"], [[a, b] for a, b in v.items()])]
    return out


def convergence_sweep(d: dict[str, Any]) -> Lines:
    """Part two of bench.convergence: both tuned with one sweep; the best of each; bytes to equal loss."""
    plt = _plt()
    outers = ", ".join(f"{lr:g}/{mu:g}" for lr, mu in d["outers"])
    out: Lines = [
        f"Llama-style model (`trainer.hf:llama`, preset tiny) on Shakespeare's prepared byte-token manifest "
        f"(the token-shard path). Both contenders get the same inner-lr sweep {fmt(d['inner_lrs'])}, "
        f"DiLoCo also outer lr/momentum {outers}; linear warm-up then cosine decay to 10% (the DiLoCo "
        f"paper's inner schedule), over the same total inner-step compute. DiLoCo is the protocol path: "
        f"committed inner loop, int8 Δ blobs, "
        + ("every contribution replay-verified (s = 2)" if d.get("verify", True) else
           "not replay-verified in this run (honest contributions replay bitwise: see the quick run)")
        + ". The warm start "
        f"is {d['warm_start']} data-parallel steps at lr 4e-4 (val loss {fmt(d.get('warm_start_loss'))}), "
        f"computed once and loaded by every warm contender.",
        "",
    ]
    if d.get("rerun_note"):
        out += [f"Note: {d['rerun_note']}.", ""]
    for s in d["settings"]:
        st = s["setup"]
        start = f"from a {d['warm_start']}-step warm start" if s["start"] == "warm" else "from scratch"
        out += [f"**{start}: M = {st['hosts']} hosts, H = {st['inner_steps']}, T = {st['outer_steps']}** "
                f"(warm-up {st['warmup_steps']} steps, batch {st['batch_size']}×{st['seq_len']}; every "
                f"contender does M·H·T = {st['hosts'] * st['inner_steps'] * st['outer_steps']:,} "
                "batch-gradient computations)", ""]  # fmt: skip
        rows = []
        for r in s["rows"]:
            outer = f"{r['outer_lr']:g} / {r['outer_momentum']:g}" if r["outer_lr"] is not None else "-"
            v = r.get("verdicts") or {}
            loss = r["final_val_loss"] if r["final_val_loss"] is not None else f"error: {r['error'][-80:]}"
            kind = "DiLoCo" if r["kind"] == "diloco" else "data-parallel"
            verdicts = ", ".join(f"{k} {n}" for k, n in v.items())
            rows.append([r["label"], kind, r["inner_lr"], outer, loss, r["mb_per_host"], verdicts])
        out += table(["contender", "kind", "inner lr", "outer lr / μ", "final val loss", "MB sent per host",
                      "verdicts"], rows)  # fmt: skip
        if b := s.get("best"):
            bound = "" if b["dp_reached"] else " (no DP run reached it: lower bound)"
            out += [f"- best data-parallel: {b['dp']} → {b['dp_loss']:.4f}; best DiLoCo: {b['diloco']} → "
                    f"{b['diloco_loss']:.4f} (DiLoCo ≤ DP: **{b['diloco_le_dp']}**)",
                    f"- bytes to reach {b['diloco_loss']:.4f}: data-parallel ({b['equal_loss_dp_run']}) "
                    f"{b['dp_bytes_to_equal_loss'] / 1e6:,.1f} MB per worker, DiLoCo "
                    f"{b['diloco_bytes'] / 1e6:.2f} MB per host → "
                    f"**{b['ratio_at_equal_loss']:,.0f}×**{bound}; "
                    f"at the same steps {b['ratio_same_steps']:,.0f}×", ""]  # fmt: skip
        runs = {r["label"].split("/", 1)[1]: r for r in s["runs"] if "curve" in r}
        if runs and (b := s.get("best")):
            fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
            for name, r in runs.items():
                best = name in (b["dp"], b["diloco"])
                style = "-" if r["job"]["kind"] == "diloco" else "--"
                xs = [c["inner_steps"] for c in r["curve"]]
                ys = [c["val_loss"] for c in r["curve"]]
                kw = {"linewidth": 2 if best else 0.8, "alpha": 1 if best else 0.45, "label": name}
                ax1.plot(xs, ys, style, **kw)
                ax2.plot([max(c["bytes_per_host"], 1) / 1e6 for c in r["curve"]], ys, style, **kw)
            ax1.set(xlabel="inner steps per host (equal compute)", ylabel="validation loss",
                    title=f"tuned, {s['start']}")  # fmt: skip
            ax2.set(xlabel="MB sent per host (log)", ylabel="validation loss", xscale="log",
                    title="loss vs bytes")  # fmt: skip
            for ax in (ax1, ax2):
                ax.grid(alpha=0.3)
            ax1.legend(fontsize=6)
            png = f"convergence_sweep_{s['start']}_T{st['outer_steps']}{_kind(d)}.png"
            out += _save(plt, fig, png, f"tuned {s['start']}")
    return out


def _flat_list(v: Any) -> bool:
    return isinstance(v, list) and all(not isinstance(x, dict | list) for x in v)


def _cell_ok(v: Any) -> bool:
    return not isinstance(v, dict | list) or _flat_list(v)


def gpu_check(d: dict[str, Any]) -> Lines:
    """bench/gpu_check.py: one sub-table per section, headed by the GPU and the date it ran."""
    env = d.get("env", {})
    size = "tiny" if d.get("tiny") else "full"
    cls = str(d.get("replay_class", ""))[:16]
    out = [f"Ran {d.get('date')} on **{d.get('gpu')}** ({d.get('device')}), "
           f"torch {env.get('torch_version')}, CUDA {env.get('cuda_version') or '-'}, replay class `{cls}`, "
           f"{size} sizes, {d.get('elapsed_s')} s.", ""]  # fmt: skip
    for name in ("replay", "throughput", "noise", "sharded"):
        if name in d:
            out += [f"**{name}**", "", *generic(d[name])]
    return out


def overlap(d: dict[str, Any]) -> Lines:
    from bench.overlap import render

    return render(d)


def scale(d: dict[str, Any]) -> Lines:
    from bench.scale import render

    return [*render(d), "", *generic({k: v for k, v in d.items() if k in ("per_step", "rss", "hashing")})]


# ---------------------------------------------------------------- overlap (issue 16)


def overlap_detection(d: dict[str, Any]) -> Lines:
    """Detection and false rejection per attack, sequential vs eager."""
    st = d["setup"]
    out = [
        f"M = {st['hosts']} hosts, H = {st['inner_steps']}, T = {st['outer_steps']}; the last "
        f"{d['adversaries']} are consistent liars (their last leaf claims θ_H = start − Δ_bad); every "
        "contribution replay-verified against the start it trained from (eager: its own previous Δ "
        f"moved it, §2.2.1). Detection 100% and no false rejection in both schedules: "
        f"**{'yes' if d['unchanged'] else 'NO'}**.",
        "",
    ]
    rows = [[r["attack"], r["schedule"], f"{r['adversary_rejected']} / {r['adversary_contributions']}",
             f"{r['honest_not_accepted']} / {r['honest_contributions']}", r["parent_not_accepted"],
             r["final_val_loss"]] if "error" not in r else [r["attack"], r["schedule"], "error", "", "", ""]
            for r in d["rows"]]  # fmt: skip
    return out + table(["attack", "schedule", "liars rejected", "honest not accepted", "parent rule drops",
                        "final val loss"], rows)  # fmt: skip


def steering(d: dict[str, Any]) -> Lines:
    """Bounded-budget steering of tolerance mode (issue 23): old checks, the per-segment checks of specs
    §6, and every check (the opened segments' summed residuals of §6.4 too)."""
    h = d["honest"]
    pct = lambda x: "n/a" if x is None else f"{100 * x:.3g}%"  # noqa: E731
    ths = ", ".join(f"{g} {v:.2e}" for g, v in d["thresholds"].items())
    out = [
        f"{d['precision']}, tiny GPT, H = {d['H']}, k = {d['k']}, all {d['segments_opened']} segments of "
        f"every outer step opened and replayed by a 1-thread verifier, T = {d['outer_steps']} outer steps, "
        f"Δ in fp32. Thresholds (8× the largest honest 1- vs 2-thread noise of `verifier calibrate` and of "
        f"whole honest 2-thread runs of {d.get('calibration_hosts', 3)} other hosts): {ths}.",
        "",
        f"Honest 1 vs 2 threads, from the same start: Δ deviation at most **{pct(h['max_dev'])}** over "
        f"{h['samples']} host-steps ({h['nonzero']} not bitwise equal); honest 2-thread hosts accepted "
        f"{h['two_thread_accepted']} / {h['two_thread_hosts']} (every segment, every outer step; largest "
        "distance ÷ threshold "
        + ", ".join(f"{g} {v:.2f}" for g, v in h["two_thread_worst_over_threshold"].items()) + ").",
        "",
    ]
    rows = []
    ref = h["max_dev"]
    times = lambda x: "n/a" if x is None or not ref else f"{x / ref:,.3g}×"  # noqa: E731
    cumulative = any("accepted_segment" in a for a in d["attacks"])  # results since specs §6.4
    for a in d["attacks"]:
        dev = a["max_dev_accepted_new"]
        old = a["max_dev_accepted_old"]
        seg = [f"{a['accepted_segment']} / {a['steps']}", pct(a["max_dev_accepted_segment"]),
               times(a["max_dev_accepted_segment"])] if cumulative else []  # fmt: skip
        rows.append([a["label"], f"{a['accepted_old']} / {a['steps']}", pct(old), times(old), *seg,
                     f"{a['accepted_new']} / {a['steps']}", pct(dev), times(dev),
                     f"{a['min_cos_accepted_new'] if dev is not None else a['min_cos_accepted_old']:.6f}",
                     pct(a["final_drift"])])  # fmt: skip
    seg_head = ["accepted, per-segment checks", "max Δ dev", "× honest"] if cumulative else []
    out += table(["host (0.9 of every threshold, every boundary)", "accepted, group norms alone", "max Δ dev",
                  "× honest", *seg_head, "accepted, every check", "max Δ dev", "× honest", "min cos",
                  "model drift"], rows)  # fmt: skip
    left = [a["max_dev_accepted_new"] / ref for a in d["attacks"] if a["max_dev_accepted_new"] is not None
            and ref]  # fmt: skip
    out = out[:-1] if out and out[-1] == "" else out
    if left:
        worst = max(left)
        out += ["", f"Steering left within every check: at most **{worst:,.3g}×** the honest noise "
                f"(goal ≤ 10×: **{'met' if worst <= 10 else 'NOT met'}**)."]  # fmt: skip
    if cumulative:
        out += ["", "Per-segment checks: every check of specs §6 but the opened segments' summed residuals "
                "(§6.4); every check: with them. `cumulative=False`: the strongest steering within the "
                "per-segment checks, blind to the summed ones."]  # fmt: skip
    return out


def steering_samples(d: dict[str, Any]) -> Lines:
    """Steering left in tolerance mode under every sample a check can get (issue 36): windows and
    sampling segments, the summed residuals count-independent; the rule before issue 36 beside."""
    if "samplings" not in d:  # a run from before issue 36: every segment opened
        return steering(d)
    h = d["honest"]
    pct = lambda x: "n/a" if x is None else f"{100 * x:.3g}%"  # noqa: E731
    ref = h["max_dev"]
    times = lambda x: "n/a" if x is None or not ref else f"{x / ref:,.3g}×"  # noqa: E731
    ths = ", ".join(f"{g} {v:.2e}" for g, v in d["thresholds"].items())
    old = "; ".join(f"s = {s_}: " + ", ".join(f"{g} {v:.2e}" for g, v in by.items())
                    for s_, by in d["legacy_thresholds"].items())  # fmt: skip
    out = [
        f"{d['precision']}, tiny GPT, H = {d['H']}, k = {d['k']} (n = {d['n_segments']} segments), "
        f"T = {d['outer_steps']} outer steps, Δ in fp32, replayed by a 1-thread verifier. Thresholds "
        f"(8× the largest honest 1- vs 2-thread noise of `verifier calibrate` and of whole honest 2-thread "
        f"runs of {d['calibration_hosts']} other hosts; the summed ones over √(Σ wᵢ²), the largest over "
        f"every set of {d.get('summed_least', 2)} or more, the fewest the windows rule sums): {ths}. "
        f"The rule before issue 36 (Σ wᵢ, 8× the honest noise of sets of s): {old}.",
        "",
        f"Honest 1 vs 2 threads, from the same start: Δ deviation at most **{pct(ref)}** over "
        f"{h['samples']} host-steps ({h['nonzero']} not bitwise equal).",
        "",
    ]
    if curve := d.get("honest_count_curve"):  # why one threshold: the honest value against the count
        n = d["n_segments"]
        out += [f"Honest summed distances of the {d['calibration_hosts']} calibration hosts' whole runs, the "
                f"largest over the sets of m segments (m = 1 … {n}), over √(Σ wᵢ²) (since issue 36) and "
                "over Σ wᵢ (before):", ""]  # fmt: skip
        out += table(["check", "over", *[f"m = {m}" for m in range(1, n + 1)]],
                     [[c, by_name, *[f"{v:.2e}" for v in by[by_name]]] for c, by in curve.items()
                      for by_name in ("rms", "sum")])  # fmt: skip
    for name, sm in d["samplings"].items():
        if name == "windows":
            what = f"every window of w = {d['w']} ({', '.join(str(x) for x in sm['samples'])})"
        else:
            what = (f"every challenge of s = {sm['s']} ({len(sm['samples'])}: {sm['s'] - 1} of segments "
                    f"0 … {d['n_segments'] - 2}, and the last)")  # fmt: skip
        worst = ", ".join(f"{g} {v:.2f}" for g, v in sm["honest_worst_over_threshold"].items())
        if "summed_least" in sm:  # since the summed thresholds follow the run's fewest summed segments
            own = ", ".join(f"{c} {sm['thresholds'][c]:.2e}" for c in ("cumulative", "cumulative_update"))
            what += (f"; summed thresholds over sets of {sm['summed_least']} or more: {own}"
                     + (" (the window before a lone last segment replays on into it, one run)"
                        if name == "windows" else ""))  # fmt: skip
        out += [f"**Sampling {name.split('_')[0]}**, judged under {what}. Honest 2-thread hosts accepted "
                f"under every sample: {sm['honest_accepted_every']} / {sm['honest_contributions']} "
                f"({sm['honest_samples_accepted']} / {sm['honest_samples']} samples; largest distance ÷ "
                f"threshold {worst}).", ""]  # fmt: skip
        legacy = name != "windows"
        rows = []
        for a in sm["attacks"]:
            dev = a["max_dev_every"]
            row = [a["label"], f"{a['accepted_every']} / {a['steps']}",
                   f"{a['samples_accepted']} / {a['samples']}", pct(dev), times(dev)]  # fmt: skip
            if legacy:
                b = a["legacy"]
                row += [f"{b['accepted_every']} / {b['steps']}", pct(b["max_dev_every"]),
                        times(b["max_dev_every"])]  # fmt: skip
            rows.append([*row, pct(a["final_drift"])])
        head = ["host (`budget_steer`)", "accepted under every sample", "samples accepted", "max Δ dev",
                "× honest"]  # fmt: skip
        if legacy:
            head += ["before issue 36: every sample", "max Δ dev", "× honest"]
        out += table([*head, "model drift"], rows)
        st = sm["strongest"]
        if st is not None:
            met = "met" if st["times_noise"] <= 10 else "NOT met"
            label = "windows" if name == "windows" else f"segments, s = {sm['s']}"
            out += [f"Strongest steering accepted under every sample ({label}): "
                    f"**{st['times_noise']:,.3g}×** "
                    f"the honest noise, `{st['label']}` (goal ≤ 10×: **{met}**).", ""]  # fmt: skip
        if not sm["recomputed_agrees"] or not all(a["recomputed_agrees"] for a in sm["attacks"]):
            out += ["(`verify`'s verdicts and those recomputed from the segments' residuals disagree "
                    "somewhere: see the JSON.)", ""]  # fmt: skip
    out += ["`update` spends 0.9 of every threshold at every boundary the same way, the summed ones ÷ √m "
            "for the m segments one check sums; `cumulative=False` ignores the summed ones; `cancel=True` "
            "moves every boundary by δ and θ_H by −(s−1)·δ (issue 36); `cancel=window` cancels δ inside "
            "every window; `lone=True` spends θ_H's whole per-segment budget, what a lone last window "
            "(n mod w = 1) alone held it to before the window ending there replayed on into it. "
            "Model drift: the global model's distance from the honest run's after T steps, "
            "relative to how far that moved.", "",
            "The summed checks hold m boundaries moved the same way to τ/√m each (specs §6.4): a window of "
            "w = 3 to τ/√3, and θ_H after a lone last segment, summed with the window before, to "
            "τ·(√(w+1) − √w); a challenge of s = 2, "
            "one drawn segment beside the always-opened last, only to its per-segment thresholds, whatever "
            "the rule (the cancelling host then keeps its (n − s)·δ); with s = 3 the drawn pair is summed "
            "apart. Nothing sums across windows: the whole move is at most the sum of the windows' bounds "
            "(n/w windows of √w·τ each) while honest noise grows as √n, so at a fixed calibration factor "
            "the figure grows as √(n/w) with the trajectory's n (here n = 10; the chain's default n = 100)."]
    return out


def steering_goals(res: dict[str, Any]) -> Lines:
    """Issue 36: the strongest steering accepted under every sample, per precision and sampling."""
    out = []
    for stem in ("steering", "steering_bf16"):
        d = res.get(stem)
        if not d or "samplings" not in d:
            continue
        parts = []
        for name, sm in d["samplings"].items():
            st = sm["strongest"]
            label = "windows" if name == "windows" else f"segments s = {sm['s']}"
            parts.append(f"{label} {st['times_noise']:,.3g}×" if st else f"{label} none accepted")
        # since issue 36 a tolerance run samples windows (RunConfig refuses segments): the goal is
        # judged there, the segments rows are the rule it refuses (results with `summed_least`)
        judged = [sm for name, sm in d["samplings"].items() if name == "windows" or "summed_least" not in sm]
        worst = max((sm["strongest"]["times_noise"] for sm in judged if sm["strongest"]), default=0.0)
        scope = " (windows, tolerance runs' only sampling; segments refused)" if len(judged) == 1 else ""
        out.append(f"- tolerance steering, {d['precision']}: strongest accepted under every sample, × the "
                   f"honest 1- vs 2-thread Δ noise: {', '.join(parts)} (goal ≤ 10×{scope}: "
                   f"**{'met' if worst <= 10 else 'NOT met'}**)")  # fmt: skip
    return out


def codecs_table(d: dict[str, Any]) -> Lines:
    """The dense codecs as before; the sparse codec's densities, exact sizes, 2-bit levels (issue 26)."""
    dense = [r for r in d["rows"] if not str(r["codec"]).startswith("sparse")]
    sparse = [r for r in d["rows"] if str(r["codec"]).startswith("sparse")]
    out = generic({k: v for k, v in d.items() if k not in ("rows", "sparse_layouts", "sparse_levels")})
    cols = ["codec", "payload_bytes", "blob_bytes", "ratio_vs_fp32", "rel_l2_error", "encode_mb_s",
            "decode_mb_s"]  # fmt: skip
    out += ["*rows*", "", *table(cols, [[r.get(c) for c in cols] for r in dense])]
    if sparse:
        out += ["*sparse codec* (specs §4.1): the payload is served as is; rel. L2 error of one C(Δ), "
                "which error feedback carries to later steps; decode = adding the payload into a running "
                "sum, per fp32 MB of Δ; one core", ""]  # fmt: skip
        head = ["codec", "k / C", "payload bytes", "ratio vs fp32", "ratio vs int8", "kept energy",
                "rel. L2 error", "encode MB/s", "decode into sum MB/s", "dense decode MB/s"]  # fmt: skip
        keys = ["payload_bytes", "ratio_vs_fp32", "ratio_vs_int8", "kept_energy", "rel_l2_error",
                "encode_mb_s", "decode_mb_s", "dense_decode_mb_s"]  # fmt: skip
        body = [[r["codec"], f"{r['topk']} / {r['chunk']}", *(r[k] for k in keys)] for r in sparse]
        out += table(head, body)
    if lay := d.get("sparse_layouts"):
        out += ["*sparse payload sizes from the layout alone* (`payload_len`; Llama presets)", ""]
        out += table(["model", "params", "k / C", "payload bytes", "ratio vs fp32", "ratio vs int8"],
                     [[r["model"], r["params"], f"{r['topk']} / {r['chunk']}", r["payload_bytes"],
                       r["ratio_vs_fp32"], r["ratio_vs_int8"]] for r in lay])  # fmt: skip
    if lv := d.get("sparse_levels"):
        out += [f"*2-bit levels*: the kept entries of the accumulators a = e + Δ of a one-host "
                f"error-feedback run ({lv['outer_steps']} outer steps of {lv['inner_steps']} AdamW steps, "
                f"top-{lv['topk']} of {lv['chunk']}): relative L2 error of each quantizer, mean over the "
                "steps", ""]  # fmt: skip
        out += table(["quantizer", "mean rel. L2 error", "first step", "last step"],
                     [[q, v["mean_rel_l2"], v["per_step"][0], v["per_step"][-1]]
                      for q, v in lv["quantizers"].items()])  # fmt: skip
    return out


def _nan(x: float | None) -> float:
    return float("nan") if x is None else x


def convergence_sparse(d: dict[str, Any]) -> Lines:
    """Sparse codec + error feedback (both outer rules) vs int8 DiLoCo vs data-parallel (issue 26)."""
    s = d["setting"]
    st = s["setup"]
    lrs = ", ".join(f"{x:g}" for x in s["inner_lrs"])
    load = [", ".join(f"{x:.1f}" for x in d.get(k, [])) for k in ("load_before", "load_after")]
    out = [
        "Llama-style model (`trainer.hf:llama`, preset tiny) on Shakespeare's prepared byte-token manifest, "
        f"**M = {st['hosts']} hosts, H = {st['inner_steps']}, T = {st['outer_steps']}** (every contender "
        f"does M·H·T = {st['hosts'] * st['inner_steps'] * st['outer_steps']:,} batch gradients), from a "
        f"{d['warm_start']}-step data-parallel warm start (val loss {fmt(d.get('warm_start_loss'))}), the "
        f"same inner-lr sweep ({lrs}) with warm-up and cosine decay for every contender. *int8_nesterov*: "
        f"today's DiLoCo (outer 0.7 / 0.9). *sparse_…*: the sparse codec, top-{st['codec_topk']} of "
        f"{st['codec_chunk']} with 2-bit values, sent through each host's error-feedback accumulator "
        "(specs §4.1); *sparse_nesterov*: DiLoCo's Nesterov over the sparse mean (0.7 / 0.9); "
        "*sparse_average*: SparseLoCo's rule θ − lr·mean (lr 1, no momentum), β = 1 or 0.95 (*_lr2*, *_lr4*: "
        "outer lr 2, 4). MB sent per "
        "host: the Δ payloads (int8: zstd blobs); data-parallel: its ring all-reduce. Load average "
        f"{load[0]} before, {load[1]} after (2 shared cores).",
        "",
    ]
    rows = [[r["contender"], r["inner_lr"],
             r["final_val_loss"] if r["final_val_loss"] is not None else "error: " + r["error"][-120:],
             r["mb_per_host"], _verdicts(r.get("verdicts"))] for r in s["rows"]]  # fmt: skip
    out += table(["contender", "inner lr", "final val loss", "MB sent per host", "verdicts"], rows)
    for name, b in s["best"].items():
        line = f"- best {name}: {b['label']} → {b['final_val_loss']:.4f}, {b['bytes_per_host'] / 1e6:.4g} MB"
        if "bytes_vs_int8" in b:
            bound = "≥ " if not b["dp_reached"] else ""
            line += (f"; {b['bytes_vs_int8']:.1f}× fewer bytes than int8; final loss ≤ int8's: "
                     f"**{b['loss_le_int8']}**; data-parallel needs {bound}"
                     f"{_nan(b['ratio_vs_dp_at_equal_loss']):,.0f}× the bytes to reach it")  # fmt: skip
        out.append(line)
    return [*out, ""]


SPARSE_KNOBS = (
    "*int8_nesterov*: today's DiLoCo (outer 0.7 / 0.9). *sparse_RULE_KNOBS*: the sparse codec sent through "
    "each host's error-feedback accumulator (specs §4.1) with the outer rule *average* (SparseLoCo's "
    "θ − lr·g; lr 1 unless *lr*) or *nesterov* (DiLoCo's, 0.7 / 0.9 unless *lr*, *mu*); knobs: *contrib* = "
    "`outer.sparse_mean = contributors`, each coordinate's mean over the hosts that kept it (without it: "
    "over all hosts, a host that dropped it counting 0), *b* = β (1 unless set), *k* = entries per chunk "
    "(64 unless set), *C* = the chunk (4096 unless set), *efreset* = no error feedback carried (every step "
    "from e = 0). Bytes: the Δ each host sends per outer step (int8: its zstd blob; the sparse payload as "
    "served); × int8 = final loss ÷ the best int8's in the same run (issue 37's goal: ≤ 1.01 at ≥ 25× "
    "fewer bytes)."
)


def _sparse37_best(s: dict[str, Any]) -> tuple[dict[str, Any] | None, list[tuple[str, dict[str, Any]]]]:
    """The run's best int8, and its sparse contenders' bests (by name), each with its loss × int8."""
    int8 = s["best"].get("int8_nesterov")
    sparse = []
    for name, b in s["best"].items():
        if name.startswith("sparse") and int8 is not None and "bytes_vs_int8" in b:
            sparse.append((name, {**b, "loss_vs_int8": b["final_val_loss"] / int8["final_val_loss"]}))
    return int8, sparse


def convergence_sparse_issue37(d: dict[str, Any]) -> Lines:
    """Issue 37: sparse settings against int8 DiLoCo in one (H, T), each loss as a multiple of int8's."""
    s = d["setting"]
    st = s["setup"]
    lrs = ", ".join(f"{x:g}" for x in s["inner_lrs"])
    load = [", ".join(f"{x:.1f}" for x in d.get(k, [])) for k in ("load_before", "load_after")]
    out = [
        "Llama-style model (`trainer.hf:llama`, preset tiny, 106,816 parameters) on Shakespeare's prepared "
        f"byte-token manifest, **M = {st['hosts']} hosts, H = {st['inner_steps']}, T = {st['outer_steps']}** "
        f"(M·H·T = {st['hosts'] * st['inner_steps'] * st['outer_steps']:,} batch gradients per contender), "
        f"from a {d['warm_start']}-step data-parallel warm start (val loss {fmt(d.get('warm_start_loss'))}), "
        f"inner lr {lrs} with warm-up and cosine decay, 1 thread per run, one run at a time. "
        f"{SPARSE_KNOBS} Load average {load[0]} before, {load[1]} after (2 cores shared with other work).",
        "",
    ]
    int8, sparse = _sparse37_best(s)
    i8_loss = int8["final_val_loss"] if int8 else None
    i8_bytes = int8["bytes_per_host"] if int8 else None
    rows = []
    for r in s["rows"]:
        loss, mb = r["final_val_loss"], r["mb_per_host"]
        rows.append([
            r["contender"], r["inner_lr"], loss if loss is not None else "error: " + r["error"][-120:],
            f"{loss / i8_loss:.4f}" if loss is not None and i8_loss else "",
            mb, f"1/{i8_bytes / (mb * 1e6):.1f}" if mb and i8_bytes else "",
        ])  # fmt: skip
    header = ["contender", "inner lr", "final val loss", "× int8", "MB sent per host", "bytes ÷ int8's"]
    if any(r.get("flushed") is not None for r in s["rows"]):  # issue 37's diagnostic, where it was run
        out[0] += (" *Loss with every e flushed*: the loss of θ_T − lr·mean(e) over the hosts' final "
                   "error-feedback accumulators (one dense flush no node does: how much of the missing "
                   "progress is still held unsent at the end).")  # fmt: skip
        header.append("loss with every e flushed")
        rows = [[*row, fmt(r.get("flushed")) if r.get("flushed") is not None else ""]
                for row, r in zip(rows, s["rows"], strict=True)]  # fmt: skip
    out += table(header, rows)
    for name, b in sorted(sparse, key=lambda nb: nb[1]["final_val_loss"]):
        met = b["loss_vs_int8"] <= 1.01 and b["bytes_vs_int8"] >= 25
        out.append(f"- {name}: {b['final_val_loss']:.4f} = {b['loss_vs_int8']:.4f}× int8's at "
                   f"{b['bytes_vs_int8']:.1f}× fewer bytes (≤ 1.01× at ≥ 25×: "
                   f"**{'met' if met else 'not met'}**)")  # fmt: skip
    return [*out, ""]


_CMD37 = ".venv/bin/python -m bench.convergence --workers 1 "
_T37 = "sparse_average_contrib_b0.9_lr1.25"
_D37 = "sparse_average_contrib_b0.9"
ISSUE37: list[tuple[str, str, str]] = [
    ("convergence_sparse_H25_T24_mean",
     "1i. The sparse mean over the hosts that kept a coordinate (issue 37; H = 25, T = 24)",
     _CMD37 + "--inner-lrs 0.002 --sparse-shape 25x24 --sparse-name mean --sparse-contenders int8_nesterov,"
     "sparse_average_b0.95,sparse_average_contrib_b0.95,sparse_average_contrib,sparse_nesterov_contrib_b0.95,"
     "sparse_average_contrib_b0.95_k60,sparse_average_contrib_b0.95_C1024_k16,"
     "sparse_average_contrib_b0.95_k256"),
    ("convergence_sparse_H25_T24_knobs",
     "1j. Outer momentum, β, error feedback reset and density over the contributors' mean (H = 25, T = 24)",
     _CMD37 + "--inner-lrs 0.002 --sparse-shape 25x24 --sparse-name knobs --sparse-contenders int8_nesterov,"
     "sparse_nesterov_contrib_b0.95_lr0.5_mu0.5,sparse_nesterov_contrib_b0.95_lr0.3_mu0.7,"
     "sparse_nesterov_contrib_b0.95_lr0.1_mu0.9,sparse_average_contrib_b0.9,sparse_average_contrib_b0.98,"
     "sparse_average_contrib_efreset,sparse_average_contrib_b0.95_k128,sparse_average_contrib_b0.95_k512"),
    ("convergence_sparse_H25_T24_beta", "1k. β and the outer lr around the best (H = 25, T = 24)",
     _CMD37 + "--inner-lrs 0.002 --sparse-shape 25x24 --sparse-name beta --sparse-contenders int8_nesterov,"
     "sparse_average_contrib_b0.85,sparse_average_contrib_b0.8,sparse_average_contrib_b0.9_lr1.25,"
     "sparse_average_contrib_b0.9_lr0.8"),
    ("convergence_sparse_H25_T24_outerlr", "1l. Outer lr 1.5 at β = 0.9, 1.25 at β = 0.95 (H = 25, T = 24)",
     _CMD37 + "--inner-lrs 0.002 --sparse-shape 25x24 --sparse-name outerlr --sparse-contenders "
     "int8_nesterov,sparse_average_contrib_b0.9_lr1.5,sparse_average_contrib_b0.95_lr1.25"),
    ("convergence_sparse_H25_T24_innerlr", "1m. Inner lr 0.001 and 0.005 (H = 25, T = 24)",
     _CMD37 + f"--inner-lrs 0.001,0.005 --sparse-shape 25x24 --sparse-name innerlr --sparse-contenders "
     f"int8_nesterov,{_T37}"),
    ("convergence_sparse_H100_T6_i37", "1n. H = 100, T = 6 (the same compute): today's sparse, the reference "
     "aggregation, the tuned setting",
     _CMD37 + "--inner-lrs 0.002 --sparse-shape 100x6 --sparse-name i37 --sparse-contenders int8_nesterov,"
     f"sparse_average_b0.95,sparse_average_contrib_b0.95,sparse_average_contrib_b0.9,{_T37},{_T37}_k60"),
    ("convergence_sparse_H15_T40_i37", "1o. H = 15, T = 40 (the same compute)",
     _CMD37 + "--inner-lrs 0.002 --sparse-shape 15x40 --sparse-name i37 --sparse-contenders int8_nesterov,"
     f"{_D37},{_T37},{_D37}_k60"),
    ("convergence_sparse_H50_T12_i37", "1p. H = 50, T = 12 (the same compute)",
     _CMD37 + "--inner-lrs 0.002 --sparse-shape 50x12 --sparse-name i37 --sparse-contenders int8_nesterov,"
     f"{_D37},{_T37},{_D37}_k60"),
    ("convergence_sparse_H25_T48_i37", "1q. H = 25, T = 48 (twice the compute)",
     _CMD37 + "--inner-lrs 0.002 --sparse-shape 25x48 --sparse-name i37 --sparse-contenders int8_nesterov,"
     f"{_D37},{_D37}_k60,{_D37}_k256"),
    ("convergence_sparse_H100_T24_i37", "1r. H = 100, T = 24 (four times the compute)",
     _CMD37 + "--inner-lrs 0.002 --sparse-shape 100x24 --sparse-name i37 --sparse-contenders int8_nesterov,"
     f"{_D37},{_D37}_k60"),
    ("convergence_sparse_H25_T24_flush", "1s. Where the gap is: every accumulator flushed at the end "
     "(H = 25, T = 24)",
     _CMD37 + "--inner-lrs 0.002 --sparse-shape 25x24 --sparse-name flush --sparse-contenders int8_nesterov,"
     f"sparse_average_b0.95,{_D37}"),
    ("convergence_sparse_H100_T6_flush", "1t. The same at H = 100, T = 6",
     _CMD37 + "--inner-lrs 0.002 --sparse-shape 100x6 --sparse-name flush --sparse-contenders int8_nesterov,"
     f"{_D37}"),
]  # fmt: skip
"""Issue 37's runs: (results stem, section title, the command that made it)."""
GAP_TITLE = "1u. Issue 37: the best sparse setting against int8 DiLoCo, by H and T"


def _gap_cell(nb: tuple[str, dict[str, Any]] | None) -> str:
    if nb is None:
        return "-"
    name, b = nb
    loss, ratio, fewer = b["final_val_loss"], b["loss_vs_int8"], b["bytes_vs_int8"]
    return f"{name}: {loss:.4f} = {ratio:.4f}×, 1/{fewer:.1f} the bytes"


def _best_at(scored: list[tuple[str, dict[str, Any]]], fewer: float) -> tuple[str, dict[str, Any]] | None:
    ok = [nb for nb in scored if nb[1]["bytes_vs_int8"] >= fewer]
    return min(ok, key=lambda nb: nb[1]["final_val_loss"]) if ok else None


def sparse_gap(runs: dict[str, list[tuple[Path, Any]]]) -> Lines:
    """Issue 37's table: per (H, T), int8 DiLoCo against the best sparse setting at ≥ 25× fewer bytes
    and the best at any density, each the best over every issue-37 run of that shape (every contender
    tuned over the union of the runs' settings and inner lrs; rendered, never typed in)."""
    shapes: dict[tuple[int, int], dict[str, Any]] = {}
    for stem, title, _ in ISSUE37:
        if stem not in runs:
            continue
        s = runs[stem][0][1]["setting"]
        int8 = s["best"].get("int8_nesterov")
        if int8 is None:
            continue
        key = (s["setup"]["inner_steps"], s["setup"]["outer_steps"])
        g = shapes.setdefault(key, {"int8": int8, "sparse": [], "sections": []})
        if int8["final_val_loss"] < g["int8"]["final_val_loss"]:
            g["int8"] = int8
        g["sparse"] += [(n, b) for n, b in s["best"].items()
                        if n.startswith("sparse") and "bytes_vs_int8" in b]  # fmt: skip
        g["sections"].append(title.split(".")[0])
    rows = []
    for (h, t), g in sorted(shapes.items(), key=lambda kv: (kv[0][0] * kv[0][1], kv[0])):
        i8 = g["int8"]["final_val_loss"]
        scored = [(n, {**b, "loss_vs_int8": b["final_val_loss"] / i8}) for n, b in g["sparse"]]
        cheap = _best_at(scored, 25)
        met = bool(cheap and cheap[1]["loss_vs_int8"] <= 1.01)
        int8_cell = f"{i8:.4f} ({g['int8']['label'].split('/')[-1]})"
        today = _best_at([nb for nb in scored if "contrib" not in nb[0]], 0)  # the mean over all hosts
        rows.append([h, t, int8_cell, _gap_cell(today), _gap_cell(cheap), _gap_cell(_best_at(scored, 24)),
                     _gap_cell(_best_at(scored, 0)),
                     "met" if met else "not met", ", ".join(f"§{x}" for x in g["sections"])])  # fmt: skip
    if not rows:
        return ["No results yet.", ""]
    return [
        "Every issue-37 run above, grouped by (H, T) (M = 4, Llama-tiny, from the same warm start); each "
        "contender at its best inner lr, int8 at its best over every run of that shape. The goal: a sparse "
        "final loss ≤ 1.01 × int8's at ≥ 25× fewer bytes per host per outer step (on this 106,816-parameter "
        "layout k = 64 of 4096 is 24.5× int8's bytes, its names and short tensors weighing more than at 1B "
        "or 30B, where it is 35.9×; k = 60 is 25.5×).",
        "",
        *table(["H", "T", "int8 loss", "sparse, mean over all hosts (before)",
                "best sparse at ≥ 25× fewer bytes", "at ≥ 24× (k ≤ 64 of 4096)", "at any density", "goal",
                "sections"], rows),
    ]  # fmt: skip


def aggregation(d: dict[str, Any]) -> Lines:
    """`gonka-diloco plan`'s aggregation against training as M grows (issue 26)."""
    speeds = ", ".join(f"{k} {v / 1e6:.0f} MB/s" for k, v in d["decode_bytes_per_s"].items())
    out = [
        f"30B on 8×H100 hosts at {d['link_bytes_per_s'] * 8 / 1e9:g} Gbit/s, H = {d['H']} (the published "
        "plan's k = 25, s = 4, v = 2, m = 1): every host downloads the other M − 1 accepted Δs and sums them "
        "itself; aggregation = the longer of that download and decoding into the running sum (per rank "
        f"{speeds}, from {d['constants_source']}). Sparse: top-{d['codec_topk']} of {d['codec_chunk']}.",
        "",
    ]
    rows = [[r["codec"], r["hosts"], f"{r['delta_bytes'] / 1e9:.3g} GB",
             f"{r['download_bytes'] / 1e12:.3g} TB",
             f"{r['aggregate_s'] / 3600:.2f} h", f"{r['train_s'] / 3600:.2f} h",
             f"{100 * r['aggregate_over_train']:.1f}%"] for r in d["rows"]]  # fmt: skip
    out += table(["codec", "hosts", "Δ per host", "download per host", "aggregation", "training",
                  "aggregation ÷ training"], rows)  # fmt: skip
    out += [f"- {k}: aggregation reaches half the training time at M = {m:,} hosts"
            for k, m in d["hosts_at_half_training"].items()]  # fmt: skip
    return [*out, ""]


def overlap_convergence(d: dict[str, Any]) -> Lines:
    """Overlap none vs delayed and eager at equal compute; the wall-clock time model and its inputs.
    The delayed rows are the measurement that removed that schedule (issue 22)."""
    st = d["setup"]
    out = [
        "The delayed schedule was removed from the protocol (issue 22); these figures are why.",
        "",
        f"**M = {st['hosts']} hosts, H = {st['inner_steps']}, T = {st['outer_steps']} outer steps** "
        f"(the convergence benchmark's setting: same model, data, int8 Δs; every contender does "
        f"M·H·T = {st['hosts'] * st['inner_steps'] * st['outer_steps']:,} inner steps). *none*: step n+1 "
        "starts from G_{n+1}. *delayed* (`overlap = \"delayed\"`, specs §2.2.1): step n+1 starts from G_n "
        "with the optimizer state its host committed in step n − 1 (if accepted, else fresh) while step n "
        "is verified; its accepted Δs update G_{n+1}. *delayed_carry*: the same with the latest optimizer "
        "state (what `trainer.diloco.DiLoCo(outer_delay=1)` did before issue 22). *eager* "
        "(`overlap = \"eager\"`, "
        "§2.2.1): as delayed, but a host starts step n from G_{n−1} moved by the outer step with α × its own "
        "step n − 1 Δ standing in for the aggregate, α = 1/(lr·(1 + μ)) = 0.752, and the optimizer it ended "
        "that step with; *eager_a<α>*: other α (α = 1: the own Δ as is). Research variants of eager, not "
        "in the protocol: *eager_c<c>* applies step n − 1's result mid-step (at inner step c·H the host "
        "moves by G_{n−1} − its start and trains on, so that result must exist within c of the next step's "
        "training; c = 1 is eager); *eager_inmean* starts every host from the last known mean Δ instead "
        "of its own; *eager_end* measures each Δ from the G it is applied to. *verified*: every "
        "contribution replay-verified against the start it trained from.",
        "",
    ]
    rows = []
    for r in d["rows"]:
        if "error" in r:
            rows.append([r["contender"], r["outer_delay"], "", "", "error: " + r["error"][-200:], "", ""])
            continue
        vs = f"{r['loss_vs_none_pct']:+.2f}%" if "loss_vs_none_pct" in r else ""
        rows.append([r["contender"], r["outer_delay"], f"{r['outer_lr']:g} / {r['outer_momentum']:g}",
                     "yes" if r["verified"] else "no", r["final_val_loss"], vs,
                     _verdicts(r.get("verdicts"))])  # fmt: skip
    out += table(["contender", "outer delay", "outer lr / μ", "verified", "final val loss", "vs none",
                  "verdicts"], rows)  # fmt: skip
    ti = d["time_model_inputs"]
    out += [
        f"**Wall-clock to the same loss** (a per-step time model; inputs: training {ti['train_s']:g} s and "
        f"commit … result {ti['post_s']:g} s per outer step, the devnet as issue 16 measured it: "
        f"{ti['devnet_train_s']:g} s of training in a {ti['devnet_step_s']:g} s step). Without overlap the G "
        "after n steps exists after n·(train + post); with the delayed schedule after "
        "(n − 1)·max(train, post) + train + post. The target is the larger of the two final losses; the "
        "steps each needs come from its own curve.",
        "",
    ]
    from bench.overlap_convergence import or_never as num

    trows = [[t["contender"], t["scenario"], t["train_s"], t["post_s"], t["target_loss"],
              f"{num(t['steps_none'], '.2f')} / {num(t['steps_delayed'], '.2f')}",
              f"{num(t['wall_none_s'], '.0f')} / {num(t['wall_delayed_s'], '.0f')}",
              num(t["speedup"], ".2f") + ("×" if t["speedup"] is not None else ""),
              f"{100 * t['utilization_none']:.0f}% / {100 * t['utilization_delayed']:.0f}%"]
             for t in d.get("time_model", [])]  # fmt: skip
    out += table(["contender", "scenario", "train s", "post s", "target loss", "steps none / delayed",
                  "wall s none / delayed", "speedup", "utilization none / delayed"], trows)  # fmt: skip
    return out


def fetch_slow_holder(d: dict[str, Any]) -> Lines:
    kib = d["chunk_bytes"] // 1024
    p = d["policy"]
    n = d["chunks"]
    rows = [
        [case, f"{c['median_s']:.3f} s", f"{c['max_s']:.3f} s", f"{c['chunks_from_first_listed']} / {n}"]
        for case, c in d["cases"].items()
    ]
    return [
        f"One object of {d['chunks']} × {kib} KiB chunks over real HTTP by the nodes' `BlobClient` (rate "
        f"floor {p['min_bytes_per_s']:g} B/s after {p['base_s']:g} s), {d['repeats']} repeats per case:",
        "",
        *table(["holders", "median", "max", "chunks from the first listed"], rows),
        f"A slow holder costs about one hedge interval, not its chunks: a chunk left with it would take "
        f"{d['slow_holder_keeping_one_chunk_s']:g} s. Before issue 22's fix one trickling holder listed "
        "first turned a 0.1 s fetch of 16 chunks into 12.1 s.",
        "",
    ]


def chaos(d: dict[str, Any]) -> Lines:
    kills = sum(len(r["kills"]) for r in d["runs"])
    victims = sorted({k["victim"].split("-")[0] for r in d["runs"] for k in r["kills"]})
    failed = [f"seed {r['seed']}: {'; '.join(r['failures'])}" for r in d["runs"] if not r["ok"]]
    return [
        f"Each run is a devnet in which a seeded plan SIGKILLs a random {', '.join(victims)} process "
        f"{d['kills_per_run']} times ({d['gap_s'][0]:g}–{d['gap_s'][1]:g} s apart, each down "
        f"{d['down_s'][0]:g}–{d['down_s'][1]:g} s) and restarts it. A run passes when every step is DONE, "
        "every honest node applied the chain's final model and holds it, every stored object verifies "
        "chunk by chunk, no node read a corrupted object back, and nothing a start-up sweep would remove "
        "is left.",
        "",
        f"**{d['passed']} of {d['total']} passed** (seeds {d['seeds'][0]}–{d['seeds'][1]}, "
        f"{kills} kills in all)." + (" Failures: " + " | ".join(failed) if failed else ""),
        "",
    ]


def soak(d: dict[str, Any]) -> Lines:
    st = d["settings"]
    rows = []
    for kind, sm in d["summary"].items():
        walls = " ".join(f"{r['wall_s']:.0f}" for r in d["runs"] if r["kind"] == kind)
        causes = "; ".join(c for r in d["runs"] if r["kind"] == kind for c in r["causes"])[:300]
        rows.append([kind, f"{sm['passed']} / {sm['total']}", walls, causes or "—"])
    what = "fresh-clone `make test` runs" if st.get("suites") else "devnets (the default devnet)"
    timed = [r for r in d["runs"] if r.get("pytest_s") is not None]
    split = [
        "",
        "Of each suite's wall, after its install (`make venv cometbft`): `make test` (ruff, mypy, "
        "pytest) " + ", ".join(f"{r['test_s']:.0f} s" for r in timed) + "; pytest alone "
        + ", ".join(f"{r['pytest_s']:.0f} s" for r in timed) + ".",
        "",
    ] if timed else []  # fmt: skip
    return [
        f"{what.capitalize()} beside {st['burners']} CPU burners on the 2 cores; nothing is retried:",
        "",
        *table(["kind", "passed", "wall s each", "causes of failures"], rows),
        *split,
    ]


def _adversary_reasons(outcomes: list[dict[str, Any]]) -> str:
    """The verifiers' reasons for the adversary's contributions, steps with the same reasons merged."""
    by: dict[str, list[str]] = {}
    for o in outcomes:
        why = ", ".join(r.replace(": ", " ") for r in o["reasons"]) or "no verdict"
        by.setdefault(f"{o['outcome']} ({why})", []).append(str(o["outer_step"]))
    def span(steps: list[str]) -> str:
        n = [int(x) for x in steps]
        if len(n) == 1:
            return f"step {n[0]}"
        contiguous = n == list(range(n[0], n[0] + len(n)))
        return f"steps {n[0]}–{n[-1]}" if contiguous else f"steps {','.join(steps)}"

    return "; ".join(f"{span(steps)}: {what}" for what, steps in by.items()) or "—"


def devnet_codec(d: dict[str, Any]) -> Lines:
    rows = []
    for c in d["cases"]:
        loss = c.get("val_loss") or []
        b = c.get("delta_bytes_per_host_step") or {}
        size = f"{b['median']:g}" if b.get("median") is not None else "?"
        if b.get("min") != b.get("max"):
            size += f" ({b['min']}–{b['max']})"
        adv = ", ".join(f"{h}={n}" for h, n in (c.get("adversaries") or {}).items()) or "none"
        codec = c.get("codec", c["case"].split(":")[0])
        if codec == "sparse" and c.get("codec_topk"):
            codec += f" (k = {c['codec_topk']} per {c.get('codec_block_size')})"
        rows.append([
            codec, adv, c.get("outer_steps_done", "?"),
            f"{c.get('accepted', '?')} / {c.get('rejected', '?')}",
            f"{c.get('adversary_rejected', '?')} / {c.get('adversary_total', '?')}",
            _adversary_reasons(c.get("adversary_outcomes") or []),
            f"{loss[0]:.4f} → {loss[-1]:.4f}" if loss else "?", size, f"{c['wall_s']:.0f}",
            "PASS" if c["passed"] else "FAIL",
        ])
    sizes = {c.get("codec"): (c.get("delta_bytes_per_host_step") or {}).get("median") for c in d["cases"]}
    dense, sparse = sizes.get("int8"), sizes.get("sparse")
    ratio = (f"Δ payload int8 ÷ sparse: **{dense / sparse:.2f}×** ({dense:g} vs {sparse:g} bytes per host "
             "per outer step). " if dense and sparse else "")
    all_rejected = all(c.get("adversary_total") and c.get("adversary_rejected") == c.get("adversary_total")
                       for c in d["cases"])
    fell = all(len(c.get("val_loss") or []) > 1 and c["val_loss"][-1] < c["val_loss"][0] for c in d["cases"])
    passed = all(c["passed"] for c in d["cases"])
    why = []
    for c in (c for c in d["cases"] if not c["passed"]):
        f = c.get("failures") or [c.get("error", "non-zero exit status")]
        more = f" (+{len(f) - 1} more, the last: {f[-1]})" if len(f) > 1 else ""
        sits = f"; {c['sit_outs']} sit-outs" if "sit_outs" in c else ""
        why.append(f"- {c['case']} FAIL: {f[0]}{more}{sits}")
    return [
        "Each row is one `gonka-diloco devnet --codec CODEC --adversary NAME --no-live` (4 hosts, one of "
        "them adversarial, 2 verifiers, the default small GPT), run one after the other on the shared "
        f"cores (load average {d.get('loadavg_before', '?')} before, {d.get('loadavg_after', '?')} after; "
        f"{d.get('utc', '?')}). Figures come from each run's snapshot.json; Δ bytes is the payload one "
        "host commits per outer step (median over the honest hosts' contributions). `ef_forge` sends a "
        "sparse payload and carried accumulator that are not C(β·e + Δ).",
        "",
        *table(["codec", "adversary", "outer steps", "accepted / rejected", "adversary rejected",
                "verifiers' reasons (adversary)", "validation loss", "Δ bytes", "wall s", "result"], rows),
        f"{ratio}Every adversary contribution rejected: **{'yes' if all_rejected else 'NO'}**; validation "
        f"loss fell in every run: **{'yes' if fell else 'NO'}**; every devnet passed its own checks: "
        f"**{'yes' if passed else 'NO'}**.",
        "",
        *([*why, ""] if why else []),
    ]


def convergence_moments(d: dict[str, Any]) -> Lines:
    """Issue 35: float32 vs int8 AdamW moments, two seeds each, per setting."""
    load = f"Load average {fmt(d.get('load_before'))} before, {fmt(d.get('load_after'))} after (2 cores)."
    out = [f"{load} Same run, same seeds; only `InnerOptim.moments` differs (specs §6.2.1). The bar: int8's "
           "final loss within 1% of float32's at the same seed; float32's seed-to-seed gap is the noise.",
           ""]  # fmt: skip
    for name, s in d["settings"].items():
        if "setup" not in s:
            out += [f"*{name}*: error {str(s.get('error', ''))[:200]}", ""]
            continue
        st = s["setup"]
        model = "Llama-tiny (warm start)" if "llama" in st["factory"] else "small GPT"
        out += [f"*{name}*: {model}, M = {st['hosts']}, H = {st['inner_steps']}, T = {st['outer_steps']}, "
                f"inner lr {fmt(st['inner_lr'])}, outer {fmt(st['outer_lr'])}/{fmt(st['outer_momentum'])}",
                ""]  # fmt: skip
        rows = [[r["moments"], r["seed"], f"{r['final_val_loss']:.4f}" if r["final_val_loss"] else "error",
                 r["verdicts"] or "", r["wall_s"]] for r in s["rows"]]  # fmt: skip
        out += table(["moments", "seed", "final val loss", "verdicts", "wall s (under load)"], rows)
        if "max_rel_gap" in s:
            gaps = ", ".join(f"seed {k}: {100 * v:.2f}%" for k, v in s["int8_vs_fp32_rel"].items())
            noise = s.get("fp32_seed_noise_rel")
            seeds = f"; float32 seed-to-seed: {100 * noise:.2f}%" if noise is not None else ""
            out += [f"int8 vs fp32 at the same seed: {gaps}; within 1%: **{s['within_1pct']}**{seeds}", ""]
    return out


def statecode(d: dict[str, Any]) -> Lines:
    """Issue 35: lossless coding of opened training states against G_n, per model, moments, point."""
    out = [f"Link: {fmt(d['link_mb_s'])} MB/s (1 Gbit/s); chunks of {fmt(d['chunk_bytes'])} bytes; speeds "
           "are per core (one thread, its own CPU time). *t*: inner steps into the outer step (G_n at 0); "
           "ratio = canonical ÷ coded bytes; *genuine ratio*: max |m̂|/((√v̂+ε)·C(t)) of the state (§6.3); "
           "*diff_body*: the 125M state without `embed_tokens` (its unused rows' moments stay 0); "
           "*diff_theta_h*: the chunks a dispute panel member fetches for θ_H's parameters alone (no "
           "windowed check does since only the one ending at θ_H checks Δ; the header's chunk and "
           "every chunk holding `param/*`, moments at their edges included; a one-chunk state is all of it); "
           "*diff_params* (*diff_params_body*: without `embed_tokens`): the parameters alone, chunked as a "
           "state of their own (θ_H's chunks at scale); *diff_moments*: the rest. Load "
           f"average {fmt(d.get('load_before'))} before, {fmt(d.get('load_after'))} after.", ""]  # fmt: skip
    keys = ["model", "moments", "t", "coding", "level", "state_bytes_per_param", "wire_bytes_per_param",
            "ratio", "encode_mb_s", "decode_mb_s", "genuine_ratio"]  # fmt: skip
    out += table(["model", "moments", "t", "coding", "zstd level", "B/param state", "B/param wire", "ratio",
                  "encode MB/s/core", "decode MB/s/core", "genuine ratio"],
                 [[r[k] for k in keys] for r in d["rows"]])  # fmt: skip
    p = d.get("planner", {})
    took = [f"{m} {fmt(p[m]['ratio'])} (slowest encode {fmt(p[m]['encode_mb_s'])}, decode "
            f"{fmt(p[m]['decode_mb_s'])} MB/s/core)" for m in ("fp32", "int8") if m in p]  # fmt: skip
    out += [f"The planner takes, per moment format, the lowest ratio of `{p.get('coding')}` at zstd level "
            f"{p.get('level')}: " + "; ".join(took) + ".", ""]  # fmt: skip
    if theta := p.get("theta_h"):
        took = [f"{m} {fmt(t['ratio'])} (slowest encode {fmt(t['encode_mb_s'])}, decode "
                f"{fmt(t['decode_mb_s'])} MB/s/core)" for m, t in theta.items()]  # fmt: skip
        out += ["For θ_H's parameters alone (r_θ), the lowest of `diff_params` and `diff_params_body`: "
                + "; ".join(took) + " (measured; the planner no longer uses it: only a dispute panel "
                "fetches θ_H's parameters).", ""]  # fmt: skip
    if d.get("prediction_30b"):
        keys = ["moments", "state_gb", "wire_gb", "wire_bytes_per_param", "minutes_at_1gbit", "optimizer_gb"]
        head = ["30B: moments", "state GB", "on the wire GB", "B/param on the wire", "min at 1 Gbit/s",
                "carried optimizer GB"]  # fmt: skip
        if all("theta_h_gb" in r for r in d["prediction_30b"]):
            keys, head = [*keys, "theta_h_gb"], [*head, "θ_H's parameters on the wire GB"]
        out += table(head, [[r[k] for k in keys] for r in d["prediction_30b"]])
    return out


def verification(d: dict[str, Any]) -> Lines:
    """bench.verification: per check of an honest contribution, measured vs planned, per sampling."""
    rows = []
    for r in d["runs"]:
        m, p = r["measured"], r["predicted"]
        ratio = r.get("ratio", {})
        rows.append([
            r["sampling"], m.get("checks"), m.get("bytes_mean"), p["bytes_per_check"], ratio.get("bytes"),
            m.get("replay_steps_mean"), p["replay_steps_per_check"], ratio.get("replay_steps"),
            ", ".join(f"{k} {v:.0%}" for k, v in r["caught_share"].items()), r.get("honest_accepted"),
        ])  # fmt: skip
    header = ["sampling", "checks", "bytes per check", "planned", "ratio", "replayed steps per check",
              "planned", "ratio", "adversaries caught per outer step", "honest accepted"]  # fmt: skip
    out = table(header, rows)
    swarm = [r for r in d["runs"] if r.get("swarm")]
    if swarm:  # issue 35: who uploads the openings (specs §8.1), and the coding on the wire (§8.2)
        out += ["*Swarm and transfer coding (issue 35)*: per honest contribution, the checks that fetched "
                "θ_H's parameters alone and how many times its author uploaded them (the author's chunks in "
                "those fetches ÷ one fetch's; before swarming every such fetch came from the author; since "
                "7c32530 only the check ending at θ_H checks Δ and no check fetches θ_H's parameters: "
                "- where none was seen, planned 0); all "
                "hosts' upload of states ÷ all verifiers' download of them; the state bytes fetched coded "
                "against G_n and what they decoded to.", ""]  # fmt: skip
        srows = []
        for r in swarm:
            sw, p = r["swarm"], r["predicted"]

            def both(key: str, sw: dict[str, Any] = sw, p: dict[str, Any] = p) -> str:
                return "-" if sw.get(key) is None else f"{sw[key]:.2f} ({p.get(key, 0):.2f})"

            srows.append([
                r["sampling"], both("theta_h_fetches_per_contribution"),
                both("author_uploads_theta_h_per_contribution"), sw.get("up_over_down"),
                sw.get("coded_wire_bytes", 0) / 1e6, sw.get("state_wire_bytes", 0) / 1e6,
                sw.get("coded_canonical_bytes", 0) / 1e6,
                f"{sw.get('coded_ratio') or 0:.3f} ({p.get('code_ratio', 1):.3f})",
            ])  # fmt: skip
        out += table(["sampling", "θ_H fetches per contribution (planned)",
                      "author's uploads of θ_H (planned)", "hosts' ↑ ÷ verifiers' ↓ (states)",
                      "coded MB on the wire", "of state MB fetched", "canonical MB", "ratio (planner's)"],
                     srows)  # fmt: skip
        out += ["Before swarming and coding (main before issue 35 part 3, the same windows devnet, "
                "2026-12-07 12:01 UTC): θ_H's parameters fetched 2.27 times per honest contribution, all "
                "2.27 from its author; hosts' state upload ÷ verifiers' download 1.02; nothing coded.",
                ""]  # fmt: skip
    for r in d["runs"]:
        out += [f"*{r['sampling']}: bytes per node per outer step* (↑ served, ↓ fetched; kB)", ""]
        kinds = sorted({k for t in r["traffic_per_step"].values() for dd in ("up", "down") for k in t[dd]})
        trows = [[name, *[t[dd].get(k, 0) / 1e3 for dd in ("up", "down") for k in kinds],
                  t["replayed"]["steps"]] for name, t in r["traffic_per_step"].items()]  # fmt: skip
        out += table(["node", *[f"{'↑' if dd == 'up' else '↓'} {k}" for dd in ("up", "down") for k in kinds],
                      "replayed steps"], trows)  # fmt: skip
    return out


def devnet_sparse_issue37(d: dict[str, Any]) -> Lines:
    """Issue 37's devnet check: the sparse codec's outer step before and after, loss per outer step."""
    rows = []
    for c in d["cases"]:
        outer = c.get("outer") or {}
        beta = c.get("codec_ef_decay") or "0.9 (default)"
        setting = (f"{outer.get('rule', 'nesterov')} lr {outer.get('lr', '?')}, mean over "
                   f"{outer.get('sparse_mean', 'contributors')}, β = {beta}")  # fmt: skip
        loss = c.get("val_loss") or []
        rows.append([c["case"], setting, " → ".join(f"{x:.4f}" for x in loss) or "?",
                     f"{c.get('adversary_rejected', '?')} / {c.get('adversary_total', '?')}",
                     f"{c.get('accepted', '?')} / {c.get('rejected', '?')}", f"{c['wall_s']:.0f}",
                     "PASS" if c["passed"] else "FAIL"])  # fmt: skip
    out = [
        "`gonka-diloco devnet --codec sparse --adversary ef_forge --no-live` runs (4 hosts, one forging "
        "its payload and carried accumulator, 2 verifiers, the default small GPT, k = 64 of 4096), one "
        f"after the other (load average {d.get('loadavg_before', '?')} before, {d.get('loadavg_after', '?')} "
        f"after; {d.get('utc', '?')}): the sparse outer step before issue 37 (pinned by "
        "`bench/devnet_sparse_issue26.toml`), today's default, and SparseLoCo's average at lr 1 "
        "(`bench/devnet_sparse_average.toml`). Validation loss of G after each outer step, from each run's "
        "snapshot.json.",
        "",
        *table(["case", "outer step", "validation loss per outer step", "adversary rejected",
                "accepted / rejected", "wall s", "result"], rows),
    ]  # fmt: skip
    by = {c["case"]: c.get("val_loss") or [] for c in d["cases"]}
    before = next((v for k, v in by.items() if k.endswith("@bench/devnet_sparse_issue26.toml")), None)
    after = next((v for k, v in by.items() if "@" not in k), None)
    if before and after:
        n = min(len(before), len(after))
        faster = all(a <= b for a, b in zip(after[:n], before[:n], strict=True))
        rejected = all(c.get("adversary_total") and c.get("adversary_rejected") == c.get("adversary_total")
                       for c in d["cases"])  # fmt: skip
        out.append(f"- today's default learns at least as fast per outer step as before (every step's loss ≤ "
                   "before's): "
                   f"**{'yes' if faster else 'no'}**; the adversary rejected in every step of every run: "
                   f"**{'yes' if rejected else 'no'}**")  # fmt: skip
    return [*out, ""]


SECTIONS: list[tuple[str, str, str, Callable[[Any], Lines]]] = [
    ("convergence", "1. Convergence: data-parallel vs ours (verified) vs torchft DiLoCo", "bench.convergence",
     convergence),
    ("convergence_sweep", "1b. Convergence, tuned: data-parallel vs DiLoCo on a Llama-style model",
     ".venv/bin/python -m bench.convergence --only sweep [--quick]", convergence_sweep),
    ("overlap_convergence", "1d. Overlap: convergence cost of the delayed and eager schedules (issue 16)",
     "bench.overlap_convergence", overlap_convergence),
    ("convergence_sparse", "1e. Sparse codec with error feedback vs int8 DiLoCo vs data-parallel (issue 26)",
     ".venv/bin/python -m bench.convergence --only sparse [--quick]", convergence_sparse),
    ("convergence_sparse_H25_T24", "1f. The same compute in SparseLoCo's regime: H = 25, T = 24",
     ".venv/bin/python -m bench.convergence --sparse-shape 25x24 --sparse-contenders dp,int8_nesterov,"
     "sparse_nesterov,sparse_average,sparse_average_lr2,sparse_average_lr4", convergence_sparse),
    ("convergence_sparse_H25_T24_density", "1g. Denser sparse payloads (H = 25, T = 24)",
     ".venv/bin/python -m bench.convergence --sparse-shape 25x24 --sparse-name density --inner-lrs 0.002 "
     "--sparse-contenders dp,int8_nesterov,sparse_average_lr2_k128,sparse_average_lr2_k256,"
     "sparse_average_lr2_k512,sparse_average_lr2_k1024", convergence_sparse),
    ("convergence_moments", "1h. Int8 AdamW moments vs float32 moments (issue 35)",
     ".venv/bin/python -m bench.convergence --only moments [--quick]", convergence_moments),
    *[(stem, title, cmd, convergence_sparse_issue37) for stem, title, cmd in ISSUE37],
    ("overlap_detection", "2b. Overlap: detection and false rejection with the eager schedule (issue 16)",
     "bench.overlap_detection", overlap_detection),
    ("attack", "2. Under attack: robust aggregation vs replay verification", "bench.attack", attack),
    ("communication", "3. Communication: bytes per host per outer step vs data-parallel",
     "bench.communication",
     communication),
    ("codecs", "4. Codecs", "bench.codecs", codecs_table),
    ("statecode", "4b. Opened training states coded against G_n (issue 35)", "bench.statecode", statecode),
    ("detection", "5. Verification cost vs detection", "bench.detection", generic),
    ("detection_windows", "5e. Detection under sampling windows (issue 34)",
     ".venv/bin/python -m bench.detection --windows", detection_windows),
    ("steering", "5c. Tolerance mode: steering left to a bounded budget, under every sample (issues 23, 36)",
     "bench.steering", steering_samples),
    ("steering_bf16", "5d. The same with bf16 autocast",
     ".venv/bin/python -m bench.steering --precision bf16", steering_samples),
    ("steering_issue23",
     "5c'. Before issue 36: every segment opened, the summed residuals over Σ wᵢ (issue 23)",
     ".venv/bin/python -m bench.steering (at 7ed6d71)", steering),
    ("steering_bf16_issue23", "5d'. The same with bf16 autocast, before issue 36",
     ".venv/bin/python -m bench.steering --precision bf16 (at 7ed6d71)", steering),
    ("collusion", "5b. Collusion: colluding verifiers vs stake-weighted draws, audits and disputes",
     "bench.collusion", collusion),
    ("collusion_windows", "5b'. Collusion under sampling windows (issue 34)",
     ".venv/bin/python -m bench.collusion --windows", collusion_windows),
    ("collusion_windows_norevote", "5b''. The same before revotes: a minority could win a windowed dispute",
     ".venv/bin/python -m bench.collusion --windows (at 12dffd0, before the revote rule)", collusion_windows),
    ("verification", "5f. Verification at devnet scale: sampling segments vs windows, measured and planned "
     "(issue 34)", ".venv/bin/python -m bench.verification", verification),
    ("host_overhead", "6. Host overhead: committed vs plain inner loop", "bench.host_overhead", generic),
    ("overlap", "6b. Overlap: host utilization and time to the same loss (devnet, issue 16)", "bench.overlap",
     overlap),
    ("overlap_h120", "6c. Overlap in the devnet with training longer than the post-training phases (H = 120)",
     ".venv/bin/python -m bench.overlap --steps 6 --extra 4 --inner-steps 120 --name overlap_h120", overlap),
    ("chain_tps", "7a. Chain: signed transactions per second over HTTP", "bench.chain_tps", generic),
    ("chain_sim", "7b. Chain: state machine with many hosts and verifiers", "bench.chain_sim", generic),
    ("chain_bft", "7c. Chain on CometBFT: 4 validators beside the embedded node", "bench.chain_bft",
     generic),
    ("scale", "8. Scale: the state pipeline at the largest GPT this box holds", "bench.scale", scale),
    ("plan", "9. Cost model: `gonka-diloco plan` against measurements, and the published plan", "bench.plan",
     plan),
    ("aggregation", "9b. Aggregation at large M: int8 vs the sparse codec (issue 26)", "bench.aggregation",
     aggregation),
    ("gpu_check", "10. GPU: bitwise replay, ≈1B throughput with commitments, device-vs-CPU noise",
     "python3 bench/gpu_check.py --out bench/results/gpu_check.json (on the GPU machine)", gpu_check),
    ("gpu_check_cpu", "10b. The same script on CPU (tiny sizes: what CI runs)",
     ".venv/bin/python -m bench.gpu_check --device cpu", gpu_check),
    ("fetch_slow_holder", "11a. Reliability: fetch time with a slow holder listed first (issue 22)",
     "bench.fetch_slow_holder", fetch_slow_holder),
    ("chaos", "11b. Reliability: chaos in the devnet",
     ".venv/bin/python -m bench.chaos --runs 6 --seed 0", chaos),
    ("chaos_hard", "11b'. The same, harsher: 12 kills 0–1.2 s apart",
     ".venv/bin/python -m bench.chaos --seed 400 --runs 8 --kills 12 --gap 0 1.2 --down 0 0.8 "
     "--name chaos_hard", chaos),
    ("soak", "11c. Reliability: soak, devnets in every overlap mode",
     ".venv/bin/python -m bench.soak --suites 0", soak),
    ("soak_suites", "11d. Reliability: soak, fresh-clone suites",
     ".venv/bin/python -m bench.soak --suites 3 --devnets 0 --name soak_suites", soak),
    ("soak_suites_first", "11d'. The first round of it, before its one failure was fixed at its cause",
     ".venv/bin/python -m bench.soak --suites 3 --devnets 0 --name soak_suites", soak),
    ("devnet_codec", "11e. The devnet with each Δ codec: an adversary rejected, the loss falling (issue 26)",
     "bench.devnet_codec", devnet_codec),
    ("devnet_codec_first", "11e'. Its first round, beside a full test suite (load ≈ 8): int8's honest hosts "
     "committed late (ErrLateCommit in their logs)",
     ".venv/bin/python -m bench.devnet_codec", devnet_codec),
    ("devnet_sparse_issue37", "11f. The devnet's sparse codec before and after issue 37 (adversary ef_forge)",
     ".venv/bin/python -m bench.devnet_codec --cases sparse:ef_forge@bench/devnet_sparse_issue26.toml,"
     "sparse:ef_forge,sparse:ef_forge@bench/devnet_sparse_average.toml --name devnet_sparse_issue37",
     devnet_sparse_issue37),
    ("suite_time", "11g. The suite's time: a fresh clone's `make test` on the 2 cores, unloaded",
     ".venv/bin/python -m bench.soak --suites 1 --devnets 0 --burners 0 --name suite_time", soak),
    ("hashing", "Hashing throughput", "bench.hashing", generic),
    ("calibration", "Tolerance calibration (1 vs 2 threads)", ".venv/bin/gonka-diloco verifier calibrate "
     "--out bench/results/calibration.json", generic),
]  # fmt: skip


def _dp_clause(b: dict[str, Any], i8: dict[str, Any]) -> str:
    """How many times its bytes data-parallel needs to reach the loss: only where the run had it."""
    dp, dp8 = _nan(b["ratio_vs_dp_at_equal_loss"]), _nan(i8["ratio_vs_dp_at_equal_loss"])
    if dp != dp or dp8 != dp8:  # NaN: no data-parallel contender in that run
        return ""
    return f"; data-parallel needs {dp:,.0f}× its bytes to reach its loss (int8: {dp8:,.0f}×)"


def verification_goals(rows: list[dict[str, Any]]) -> Lines:
    """Issues 34 and 35 at 30B on 64 hosts, at the chain's defaults (int8 Δ, int8 moments), and with
    fp32 moments."""
    from bench.plan import VERIFICATION_GOALS as g
    from protocol.config import DEFAULT_MOMENTS

    out = []
    for r in (r for r in rows if r["codec"] == "int8"):
        ok = all(r[k] <= g[k] for k in ("states_per_contribution", "replay_share")) and all(
            r[k] >= g[k] for k in ("utilization", "one_segment", "half_fake"))
        which = ("the chain's defaults" if r["moments"] == DEFAULT_MOMENTS.value
                 else f"defaults with {r['moments']} moments")  # fmt: skip
        out.append(f"- verification at 30B, 64 hosts, {which}: "
                   f"{r['states_per_contribution']:.2f} states per contribution (goal ≤ 7; issue 35's aim "
                   f"≤ 3: **{'met' if r['states_per_contribution'] <= 3 else 'NOT met'}**), replay "
                   f"{100 * r['replay_share']:.1f}% of host compute (≤ 25%), utilization "
                   f"{100 * r['utilization']:.1f}% overlapped (≥ 90%), one-segment fake caught "
                   f"{100 * r['one_segment']:.1f}% (≥ 20%), half-fake {100 * r['half_fake']:.1f}% (≥ 99%); "
                   f"issue 34's floors together: **{'met' if ok else 'NOT met'}**")  # fmt: skip
    return out


def sparse_goals(res: dict[str, Any]) -> Lines:
    """Issue 26: the sparse codec's size, its convergence against int8 DiLoCo, aggregation at 256 hosts."""
    out = []
    cd = res.get("codecs") or {}
    row = next((r for r in cd.get("rows", []) if r["codec"] == "sparse"), None)
    if row:
        same = (row["chunk"], row["topk"])
        big = [r for r in cd.get("sparse_layouts", []) if (r["chunk"], r["topk"]) == same]
        at = "".join(f"; {r['model']} layout {r['ratio_vs_fp32']:.0f}× ({r['ratio_vs_int8']:.1f}× vs int8)"
                     for r in big)  # fmt: skip
        ok = min([row["ratio_vs_fp32"], *(r["ratio_vs_fp32"] for r in big)]) >= 100
        out.append(f"- sparse codec, top-{row['topk']} of {row['chunk']}: {row['ratio_vs_fp32']:.0f}× fewer "
                   f"bytes than fp32 on the real Δ{at} (goal ≥ 100×: **{'met' if ok else 'NOT met'}**)")
    shapes: dict[tuple[int, int, int], list[tuple[dict[str, Any], dict[str, Any]]]] = {}
    for stem in sorted(k for k in res if k.startswith("convergence_sparse")):
        s = res[stem]["setting"]
        st, best = s["setup"], s["best"]
        if "int8_nesterov" not in best:
            continue
        key = (st["hosts"], st["inner_steps"], st["outer_steps"])
        shapes.setdefault(key, []).extend(
            (b, best["int8_nesterov"]) for n, b in best.items() if n.startswith("sparse"))
    for (m, h, t), rows in sorted(shapes.items(), key=lambda e: (e[0][1], e[0][2])):
        # the best at the codec's own density (≥ 20× fewer bytes than int8; k = 64 of 4096 here)
        sparse = [(b, i8) for b, i8 in rows if b["bytes_vs_int8"] >= 20]
        if not sparse:
            continue
        b, i8 = min(sparse, key=lambda e: e[0]["final_val_loss"] / e[1]["final_val_loss"])
        x = b["final_val_loss"] / i8["final_val_loss"]
        met = x <= 1.01 and b["bytes_vs_int8"] >= 25
        out.append(f"- sparse + error feedback vs int8 DiLoCo (M = {m}, H = {h}, T = {t}): best sparse "
                   f"{b['label']} {b['final_val_loss']:.4f} = {x:.3f}× int8's {i8['final_val_loss']:.4f} at "
                   f"{b['bytes_vs_int8']:.1f}× fewer bytes (goal, issue 37: ≤ 1.01× at ≥ 25×: "
                   f"**{'met' if met else 'NOT met'}**){_dp_clause(b, i8)}")  # fmt: skip
    ag = res.get("aggregation") or {}
    r = next((r for r in ag.get("rows", []) if r["codec"] == "sparse" and r["hosts"] == 256), None)
    if r:
        ok = r["aggregate_over_train"] <= 0.5
        out.append(f"- aggregation at 30B, 256 hosts, 1 Gbit/s, sparse: {r['aggregate_s'] / 3600:.2f} h "
                   f"= {100 * r['aggregate_over_train']:.1f}% of the {r['train_s'] / 3600:.2f} h of training "
                   f"(goal ≤ 50%: **{'met' if ok else 'NOT met'}**)")  # fmt: skip
    return out


def collusion_windows_goals(cw: dict[str, Any]) -> Lines:
    """Under sampling windows (the default) a fake Δ is a one-block fake of the last block: its
    coalition floor is a catch of ≥ ONE_SEGMENT_CAUGHT·(1 − COALITION) at σ = COALITION
    (`gonka_diloco.plan.WINDOW_FAKE_DELTA_CAUGHT`), judged on the worst minority cell measured."""
    if cw.get("fake_delta_rule") != "ends_at_theta_h":
        return []
    from gonka_diloco.plan import COALITION, WINDOW_FAKE_DELTA_CAUGHT

    v, p, a = (cw["windows"][0][k] for k in ("v", "p", "a"))  # the defaults, as its faked-segment cells
    minority = [r for r in cw["rows"] if r["share"] < COALITION and (r["v"], r["p"], r["a"]) == (v, p, a)]
    if not minority:
        return []
    worst = max(minority, key=lambda r: r["pass_exact"])
    caught = 1 - worst["pass_exact"]
    return [f"- collusion under sampling windows (the default; only the check that ends at θ_H checks Δ, so "
            f"a fake Δ is a one-block fake of the last block): with {100 * worst['share']:.0f}% of "
            f"{worst['keys']} keys it reaches the model in {100 * worst['passed']:.1f}% of outer steps "
            f"({100 * worst['pass_exact']:.1f}% exact), caught in {100 * caught:.1f}% (goal ≥ "
            f"{100 * WINDOW_FAKE_DELTA_CAUGHT:.0f}% at ½: "
            f"**{'met' if caught >= WINDOW_FAKE_DELTA_CAUGHT else 'NOT met'}**; ≤ 1% is out of reach); "
            f"faking's expected profit {worst['profit_exact_R']:+.3f} R per outer step (goal < 0: "
            f"**{'met' if worst['profit_exact_R'] < 0 else 'NOT met'}** at the default bonds)"]


def goals(res: dict[str, Any]) -> Lines:
    """The issue's goals, judged from the figures above (never asserted by hand)."""
    out = []
    if c := res.get("convergence"):
        for s in c["settings"]:
            if a := s.get("agreement"):
                h = s["setup"]["inner_steps"]
                out.append(f"- (b) ours and (c) torchft agree within noise (H = {h}): "
                           f"**{'met' if a['within_noise'] else 'NOT met'}**")  # fmt: skip
    if a := res.get("attack"):
        for name, g in a["goals"].items():
            robust = ", ".join(f"{x:+.2f}%" for x in g["robust_gaps_pct"] if x is not None)
            met = "met" if g["ours_within_1pct"] else "NOT met"
            out.append(f"- {name}: (h) within 1% of honest-only **{met}**"
                       f"; (d) mean {g['mean_gap_pct']:+.2f}%; (e)–(g) {robust}")  # fmt: skip
    if cm := res.get("communication"):
        for t in cm["codec_tables"]:
            if t["H"] == 500:
                r = next(r for r in t["rows"] if r["codec"] == "int8")
                out.append(f"- bytes per outer step, int8, H = 500: {r['ratio']:.0f}× fewer than "
                           f"data-parallel for the same H steps; counting the verification traffic too: "
                           f"{r['ratio_with_verification']:.0f}×")  # fmt: skip
        for e in cm.get("equal_loss", []):
            if e["H"] == 500:
                bound = "" if e["dp_reached"] else " (lower bound)"
                met = "met" if e["ratio"] >= 1000 else "NOT met"
                start = (f"from a {e['warm_start']}-step data-parallel warm start (as the DiLoCo paper)"
                         if e.get("warm_start") else "from random init")  # fmt: skip
                out.append(f"- **ratio at equal final loss**, int8, H = 500, {start}: "
                           f"{e['ratio']:.0f}×{bound} "
                           f"against {e['dp_baseline']} (goal ≥ 1000×: **{met}**)")  # fmt: skip
    sweeps = sorted(k for k in res if k.startswith("convergence_sweep"))
    for s in (s for k in sweeps for s in res[k].get("settings", [])):
        if b := s.get("best"):
            st = s["setup"]
            shape = f"M = {st['hosts']}, H = {st['inner_steps']}, T = {st['outer_steps']}"
            start = ("from a warm start" if s["start"] == "warm" else "from scratch") + f" ({shape})"
            if s["start"] == "warm":
                out.append(f"- tuned, Llama-tiny, {start}: DiLoCo's final loss ≤ data-parallel's at equal "
                           f"compute: **{'met' if b['diloco_le_dp'] else 'NOT met'}** "
                           f"({b['diloco_loss']:.4f} vs {b['dp_loss']:.4f})")  # fmt: skip
            bound = "" if b["dp_reached"] else " (lower bound)"
            out.append(f"- tuned, Llama-tiny, {start}: bytes to equal loss "
                       f"{b['ratio_at_equal_loss']:,.0f}×{bound} "
                       f"fewer than data-parallel (goal ≥ 1000×: "
                       f"**{'met' if b['ratio_at_equal_loss'] >= 1000 else 'NOT met'}**)")  # fmt: skip
    if (ov := res.get("overlap_convergence")) and "goal" in ov:
        st = ov["setup"]
        by = {r["contender"]: r for r in ov["rows"]}
        plain = by.get("delayed", {})  # the removed delayed schedule: in historical results only
        gap = plain.get("loss_vs_none_pct")
        fixes = [c for c in ov["goal"]["delayed_variants_within_1pct"] if c.startswith("delayed_")]
        speed = [t for t in ov.get("time_model", []) if t["contender"] == "delayed"]
        sp = "; ".join(f"{t['speedup']:.2f}× to the same loss ({t['scenario']}: train {t['train_s']:g} s, "
                       f"post {t['post_s']:g} s)" for t in speed)  # fmt: skip
        met = "met" if ov["goal"]["plain_delayed_within_1pct"] else "NOT met"
        remedies = [r for r in ov["rows"] if r["contender"].startswith("delayed_") and "final_val_loss" in r]
        ranked = sorted(remedies, key=lambda r: r["loss_vs_none_pct"])
        if ranked and not fixes:
            best = ranked[0]
            fixes_note = (f"; best remedy tried: {best['contender']} (outer lr {best['outer_lr']:g}, "
                          f"μ {best['outer_momentum']:g}) {best['loss_vs_none_pct']:+.2f}%")  # fmt: skip
        else:
            fixes_note = f"; within 1% with {', '.join(fixes)}" if fixes else ""
        if gap is not None:
            out.append(f"- overlap, delayed vs none at equal compute (M = {st['hosts']}, "
                       f"H = {st['inner_steps']}, T = {st['outer_steps']}): final loss {gap:+.2f}% "
                       f"(goal ≤ 1%: **{met}**" + fixes_note
                       + f"); time model (plain delayed; removed, issue 22): {sp}")  # fmt: skip
        if (eager := by.get("eager")) and "loss_vs_none_pct" in eager:
            ok = "met" if eager["within_1pct"] else "NOT met"
            gap_eager = eager["loss_vs_none_pct"]
            dial = ov["goal"].get("mid_step_result_dial") or []
            dial_note = (
                "; research, not in the protocol: step n − 1's result applied at inner step c·H of step n: "
                + ", ".join(f"c = {c:g} {p:+.1f}%" for c, p in dial)
                if dial
                else ""
            )
            out.append(f"- overlap, eager (the protocol's α) vs none: final loss {gap_eager:+.2f}% "
                       f"(goal ≤ 1%: **{ok}**{dial_note})")  # fmt: skip
    if (od := res.get("overlap_detection")) and "rows" in od:
        hosts = od["setup"]["hosts"]
        out.append(f"- overlap, detection and false rejection (M = {hosts}, {od['adversaries']} "
                   f"liars, 4 attacks): unchanged between sequential and eager (100% caught, no honest "
                   f"rejection): **{'met' if od['unchanged'] else 'NOT met'}**")  # fmt: skip
    devnets = (("overlap", ""), ("overlap_h120", ", H = 120: training longer than the phases after it"))
    for key, setting in devnets:
        if not ((dv := res.get(key)) and "goals" in dv):
            continue
        over = dv.get("modes", ["none", "delayed"])[1]
        sp = dv.get("speedup_to_same_loss")
        util = dv[over]["utilization_span"]
        out.append(f"- overlap in the devnet ({over}{setting}): utilization {100 * util:.0f}% "
                   f"(goal ≥ 80%: **{'met' if util >= 0.8 else 'NOT met'}**); "
                   f"{dv['step_period_speedup']:.2f}× fewer seconds per outer step; wall-clock to the "
                   f"sequential run's final loss {f'{sp:.2f}×' if sp else 'not reached'} (goal ≥ 1.5×: "
                   f"**{'met' if sp and sp >= 1.5 else 'NOT met'}**)")  # fmt: skip
    h = res.get("host_overhead") or {}
    if "overhead" in h:
        crit = 100 * h.get("critical_path_overhead", float("nan"))
        wall = 100 * h["overhead"]
        out.append(f"- host overhead: {wall:.1f}% wall-clock (critical path {crit:.2f}%), goal ≤ 3%")
    if (pl := res.get("plan")) and "rows" in pl:
        judged = [r for r in pl["rows"] if r["within_20pct"] is not None]
        ok = sum(1 for r in judged if r["within_20pct"])
        out.append(f"- cost model: {ok} of {len(judged)} predictions within 20% of the measurement "
                   "(the rest explained in section 9)")  # fmt: skip
        p30 = next((x["plan"] for x in pl.get("published", []) if x["params"] == 30e9 and x["plan"]), None)
        if p30:
            u = p30["utilization"]["overlapped"]
            out.append(f"- 30B on 8×H100 hosts at 1 Gbit/s, predicted: {100 * u:.0f}% compute utilization "
                       f"with overlap, {100 * p30['utilization']['sequential']:.0f}% without (goal ≥ 90%: "
                       f"**{'met' if u >= 0.9 else 'NOT met'}** by the plan)")  # fmt: skip
        out += verification_goals(pl.get("verification_defaults") or [])
    if sc := res.get("scale"):
        size = f"{sc['params'] / 1e6:.0f}M params"
        dl = [p["download_ratio"] for p in sc["per_step"] if p["download_ratio"] is not None]
        out.append(f"- scale ({size}): peak RSS ÷ live state host {sc['host_peak_rss_ratio']}, verifier "
                   f"{sc['verifier_peak_rss_ratio']} (goal ≤ 2.0); hashing "
                   f"{sc.get('hash_efficiency', sc.get('hashing_ratio'))} of all "
                   f"cores (goal ≥ 0.8); disk {sc['host_disk_peak_states']} states (goal ≤ "
                   f"{sc['disk_goal_states']:g}); verifier download {max(dl) if dl else 0} of what it "
                   f"cannot rebuild (goal ≤ 1.05); training-thread overhead "
                   f"{100 * (sc['protocol_overhead'] or 0):.1f}% (goal ≤ 3%)")  # fmt: skip
    g = res.get("gpu_check") or {}
    if (rp := g.get("replay")) and "cases" in rp:
        eq = ", ".join(f"{c['case']} {'yes' if c.get('other_process_equal') else 'NO'}" for c in rp["cases"])
        out.append(f"- GPU ({g.get('gpu')}): a segment replays bitwise in a second process: {eq}")
    if (tp := g.get("throughput")) and "overhead_hashed" in tp:
        over = {k.removeprefix("overhead_"): v for k, v in tp.items() if k.startswith("overhead_")}
        parts = [f"{k} {100 * v:+.1f}%" for k, v in over.items()]
        off = next((r for r in tp["runs"] if r.get("run") == "commitments off"), {})
        out.append(f"- GPU commitments overhead at {tp['n_params'] / 1e9:.2f}B params "
                   f"({off.get('tokens_per_s')} tokens/s, MFU {100 * off.get('mfu', 0):.1f}% off): "
                   f"{', '.join(parts)}; goal ≤ 3%")  # fmt: skip
    if cl := res.get("collusion"):
        dd = cl["defaults"]
        w = dd["every_minority"]
        both = dd["fake_below_1pct_every_minority"] and dd["profit_negative_every_minority"]
        out.append(f"- collusion, defaults v = {dd['v']}, p = {dd['p']}, a = {dd['a']}, sampling segments: "
                   f"for accomplices holding any minority of the verifier stake a fake reaches the model "
                   f"in ≤ 1% of outer steps (≤ {100 * w['pass_bound_sup']:.2f}% bound, "
                   f"≤ {100 * w['pass_exact_max']:.2f}% exact) and faking has negative expected profit: "
                   f"**{'met' if both else 'NOT met'}**")  # fmt: skip
    out += collusion_windows_goals(res.get("collusion_windows") or {})
    out += steering_goals(res)
    out += sparse_goals(res)
    tps = res.get("chain_tps") or {}
    if "committed_tps" in tps:
        out.append(f"- chain: {tps['committed_tps']} committed tx/s (goal {tps.get('goal_tps', '?')})")
    if bft := res.get("chain_bft"):
        rows = {r["engine"].split()[0]: r for r in bft["throughput"]}
        walls = {r["engine"]: r["wall_s"] for r in bft["devnet"]}
        bft_row, emb_row = rows["cometbft"], rows["embedded"]
        out.append(f"- chain on CometBFT ({bft['cometbft']}, 4 validators): {bft_row['committed_tps']} "
                   f"committed tx/s (embedded: {emb_row['committed_tps']}); {bft_row['blocks_per_s']} "
                   f"blocks/s at a {bft_row['block_interval']} s interval; devnet wall time "
                   f"{walls.get('cometbft')} s (embedded {walls.get('embedded')} s)")  # fmt: skip
    if (sim := res.get("chain_sim")) and "node_ms_per_block_mean" in sim:
        last, first = sim["node_ms_per_block_last_outer_step"], sim["node_ms_per_block_first_outer_step"]
        cpu = sim.get("node_cpu_ms_per_block_last_outer_step", float("nan"))
        idle = sim.get("idle_block_after_history_ms", float("nan"))
        kb, persist = sim["persist_bytes_per_block_mean"] / 1e3, sim["persist_ms_mean"]
        old_ms, old_mb = sim["sampled_json_persist_ms_mean"], sim["state_json_bytes"] / 1e6
        # flat in history: judged on CPU time (immune to the other processes sharing the machine)
        # over the last five outer steps against the first five, when the run recorded it
        ratio = sim.get("node_cpu_ms_last5_over_first5_outer_steps", last / first)
        busy = sim.get("node_cpu_ms_per_busy_block_mean")
        busy_txt = f"; a busy block (messages or phase work) {busy:.0f} ms CPU on average" if busy else ""
        out.append(f"- chain node at {sim['hosts']} hosts after {sim['outer_steps']} outer steps: "
                   f"{last:.0f} ms per block over the last outer step (goal ≤ 50 ms: "
                   f"**{'met' if last <= 50 else 'NOT met'}**; CPU {cpu:.0f} ms), {first:.0f} ms over the "
                   f"first (flat in history: **{'met' if ratio <= 1.2 else 'NOT met'}**, CPU last 5 / "
                   f"first 5 outer steps {ratio:.2f}){busy_txt}; an idle "
                   f"block after the whole history {idle:.0f} ms; persistence {persist:.0f} ms and {kb:.0f} "
                   f"kB per block (whole-state JSON: {old_ms:.0f} ms, {old_mb:.0f} MB)")  # fmt: skip
    return [*out, ""]


def _runs() -> dict[str, list[tuple[Path, Any]]]:
    runs: dict[str, list[tuple[Path, Any]]] = {}
    for p in sorted(RESULTS.glob("*.json")):
        stem = p.name.removesuffix(".json").removesuffix(".full")
        try:
            d = json.loads(p.read_text())
        except json.JSONDecodeError as e:
            d = {"error": f"unreadable: {e}"}
        runs.setdefault(stem, []).append((p, d))
    for stem, found in runs.items():
        # the full run first; drop the plain file when it is that same full run
        found.sort(key=lambda pd: (not pd[0].name.endswith(".full.json"), pd[0].name))
        if len(found) == 2 and not (isinstance(found[1][1], dict) and found[1][1].get("quick")):
            runs[stem] = found[:1]
    return runs


def render_only(stems: list[str]) -> Path:
    """Re-render the named sections of RESULTS.md in place (each from its `## title` to the next
    `## `), leaving every other section, and the goals, as they are."""
    runs = _runs()
    text = OUT.read_text()
    for stem, title, module, render in SECTIONS:
        if stem not in stems:
            continue
        head = f"## {title}\n"
        if head not in text:  # a new section: in SECTIONS' order, before the next one already there
            later = [f"## {t}\n" for _, t, _, _ in SECTIONS[[s[0] for s in SECTIONS].index(stem) + 1 :]]
            at = min((i for h in later if (i := text.find(h)) >= 0), default=len(text))
            text = text[:at] + head + "\n" + text[at:]
        a = text.index(head)
        b = text.find("\n## ", a + len(head))
        body = "\n".join(_section(runs.get(stem, []), title, module, render)).rstrip() + "\n"
        text = text[:a] + body + (text[b:] if b >= 0 else "")
    if "goals" in stems:  # the goals list, judged as `main` judges it (full runs first)
        a = text.index("## Goals\n")
        b = text.find("\n## ", a + 1)
        best = {stem: found[0][1] for stem, found in runs.items()}
        lead = "Judged from the figures below (the full run where there is one, else the quick run)."
        body = "\n".join(["## Goals", "", lead, "", *goals(best)]).rstrip() + "\n"
        text = text[:a] + body + text[b:]
    if "sparse_gap" in stems:  # issue 37's table, derived from its runs: right after the last of them
        head = f"## {GAP_TITLE}\n"
        if head not in text:
            last = max(text.index(f"## {t}\n") for st, t, _ in ISSUE37 if f"## {t}\n" in text)
            at = text.find("\n## ", last + 1) + 1
            text = text[:at] + head + "\n" + text[at:]
        a = text.index(head)
        b = text.find("\n## ", a + len(head))
        body = "\n".join([f"## {GAP_TITLE}", "", *sparse_gap(runs)]).rstrip() + "\n"
        text = text[:a] + body + (text[b:] if b >= 0 else "")
    OUT.write_text(text)
    print(f"wrote {OUT} ({', '.join(stems)})")
    return OUT


def main(quick: bool = False) -> Path:
    """Quick and full results live side by side: `<name>.json` is the latest run, `<name>.full.json`
    the latest full run of the modules that keep one. Goals are judged on the full run if any."""
    runs = _runs()
    best = {stem: found[0][1] for stem, found in runs.items()}
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# Benchmark results",
        "",
        f"Generated {now} by `.venv/bin/python -m bench.report` from `bench/results/*.json`. "
        "`make bench-quick` (`python -m bench --quick`) makes every table in minutes with small inputs; "
        "`make bench` runs the full sizes (up to an hour on 2 cores). Every table says whether it comes "
        "from a *quick* or a *full* run and the command that reproduces it; quick figures are real "
        "measurements at the smaller size.",
        "",
        "Machine: 2 CPU cores, torch CPU, 1 training thread per process; contenders of one comparison run "
        "in the same invocation and are reported side by side.",
        "",
        "## Goals",
        "",
        "Judged from the figures below (the full run where there is one, else the quick run).",
        "",
        *goals(best),
    ]
    known = set()
    for stem, title, module, render in SECTIONS:
        known.add(stem)
        lines += _section(runs.get(stem, []), title, module, render)
        if stem == ISSUE37[-1][0]:
            lines += [f"## {GAP_TITLE}", "", *sparse_gap(runs)]
        if stem == "convergence_sweep":  # the same sweep run longer (`--outer-steps T`), right after it
            for longer in sorted((s for s in runs if s.startswith("convergence_sweep_T")), key=len):
                known.add(longer)
                t = longer.removeprefix("convergence_sweep_T")
                d = runs[longer][0][1]
                lrs = ",".join(f"{x:g}" for x in d.get("inner_lrs", []))
                warm_only = " --warm-only" if all(s["start"] == "warm" for s in d.get("settings", [])) else ""
                cmd = f".venv/bin/python -m bench.convergence --outer-steps {t} --inner-lrs {lrs}{warm_only}"
                lines += _section(runs[longer], f"1c. The same, longer: T = {t} outer steps", cmd, render)
    for stem in sorted(set(runs) - known):
        lines += _section(runs[stem], stem, f"bench.{stem}", generic)
    OUT.write_text("\n".join(lines).rstrip() + "\n")
    print(f"wrote {OUT}")
    return OUT


def _when(path: Path, d: Any) -> str:
    """When a result was made: its own `utc` field, else the commit that last changed the file
    (a clone's file times are the clone's), else the file time for a result not yet committed."""
    if isinstance(d, dict) and isinstance(d.get("utc"), str):
        return d["utc"].removesuffix(" UTC")
    try:
        dirty = subprocess.run(["git", "status", "--porcelain", "--", path.name], cwd=path.parent,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        out = "" if dirty else subprocess.run(
            ["git", "log", "-1", "--format=%ct", "--", path.name], cwd=path.parent,
            capture_output=True, text=True, timeout=10).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        out = ""
    stamp = int(out) if out.isdigit() else path.stat().st_mtime
    return datetime.fromtimestamp(stamp, UTC).strftime("%Y-%m-%d %H:%M")


def _section(found: list[tuple[Path, Any]], title: str, module: str, render: Callable[[Any], Lines]) -> Lines:
    out = [f"## {title}", ""]
    if not found:
        cmd = module if " " in module else f".venv/bin/python -m {module}"
        return [*out, f"No results yet: run `{cmd}`.", ""]
    for path, d in found:
        mtime = _when(path, d)
        q = isinstance(d, dict) and d.get("quick")
        cmd = module if " " in module else f".venv/bin/python -m {module}{' --quick' if q else ''}"
        out += [f"*{'quick' if q else 'full'} run, {mtime} UTC* — reproduce: `{cmd}`", ""]
        try:
            out += render(d)
        except (KeyError, TypeError, ValueError, StopIteration) as e:
            out += [f"(could not render: {type(e).__name__}: {e})", "", *generic(d)]
    return out


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="render bench/RESULTS.md from bench/results/*.json")
    parser.add_argument("--only", help="comma-separated result names: re-render just their sections")
    args = parser.parse_args()
    if args.only:
        render_only(args.only.split(","))
    else:
        main()
