"""`gonka-diloco plan`: what a run costs and how safe it is, before a cluster-month is spent.

Inputs come from flags, or from a run config TOML (as for `run create`) with flags on top. The
maths is `gonka_diloco.plan`; machine constants come from `bench/results/*.json` and are shown
with their source. Only typer, rich and the pure model are imported for `--help`: torch is
loaded only to count a TOML model's parameters when `--params` is not given.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from gonka_diloco.plan import (
    COALITION,
    FAKE_DELTA_CEILING,
    GPUS,
    HALF_FAKE_CAUGHT,
    ONE_SEGMENT_CAUGHT,
    REPLAY_BUDGET,
    Constants,
    Floors,
    Gpu,
    Inputs,
    PhaseBlocks,
    Pipeline,
    Plan,
    Sharding,
    WindowChoice,
    choose_window,
    coalition_caught_floor,
    plan,
    sweep,
    token_budget,
)
from protocol.config import Codec, ReplayMode, Sampling
from protocol.inner import Moments

app = typer.Typer(help="Plan a run: time, bytes, disk, memory, detection and deterrence per outer step.")

D = Inputs()
F = Floors()
NGONKA = 1e9


class PlanInputError(ValueError):
    """A flag or the run config cannot be understood; the message says which and why."""


# ---------------------------------------------------------------- units

_SI = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "p": 1e15}
_BIN = {"ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}
_NUM = r"(\d+(?:\.\d*)?(?:e[+-]?\d+)?|\.\d+(?:e[+-]?\d+)?)"


def parse_count(text: str) -> float:
    """'30e9', '30B', '1.3b', '500M', '1Mi' (binary), '1e6' → a number."""
    m = re.fullmatch(_NUM + r"\s*(ki|mi|gi|ti|k|m|b|g|t)?", text.strip().lower())
    if not m:
        raise PlanInputError(f"not a number: {text!r} (e.g. 30e9, 30B, 500M, 1Mi)")
    unit = m.group(2) or ""
    factor = _BIN[unit] if unit in _BIN else _SI["g" if unit == "b" else unit]
    return float(m.group(1)) * factor


def parse_bytes(text: str) -> float:
    """'30TB', '64MiB', '2e12', '500GB' → bytes."""
    m = re.fullmatch(_NUM + r"\s*([kmgtp]i?)?b?", text.strip().lower())
    if not m:
        raise PlanInputError(f"not a size: {text!r} (e.g. 30TB, 64MiB)")
    unit = m.group(2) or ""
    return float(m.group(1)) * (_BIN[unit] if unit in _BIN else _SI[unit])


def parse_rate(text: str) -> float:
    """Link or disk speed → bytes per second. A lower-case b or 'bit' is bits, an upper-case B is
    bytes: '1Gbit', '1 Gbps', '100Mb/s', '2GB/s', '125MBps'."""
    m = re.fullmatch(r"(?i:" + _NUM + r")\s*([kKmMgGtT]?)(bits?(?:/s)?|bps|b/s|B/s|Bps|B)", text.strip())
    if not m:
        raise PlanInputError(f"not a rate: {text!r} (e.g. 1Gbit, 10Gbps, 2GB/s)")
    value = float(m.group(1)) * _SI[m.group(2).lower()]
    unit = m.group(3)
    return value / 8 if unit.startswith("bit") or unit in ("bps", "b/s") else value


# ---------------------------------------------------------------- formatting


def fmt_bytes(x: float) -> str:
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(x) >= size:
            return f"{x / size:.3g} {unit}"
    return f"{x:.0f} B"


def fmt_seconds(x: float) -> str:
    if math.isinf(x):
        return "∞"
    if x >= 86400:
        return f"{x / 86400:.3g} d"
    if x >= 3600:
        return f"{x / 3600:.3g} h"
    if x >= 60:
        return f"{x / 60:.3g} min"
    return f"{x:.3g} s"


def fmt_pct(x: float) -> str:
    return f"{100 * x:.3g}%" if x >= 1e-3 or x == 0 else f"{100 * x:.2e}%"


def fmt_gnk(x: float) -> str:
    return "∞" if math.isinf(x) else f"{x:,.4g} GNK"


# ---------------------------------------------------------------- inputs


def from_run_config(path: Path) -> tuple[dict[str, Any], Any]:
    """Inputs fields from a run config TOML, read and validated exactly as `run create` reads it
    (`run_cli.parse_run_config`: presets expanded, the hashes not needed), and its model spec."""
    from gonka_diloco.run_cli import RunConfigFileError, parse_run_config

    try:
        cfg = parse_run_config(path)
    except RunConfigFileError as e:
        raise PlanInputError(str(e)) from None
    ph, st = cfg.phases, cfg.stake
    fields = {
        "H": cfg.inner_steps, "k": cfg.segment_len, "s": cfg.sampled_segments, "sampling": cfg.sampling,
        "w": cfg.window_segments, "moments": cfg.inner.moments,
        "v": cfg.verifiers_per_contribution, "audit_p": cfg.audit_bps / 10_000,
        "auditors": cfg.audit_verifiers, "codec": cfg.codec, "replay": cfg.replay_mode,
        **({"codec_chunk": cfg.codec_block_size, "codec_topk": cfg.sparse_topk}
           if cfg.codec is Codec.SPARSE else {}),
        "tokens_per_step": cfg.batch_size * cfg.seq_len,
        "phases": PhaseBlocks(train=ph.train_blocks, reveal=ph.reveal_blocks, verify=ph.verify_blocks),
        "epoch_blocks": ph.epoch_length, "poc_blocks": ph.poc_window,
        "host_stake": st.min_host_stake / NGONKA, "host_slash_bps": st.host_slash_bps,
        "audit_slash_bps": st.fraud_host_slash_bps, "reward": st.reward_per_outer_step / NGONKA,
    }  # fmt: skip
    return fields, cfg.model


def count_params(spec: Any) -> int:
    """Parameters of a run's model, counted on torch's meta device: the model is built (every
    factory, any size) but no memory is allocated and nothing is initialised."""
    import torch

    from replay.spec import BadModelSpec, ModelNotAllowed, build_model

    try:
        with torch.device("meta"):
            return sum(p.numel() for p in build_model(spec).parameters())
    except (BadModelSpec, ModelNotAllowed, ValueError) as e:
        raise PlanInputError(f"model: {e}; give --params instead") from None


def build_inputs(config: Path | None, flags: dict[str, Any]) -> Inputs:
    """Defaults, then the run config, then every flag that was set."""
    fields: dict[str, Any] = {}
    spec = None
    if config is not None:
        fields, spec = from_run_config(config)
    gpu_name = flags.pop("gpu", None) or "h100"
    if gpu_name not in GPUS:
        raise PlanInputError(f"unknown --gpu {gpu_name!r}; known: {', '.join(GPUS)} (or --peak-tflops)")
    gpu = GPUS[gpu_name]
    peak, memory = flags.pop("peak_tflops", None), flags.pop("gpu_memory", None)
    if peak is not None or memory is not None:
        gpu = Gpu(f"{gpu.name} (overridden)", peak * 1e12 if peak else gpu.peak_flops,
                  parse_bytes(memory) if memory else gpu.memory)  # fmt: skip
    fields["gpu"] = gpu
    for key, parse in (
        ("params", parse_count),
        ("tokens_per_step", parse_count),
        ("micro_tokens", parse_count),
        ("up", parse_rate),
        ("down", parse_rate),
        ("disk_write", parse_rate),
        ("disk_budget", parse_bytes),
        ("host_ram", parse_bytes),
        ("chunk_bytes", parse_bytes),
    ):
        if flags.get(key) is not None:
            value = parse(flags.pop(key))
            fields[key] = int(value) if key in ("tokens_per_step", "micro_tokens") else value
        flags.pop(key, None)  # fmt: skip
    fields.update({k: v for k, v in flags.items() if v is not None})
    if "params" not in fields:
        fields["params"] = float(count_params(spec)) if spec is not None else D.params
    i = replace(D, **fields)
    _check(i)
    return i


def _check(i: Inputs) -> None:
    problems = []
    if i.H % i.k:
        problems.append(f"H = {i.H} is not a multiple of k = {i.k}")
    elif i.n < 1:
        problems.append(f"H = {i.H} must be at least k = {i.k}")
    elif i.sampling is Sampling.SEGMENTS and not 1 <= i.s <= i.n:
        problems.append(f"s = {i.s} must be between 1 and H/k = {i.n}")
    if i.w < 1:
        problems.append("w (--window-segments) must be positive")
    for name in (
        "params",
        "hosts",
        "gpus_per_host",
        "mfu",
        "up",
        "down",
        "disk_write",
        "tokens_per_step",
        "block_seconds",
        "m",
        "v",
        "cpu_cores",
    ):
        if getattr(i, name) <= 0:
            problems.append(f"{name} must be positive")  # fmt: skip
    for name in ("fake_fraction", "dishonest_stake", "audit_p"):
        if not 0 <= getattr(i, name) <= 1:
            problems.append(f"{name} must be in [0, 1]")
    if i.mfu > 1:
        problems.append("mfu must be at most 1")
    if problems:
        raise PlanInputError("; ".join(problems))


# ---------------------------------------------------------------- rendering


KIND_WORDS = {"start": "starts", "optimizer": "carried optimizer", "theta_h": "θ_H", "claims": "claims + Δ",
              "ef": "e"}  # fmt: skip


def _by_kind(kinds: dict[str, float]) -> str:
    """`plan.states_by_kind`, its nonzero parts: where the states go."""
    parts = [f"{KIND_WORDS.get(k, k)} {v:.3g}" for k, v in kinds.items() if v > 0]
    return f" ({', '.join(parts)})" if parts else ""


def plan_rows(p: Plan) -> list[tuple[str, str, str]]:
    """(section, figure, value) for the main table."""
    c, n, ver, h, dk, mem = p.compute, p.network, p.verification, p.hashing, p.disk, p.memory
    tl, u, sec, i = p.timeline, p.utilization, p.security, p.inputs
    rows = [
        ("compute", "inner step", fmt_seconds(c["inner_step_s"])
         + (f" + {fmt_seconds(c['overhead_per_step_s'])} offload" if c["overhead_per_step_s"] else "")),
        ("compute", f"training (H = {i['H']})", fmt_seconds(tl["train"])),
        ("network", "Δ blob per host", f"{fmt_bytes(n['delta_bytes'])} ({i['codec']}); upload "
         f"{fmt_seconds(n['delta_upload_s'])}"),
        ("network", "aggregation", f"download {fmt_bytes(n['host_download_bytes'])} "
         f"({i['hosts'] - 1} Δs), {fmt_seconds(n['aggregate_s'])} = "
         f"{fmt_pct(n['aggregate_s'] / max(tl['train'], 1e-12))} of training"),
        ("network", "codec by host count", _codec_row(p)),
        ("network", "host upload per step", f"{fmt_bytes(n['host_upload_bytes'])} (openings "
         f"{fmt_bytes(n['host_upload_openings_bytes'])}, Δs {fmt_bytes(n['host_upload_delta_bytes'])})"),
        ("verification", "sampling", _sampling(p)),
        ("verification", "bytes per contribution", f"{fmt_bytes(ver['bytes_per_contribution'])} per check; "
         f"all {ver['checks_per_contribution']:.3g} checks (v + p·a) "
         f"{fmt_bytes(ver['bytes_per_contribution'] * ver['checks_per_contribution'])} = "
         f"{ver['states_per_contribution']:.3g} states" + _by_kind(p.states_by_kind)),
        ("verification", "per verifier per step", f"{ver['contributions_per_verifier']:.3g} contributions, "
         f"download {fmt_bytes(n['verifier_download_bytes'])}"),
        ("verification", "window", f"{fmt_seconds(ver['window_s'])} (fetch {fmt_seconds(ver['fetch_s'])}, "
         f"replay {fmt_seconds(ver['replay_s'])})"),
        ("verification", "replay compute ÷ host compute", fmt_pct(ver["replay_share"])),
        ("hashing", "per leaf", f"{fmt_seconds(h['leaf_s'])} ({i['cpu_cores']} cores) vs segment "
         f"{fmt_seconds(h['segment_compute_s'])}; snapshot copy {fmt_seconds(h['snapshot_s'])}"),
        ("hashing", "training stalls per step", fmt_seconds(h["stall_s"])),
        ("disk", "peak per host", f"{fmt_bytes(dk['bytes'])} ({dk['states']:.3g} states)"),
        ("disk", "recompute of openings", f"{dk['recompute_segments']:.3g} segments, "
         f"{fmt_seconds(tl['recompute'])}"),
        ("memory", f"per GPU ({i['sharding']}, {i['gpus_per_host']} ranks)",
         f"{fmt_bytes(mem['total'])} of {fmt_bytes(mem['capacity'])}: state {fmt_bytes(mem['sharded'])} "
         f"+ replicated {fmt_bytes(mem['replicated'])} + activations {fmt_bytes(mem['activations'])}"),
        ("time", "outer step", f"{fmt_seconds(tl['sequential'])} sequential, {fmt_seconds(tl['overlapped'])} "
         "overlapped"),
        ("time", "overlap (eager)", f"step n+1's GPU work {fmt_seconds(tl['gpu'])} vs step n's "
         f"commit … result {fmt_seconds(tl['after_training'])}: "
         + ("fits: training never waits" if tl["after_training"] <= tl["gpu"] else "too long: hosts wait")),
        ("utilization", "compute ÷ wall", f"{fmt_pct(u['sequential'])} sequential, "
         f"{fmt_pct(u['overlapped'])} with overlap"
         + (f", {fmt_pct(u['configured'])} / {fmt_pct(u['configured_overlapped'])} with the configured "
            "phases" if "configured" in u else "")),
        ("security", f"detection (fakes {fmt_pct(i['fake_fraction'])} of segments)",
         f"{fmt_pct(sec['detection'])} of outer steps ("
         + ("≈ 1−(1−F/B)^(v+p·a)" if i["sampling"] == Sampling.WINDOWS else "1−(1−f)^s")
         + f": {fmt_pct(sec['detection_naive'])})"),
        ("security", "one-segment fake caught", fmt_pct(ver["one_segment_detection"])),
        ("security", "lazy host: success, profit", f"{fmt_pct(sec['lazy_success'])}, "
         f"{fmt_gnk(sec['lazy_profit'])}; deterred from a slash of {fmt_gnk(sec['lazy_min_slash'])}"),
        ("security", f"colluder's fake Δ (σ = {fmt_pct(i['dishonest_stake'])}): success, profit",
         f"{fmt_pct(sec['collusion_success'])}, {fmt_gnk(sec['collusion_profit'])}; deterred from a slash "
         f"of {fmt_gnk(sec['collusion_min_slash'])}"),
        ("security", "slash (first verdict / audit)",
         f"{fmt_gnk(sec['slash'])} / {fmt_gnk(sec['audit_slash'])}"),
        ("chain", "messages per step",
         f"{p.chain['messages']:.4g} ({fmt_seconds(p.chain['chain_s'])} of state machine)"),
        ("phases", f"recommended (blocks of {i['block_seconds']} s)",
         ", ".join(f"{k} {v}" for k, v in p.phases.items())),
    ]  # fmt: skip
    return rows


def _sampling(p: Plan) -> str:
    i, ver = p.inputs, p.verification
    if i["sampling"] == Sampling.WINDOWS:
        per = ver["replay_segments_per_check"]
        return (f"windows: w = {ver['window_segments']:.0f}, B = {ver['blocks']:.0f} blocks; each check "
                f"replays its own block ({per:.3g} segments) from one start")  # fmt: skip
    return f"segments: every check opens the same s = {i['s']} (the last always)"


def _sample_label(i: dict[str, Any]) -> str:
    return f"w={i['w']}" if i["sampling"] == Sampling.WINDOWS else f"s={i['s']}"


def _codec_row(p: Plan) -> str:
    """`plan.codec_advice`: what this host count should run and where each codec stops fitting."""
    a = p.codec
    if not a:
        return "-"

    def limit(codec: str) -> str:
        n = a["host_limit"][codec]
        return f"{codec} from {n} hosts" if n is not None else f"{codec} never"

    return (f"{a['recommended']} at {p.inputs['hosts']} hosts (aggregation ÷ training: int8 "
            f"{fmt_pct(a['share']['int8'])}, sparse {fmt_pct(a['share']['sparse'])}; past half of it: "
            f"{limit('int8')}, {limit('sparse')})")  # fmt: skip


def _table(p: Plan, c: Constants) -> Table:
    i = p.inputs
    title = (
        f"{i['params'] / 1e9:.3g}B params, {i['hosts']} hosts × {i['gpus_per_host']} {i['gpu']}, "
        f"H={i['H']} k={i['k']} {_sample_label(i)} v={i['v']} m={i['m']} {i['codec']}, "
        f"{i['pipeline']} pipeline"
    )
    t = Table("", "figure", "per outer step", title=title, title_justify="left")
    last = ""
    for section, figure, value in plan_rows(p):
        t.add_row(section if section != last else "", figure, value)
        last = section
    return t


def _constants_table(c: Constants) -> Table:
    t = Table("constant", "value", "source", title="machine constants", title_justify="left")
    t.add_row(
        "SHA-256 per core", f"{c.sha256_bytes_per_s / 1e9:.3g} GB/s", c.sources.get("sha256_bytes_per_s", "")
    )
    t.add_row("parallel hashing efficiency", f"{c.hash_efficiency:.2g}", c.sources.get("hash_efficiency", ""))
    ratios = ", ".join(f"{k} {v:.3g}×" for k, v in c.codec_ratio.items())
    t.add_row("codec ratio vs fp32", ratios, c.sources.get("codec_ratio", ""))
    t.add_row("codec decode", ", ".join(f"{k} {v / 1e6:.0f} MB/s" for k, v in c.codec_decode.items()),
              c.sources.get("codec_speed", ""))  # fmt: skip
    t.add_row(
        "chain state machine", f"{c.chain_ms_per_msg:.3g} ms/msg", c.sources.get("chain_ms_per_msg", "")
    )
    t.add_row("training state coding r", ", ".join(f"{k} {v:.3g}×" for k, v in c.state_code_ratio.items()),
              c.sources.get("state_code", ""))  # fmt: skip
    return t


def sweep_rows(found: list[Plan], overlap: bool) -> list[list[str]]:
    rows = []
    for rank, p in enumerate(found, 1):
        i, u, sec = p.inputs, p.utilization, p.security
        rows.append([
            str(rank), str(i["H"]), str(i["k"]), _sample_label(i), str(i["v"]), str(i["m"]), str(i["codec"]),
            fmt_pct(u["overlapped" if overlap else "sequential"]), fmt_bytes(p.network["host_upload_bytes"]),
            fmt_bytes(p.verification["bytes_per_contribution"]), fmt_bytes(p.disk["bytes"]),
            fmt_pct(sec["detection"]), fmt_pct(sec["collusion_success"]), f"{p.cost:.3f}",
        ])  # fmt: skip
    return rows


SWEEP_HEADER = ["#", "H", "k", "s / w", "v", "m", "codec", "utilization", "host upload", "bytes/contribution",
                "disk/host", "detection", "collusion", "cost"]  # fmt: skip


def _met_up_to(bound: float | None, lead: str = "met only") -> str:
    """`economics`' fake_delta_sigma_bound in words: up to which accomplice share the floor holds."""
    return "not even without accomplices" if bound is None else f"{lead} up to σ = {bound:.3g}"


def economics_sentence(e: dict[str, Any]) -> str:
    """Issue 34's cheating floors (`plan.economics`) as one sentence: met or not, and by how much."""
    ok = e["meets"]
    who = "defaults" if e["at_run_defaults"] else "these settings"
    verb = "meet" if e["meets_all"] else "do not meet"

    def mark(name: str) -> str:
        return "" if ok[name] else " (NOT MET)"

    half = fmt_pct(COALITION)
    bound = e["fake_delta_sigma_bound"]
    if e.get("windowed"):
        what = ("a one-block fake of the last block" if e["fake_delta_blocks"] == 1 else
                f"a fake of the {e['fake_delta_blocks']} blocks whose check reaches θ_H")  # fmt: skip
        caught = 1 - e["fake_delta_success_at_coalition"]
        floor = f"≥ {fmt_pct(e['fake_delta_caught_floor'])} = {fmt_pct(ONE_SEGMENT_CAUGHT)} × (1 − {half})"
        coalition = (
            f"a fake Δ is {what} (only a check that ends at θ_H checks Δ): it reaches the model in "
            f"{fmt_pct(e['fake_delta_success_alone'])} of outer steps alone and "
            f"{fmt_pct(e['fake_delta_success_at_coalition'])} with a coalition of {half} of the verifier "
            f"stake, which catches it in {fmt_pct(caught)} ({floor}"
            + ("" if ok["coalition"] else f"; {_met_up_to(bound)}") + f"){mark('coalition')}"
        )  # fmt: skip
    else:
        fake_delta = f"a fake Δ reaches the model in ≤ {fmt_pct(FAKE_DELTA_CEILING)} of outer steps"
        at = f"{fmt_pct(e['fake_delta_success_at_coalition'])} at {half}"
        if ok["coalition"]:
            coalition = f"{fake_delta} for every coalition below {half} of the verifier stake ({at})"
        else:
            coalition = f"{fake_delta} {_met_up_to(bound, 'only for coalitions')} ({at}){mark('coalition')}"
    return (
        f"{who} {verb} the cheating floors: a host faking half its segments is caught in "
        f"{fmt_pct(e['half_fake_caught'])} of outer steps (≥ {fmt_pct(HALF_FAKE_CAUGHT)}) and expects "
        f"{fmt_gnk(e['half_fake_profit'])} (< 0){mark('half_fake')}; a one-segment fake is caught in "
        f"{fmt_pct(e['one_segment_caught'])} (≥ {fmt_pct(ONE_SEGMENT_CAUGHT)}){mark('one_segment')}; "
        f"{coalition}."
        + (f" Beyond the floors: faking {e['best_fake_segments']} segments pays best, "
           f"{fmt_gnk(e['best_fake_profit'])} expected per outer step (deterred from a slash of "
           f"{fmt_gnk(e['best_fake_min_slash'])})." if e["best_fake_profit"] > 0 else "")
    )  # fmt: skip


def window_rows(ch: WindowChoice, default_w: int) -> list[tuple[str, str]]:
    """The planner's choice of w, one readable block."""
    same = "= RunConfig's default" if ch.w == default_w else f"RunConfig's default is {default_w}"
    budget = "" if ch.within_budget else f" (no w keeps replay ≤ {fmt_pct(ch.budget)}: the least replay)"
    zero = (
        f"from segment 0 {fmt_seconds(ch.from_zero_check_s)} ({fmt_bytes(ch.from_zero_check_bytes)}, "
        f"{ch.from_zero_segments:.3g} segments)"
        if ch.from_zero_check_s is not None else "from segment 0: not in tolerance mode"
    )  # fmt: skip
    floor = ("none in the budget: the budget's choice" if ch.w_one_segment_floor is None
             else "met")  # fmt: skip
    return [
        ("w", f"{ch.w} segments, B = {ch.blocks} blocks ({same}){budget}"),
        ("replay ÷ host compute", f"{fmt_pct(ch.replay_share)} (budget {fmt_pct(ch.budget)})"),
        ("outer step, overlapped", f"{fmt_seconds(ch.overlapped_s)} (recompute of the openings "
         f"{ch.recompute_segments:.3g} segments)"),
        ("one-segment fake caught", f"{fmt_pct(ch.one_segment_detection)} (floor "
         f"{fmt_pct(ONE_SEGMENT_CAUGHT)}: {floor})"),
        ("half-fake caught", fmt_pct(ch.half_fake_detection)),
        ("window start", f"{ch.start} is faster: downloading the start {fmt_seconds(ch.download_check_s)} "
         f"per check ({fmt_bytes(ch.download_check_bytes)}, {ch.download_segments:.3g} segments) vs {zero}"),
    ]  # fmt: skip


def _window_table(ch: WindowChoice, default_w: int) -> Table:
    title = (f"window choice (sampling windows): replay ≤ {fmt_pct(ch.budget)} of host compute and a "
             f"one-segment fake caught in ≥ {fmt_pct(ONE_SEGMENT_CAUGHT)}, the least overlapped period "
             "(within 0.5%), then the largest w")  # fmt: skip
    t = Table("", "", title=title, title_justify="left", show_header=False)
    for row in window_rows(ch, default_w):
        t.add_row(*row)
    return t


def _print_plan(console: Console, p: Plan, c: Constants, choice: WindowChoice | None = None) -> None:
    console.print(_table(p, c))
    if choice is not None:
        console.print(_window_table(choice, D.w))
    console.print(Text.assemble(("economics: ", "bold"), economics_sentence(p.economics)))
    console.print(_constants_table(c))
    for w in p.warnings:
        console.print(Text.assemble(("warning: ", "yellow"), w))


def _hours(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def budget_rows(b: dict[str, float], overlap: bool) -> list[tuple[str, str]]:
    schedule = "overlapped" if overlap else "sequential"
    return [
        ("tokens per inner step", f"{b['tokens_per_inner_step']:,.0f} per host"),
        ("tokens per outer step", f"{b['tokens_per_outer_step']:,.0f} (every host's H inner steps)"),
        ("outer steps", f"{b['outer_steps']:,.0f}"),
        ("wall time", f"{fmt_seconds(b['wall_s'])} ({schedule} schedule)"),
        ("GPU-hours", f"{_hours(b['gpu_hours'])}: hosts {_hours(b['host_gpu_hours'])} + verifiers' "
         f"replays {_hours(b['verifier_gpu_hours'])} (useful training {_hours(b['useful_gpu_hours'])})"),
    ]  # fmt: skip


PLOT_H = (25, 50, 100, 200, 250, 500, 1000, 2000, 4000)


def write_plot(i: Inputs, c: Constants, path: Path) -> Path:
    """Utilization (sequential and overlapped) and cost (GPU-seconds per useful GPU-second,
    verifiers' replays included) against H, everything else as planned; the planned H marked."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlanInputError("--plot needs matplotlib (pip install matplotlib)") from None
    least = i.s if i.sampling is Sampling.SEGMENTS else 1
    hs = sorted({h for h in (*PLOT_H, i.H) if h % i.k == 0 and h // i.k >= least})
    plans = [plan(replace(i, H=h, phases=None), c) for h in hs]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for key, style in (("overlapped", "-"), ("sequential", "--")):
        left.plot(hs, [p.utilization[key] for p in plans], style, marker=".", label=key)
        right.plot(hs, [1 / max(p.utilization[key], 1e-12) + p.verification["replay_share"] for p in plans],
                   style, marker=".", label=key)  # fmt: skip
    x = "H (inner steps per outer step)"
    left.set(xscale="log", xlabel=x, ylabel="compute utilization", ylim=(0, 1.02))
    right.set(xscale="log", yscale="log", xlabel=x, ylabel="GPU-seconds per useful GPU-second")
    for ax in (left, right):
        ax.axvline(i.H, color="grey", lw=0.6)
        ax.legend(fontsize=8)
    fig.suptitle(
        f"{i.params / 1e9:.3g}B, {i.hosts} hosts × {i.gpus_per_host} {i.gpu.name}, "
        f"{i.up * 8 / 1e9:.3g} Gbit/s up; "
        f"k={i.k} {_sample_label({'sampling': i.sampling, 's': i.s, 'w': i.w})} v={i.v} p={i.audit_p:g} "
        f"a={i.auditors} m={i.m} {i.codec}",
        fontsize=9,
    )
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=90)
    except OSError as e:
        raise PlanInputError(f"--plot {path}: {e.strerror or e}") from None
    finally:
        plt.close(fig)
    return path


# ---------------------------------------------------------------- the command

Opt = typer.Option


@app.command()
def plan_command(
    config: Annotated[
        Path | None, typer.Argument(help="Run config TOML (as for `run create`); flags win.")
    ] = None,
    params: Annotated[
        str | None, Opt("--params", help=f"Model parameters, e.g. 30e9, 30B (default {D.params:.0e}).")
    ] = None,
    hosts: Annotated[int | None, Opt(help=f"Hosts (default {D.hosts}).")] = None,
    verifiers: Annotated[
        int | None, Opt("--verifiers", help="Bonded verifier machines (default: as many as hosts).")
    ] = None,
    gpus_per_host: Annotated[
        int | None, Opt("--gpus-per-host", help=f"GPUs (ranks) per host (default {D.gpus_per_host}).")
    ] = None,
    gpu: Annotated[str | None, Opt(help=f"GPU model: {', '.join(GPUS)} (default h100).")] = None,
    peak_tflops: Annotated[
        float | None, Opt("--peak-tflops", help="Override the GPU's dense bf16 TFLOP/s.")
    ] = None,
    gpu_memory: Annotated[
        str | None, Opt("--gpu-memory", help="Override the GPU's memory, e.g. 80GB.")
    ] = None,
    mfu: Annotated[
        float | None, Opt(help=f"Model FLOP utilization of the inner loop (default {D.mfu}).")
    ] = None,
    tokens_per_step: Annotated[
        str | None, Opt("--tokens-per-step", help="Tokens per inner step per host (default 1Mi).")
    ] = None,
    micro_tokens: Annotated[
        str | None, Opt("--micro-tokens", help=f"Tokens per GPU micro-batch (default {D.micro_tokens}).")
    ] = None,
    cores: Annotated[
        int | None, Opt("--cores", help=f"CPU cores per host for hashing (default {D.cpu_cores}).")
    ] = None,
    up: Annotated[str | None, Opt(help="Host uplink, e.g. 1Gbit (default 1Gbit).")] = None,
    down: Annotated[str | None, Opt(help="Host downlink (default 1Gbit).")] = None,
    disk_write: Annotated[str | None, Opt("--disk-write", help="Disk write speed (default 2GB/s).")] = None,
    disk_budget: Annotated[str | None, Opt("--disk-budget", help="Disk per host (default 30TB).")] = None,
    host_ram: Annotated[str | None, Opt("--host-ram", help="Host RAM (default 2TB).")] = None,
    inner_steps: Annotated[int | None, Opt("-H", "--inner-steps", help=f"H (default {D.H}).")] = None,
    segment_len: Annotated[int | None, Opt("-k", "--segment-len", help=f"k (default {D.k}).")] = None,
    sampled: Annotated[
        int | None, Opt("-s", "--sampled", help=f"s: segments every check opens, sampling segments ({D.s}).")
    ] = None,
    sampling: Annotated[
        Sampling | None,
        Opt(help=f"What checks replay: windows (each its own block) or segments (default {D.sampling})."),
    ] = None,
    window_segments: Annotated[
        int | None, Opt("-w", "--window-segments", help=f"w: segments per window, sampling windows ({D.w}).")
    ] = None,
    replay_budget: Annotated[
        float, Opt("--replay-budget", help="Window choice: verifiers' replay ÷ host compute allowed.")
    ] = REPLAY_BUDGET,
    moments: Annotated[
        Moments | None,
        Opt(help=f"AdamW moments between steps: fp32, or int8 (half a training state; default {D.moments})."),
    ] = None,
    verifiers_per: Annotated[int | None, Opt("-v", "--verifiers-per", help=f"v (default {D.v}).")] = None,
    persist_every: Annotated[
        int | None, Opt("-m", "--persist-every", help=f"m: persist every m-th boundary (default {D.m}).")
    ] = None,
    codec: Annotated[Codec | None, Opt(help="Δ codec (default int8).")] = None,
    codec_chunk: Annotated[
        int | None, Opt("--codec-chunk", help=f"Codec sparse: chunk C (default {D.codec_chunk}).")
    ] = None,
    codec_topk: Annotated[
        int | None, Opt("--codec-topk", help=f"Codec sparse: k per chunk (default {D.codec_topk}).")
    ] = None,
    replay: Annotated[ReplayMode | None, Opt(help="Replay mode (default bitwise).")] = None,
    sharding: Annotated[
        Sharding | None, Opt(help="State sharding across a host's ranks (default fsdp).")
    ] = None,
    pipeline: Annotated[
        Pipeline | None, Opt(help="State pipeline: sparse (the scale design) or today (default sparse).")
    ] = None,
    chunk: Annotated[str | None, Opt("--chunk", help="Leaf hashing chunk size (default 64MiB).")] = None,
    block_seconds: Annotated[
        float | None, Opt("--block-seconds", help=f"Seconds per block (default {D.block_seconds}).")
    ] = None,
    epoch_blocks: Annotated[
        int | None, Opt("--epoch-blocks", help="Epoch length in blocks (0: no PoC windows).")
    ] = None,
    poc_blocks: Annotated[int | None, Opt("--poc-blocks", help="PoC window in blocks.")] = None,
    fake_fraction: Annotated[
        float | None,
        Opt("--fake-fraction", help=f"f: share of segments a lazy host fakes (default {D.fake_fraction})."),
    ] = None,
    dishonest_stake: Annotated[
        float | None,
        Opt(
            "--dishonest-stake",
            help=f"σ: accomplices' share of verifier stake (default {D.dishonest_stake}).",
        ),
    ] = None,
    audit_p: Annotated[
        float | None,
        Opt("--audit-p", help=f"p: probability an accepted contribution is audited (default {D.audit_p})."),
    ] = None,
    auditors: Annotated[int | None, Opt(help=f"Verifiers per audit (default {D.auditors}).")] = None,
    host_stake: Annotated[
        float | None, Opt("--host-stake", help=f"Host bond in GNK (default {D.host_stake:g}).")
    ] = None,
    host_slash_bps: Annotated[
        int | None, Opt("--host-slash-bps", help=f"Slash of a rejected host (default {D.host_slash_bps}).")
    ] = None,
    audit_slash_bps: Annotated[
        int | None,
        Opt("--audit-slash-bps", help=f"Slash of a contradicted accept (default {D.audit_slash_bps})."),
    ] = None,
    reward: Annotated[
        float | None, Opt(help=f"Reward per outer step in GNK, shared by hosts (default {D.reward:g}).")
    ] = None,
    gpu_hour_value: Annotated[
        float | None,
        Opt("--gpu-hour-value", help=f"GNK a GPU-hour is worth to a cheater (default {D.gpu_hour_value:g})."),
    ] = None,
    attack_value: Annotated[
        float | None,
        Opt("--attack-value", help="GNK a poisoned Δ reaching the model is worth to its author (default 0)."),
    ] = None,
    overlap: Annotated[
        bool, Opt("--overlap/--no-overlap", help="Judge the sweep on the overlapped schedule.")
    ] = True,
    do_sweep: Annotated[
        bool,
        Opt("--sweep", help="Search H, k, s, v, m and codec for the cheapest setting meeting the floors."),
    ] = False,
    min_util: Annotated[float, Opt("--min-util", help="Sweep: utilization floor.")] = F.utilization,
    min_detection: Annotated[
        float, Opt("--min-detection", help="Sweep: detection floor at --fake-fraction.")
    ] = F.detection,
    max_collusion: Annotated[
        float,
        Opt("--max-collusion", help="Sweep: ceiling on a colluder's fake Δ success (sampling segments; "
            "under windows a catch floor, 20% × (1 − σ), holds instead)."),
    ] = F.collusion_success,
    max_h: Annotated[int, Opt("--max-H", help="Sweep: longest H considered.")] = F.max_H,
    max_codec_error: Annotated[
        float, Opt("--max-codec-error", help="Sweep: largest codec error allowed.")
    ] = F.codec_error,
    top: Annotated[int, Opt(help="Sweep: how many settings to show.")] = 5,
    results: Annotated[
        Path | None, Opt("--results", help="Folder of bench results for the constants.")
    ] = None,
    tokens: Annotated[
        str | None,
        Opt("--tokens", help="A token budget (e.g. 1T, 300e9): tokens per step, total wall time, GPU-hours."),
    ] = None,
    plot: Annotated[
        Path | None, Opt("--plot", help="Write utilization and cost against H to this PNG file.")
    ] = None,
    as_json: Annotated[bool, Opt("--json", help="Print JSON instead of tables.")] = False,
) -> None:
    """Predict per outer step: compute, transfers, verification, hashing, disk, GPU memory,
    utilization with and without overlap, detection, collusion and the slash that deters."""
    from gonka_diloco.plan_constants import RESULTS, load_constants

    flags = {
        "params": params, "hosts": hosts, "verifier_nodes": verifiers, "gpus_per_host": gpus_per_host,
        "gpu": gpu, "peak_tflops": peak_tflops, "gpu_memory": gpu_memory, "mfu": mfu,
        "tokens_per_step": tokens_per_step, "micro_tokens": micro_tokens, "cpu_cores": cores, "up": up,
        "down": down, "disk_write": disk_write, "disk_budget": disk_budget, "host_ram": host_ram,
        "H": inner_steps, "k": segment_len, "s": sampled, "sampling": sampling, "w": window_segments,
        "moments": moments,
        "v": verifiers_per, "m": persist_every,
        "codec": codec, "codec_chunk": codec_chunk, "codec_topk": codec_topk, "replay": replay,
        "sharding": sharding, "pipeline": pipeline, "chunk_bytes": chunk,
        "block_seconds": block_seconds, "epoch_blocks": epoch_blocks, "poc_blocks": poc_blocks,
        "fake_fraction": fake_fraction, "dishonest_stake": dishonest_stake, "audit_p": audit_p,
        "auditors": auditors, "host_stake": host_stake, "host_slash_bps": host_slash_bps,
        "audit_slash_bps": audit_slash_bps, "reward": reward, "gpu_hour_value": gpu_hour_value,
        "attack_value": attack_value,
    }  # fmt: skip
    console = Console()
    try:
        token_count = parse_count(tokens) if tokens is not None else None
        if token_count is not None and token_count <= 0:
            raise PlanInputError("--tokens must be positive")
        if replay_budget <= 0:
            raise PlanInputError("--replay-budget must be positive")
        inputs = build_inputs(config, flags)
        constants = load_constants(results or RESULTS)
        plotted = write_plot(inputs, constants, plot) if plot is not None else None
    except PlanInputError as e:
        Console(stderr=True, soft_wrap=True).print(Text.assemble(("error: ", "red"), str(e)))
        raise typer.Exit(2) from None
    p = plan(inputs, constants, overlap=overlap)
    choice = choose_window(inputs, constants, replay_budget)
    budget = token_budget(p, token_count, overlap=overlap) if token_count is not None else None
    found: list[Plan] = []
    if do_sweep:
        floors = Floors(utilization=min_util, detection=min_detection, collusion_success=max_collusion,
                        max_H=max_h, codec_error=max_codec_error)  # fmt: skip
        found = sweep(inputs, constants, floors, overlap=overlap, top=top)
    if as_json:
        out: dict[str, Any] = {"plan": p.to_json(), "window_choice": choice.to_json(),
                               "constants": _constants_json(constants)}  # fmt: skip
        out["plan"]["economics"]["sentence"] = economics_sentence(p.economics)
        if do_sweep:
            out["sweep"] = [f.to_json() for f in found]
        if budget is not None:
            out["budget"] = budget
        if plotted is not None:
            out["plot"] = str(plotted)
        typer.echo(json.dumps(_finite(out), indent=2, default=str))
        return
    _print_plan(console, p, constants, choice)
    if budget is not None:
        t = Table("", "", title=f"a budget of {budget['tokens']:,.0f} tokens", title_justify="left",
                  show_header=False)  # fmt: skip
        for row in budget_rows(budget, overlap):
            t.add_row(*row)
        console.print(t)
    if plotted is not None:
        console.print(f"plot: {plotted}")
    if do_sweep:
        schedule = "overlapped" if overlap else "sequential"
        sigma = inputs.dishonest_stake
        collusion = (
            f"a colluder's fake Δ caught in ≥ {fmt_pct(coalition_caught_floor(sigma))} at σ = "
            f"{fmt_pct(sigma)}"
            if inputs.windowed else f"collusion ≤ {fmt_pct(max_collusion)}"
        )  # fmt: skip
        title = (
            f"cheapest settings meeting: utilization ≥ {fmt_pct(min_util)} ({schedule}), detection ≥ "
            f"{fmt_pct(min_detection)}, {collusion}, negative expected profit "
            "for cheaters; cost = GPU-seconds per useful GPU-second"
        )
        t = Table(*SWEEP_HEADER, title=title, title_justify="left")
        for cells in sweep_rows(found, overlap):
            t.add_row(*cells)
        console.print(t)
        if not found:
            console.print("no setting meets the floors: lower them, raise the link speed or the slash")


def _constants_json(c: Constants) -> dict[str, Any]:
    return {k: getattr(c, k) for k in c.__dataclass_fields__}


def _finite(x: Any) -> Any:
    """JSON has no infinity: an unbounded figure (no slash deters) becomes null."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {str(k): _finite(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_finite(v) for v in x]
    return x
