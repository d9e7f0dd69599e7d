"""Lossless coding of opened training states against G_n (`protocol.statecode`; issue 35 part 1).

Real states from a real training run, coded chunk by chunk as a holder would send them:
- the devnet GPT (`small_gpt`, the devnet's default `small` preset, Shakespeare bytes): a host
  trains `WARM` inner steps (earlier outer steps: its carried moments are not zero), that point is
  G_n, then 250 inner steps of the outer step; states at 5, 50 and 250 steps into it;
- the Llama 125M layout (`replay.hf` preset `125m`, 32k vocabulary): a few steps only on 2 CPU
  cores (`WARM_125M` before G_n, then states at 1, 3 and 6 steps). The data are Shakespeare
  bytes, so 31,744 of the 32,000 embedding rows never get a gradient (their moments stay 0):
  the ratio is also reported without `embed_tokens` ("body"), and the planner takes the lower.
Both with float32 and with int8 moments (`InnerOptim.moments`, specs §6.2.1).

The parts of each state at the planner's coding (`parts`): the chunks a dispute panel member
fetches for θ_H's parameters alone (`diff_theta_h`: the verifier's own `param_chunks`), the
parameters alone as a state of their own (`diff_params`, `diff_params_body`: what those chunks are
at scale) and the rest (`diff_moments`). θ_H's ratio r_θ is the lowest `diff_params` /
`diff_params_body`: measured, not used by the planner, since no windowed check fetches θ_H any
more (only the check that ends at θ_H checks Δ, specs §6; panels are rare).

Codings of each chunk (c = the run's default 64 MiB; a GPT state is one chunk): zstd of the
canonical bytes ("raw"), byte planes + zstd (PLANES), parameters as integer differences against
G_n's + byte planes + zstd (DIFF), at zstd levels 1 and 3. Ratio = canonical bytes ÷ coded bytes
(headers included). Speeds are per core: one thread, CPU time of that thread (`time.thread_time`,
so other load on the machine does not count), next to the 125 MB/s of a 1 Gbit/s link. Also the
genuine-state ratio of every state, max |m̂|/((√v̂ + ε)·C(t)) (specs §6.3; what
`GENUINE_SLACK_INT8` is set from).

Run: `nice -n 15 .venv/bin/python -m bench.statecode [--quick]` → bench/results/statecode.json
(the quick run: the GPT only, 5 and 50 steps); `--predict` recomputes only the planner's 30B
figures (and the planner's ratios, at today's `DEFAULT_LEVEL`) from that file.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Iterator, Mapping
from typing import Any

import torch
import zstandard
from torch import Tensor

from bench.sim import write_result
from protocol.chunks import DEFAULT_CHUNK_BYTES
from protocol.config import InnerOptim, ModelSpec, Moments, RunConfig
from protocol.inner import PARAM
from protocol.statecode import DEFAULT_LEVEL, HEADER, StateLayout, Transform, decode_chunk, encode_chunk
from protocol.tensors import canonical_pieces, specs_of
from replay.data import Corpus, open_dataset
from replay.spec import build_model
from replay.step import TrainJob, configure_determinism, make_optimizer, train_segment, training_state

LINK_MB_S = 125.0
"""1 Gbit/s in MB/s: what coding must outrun per core."""
HOST = "gonka1" + "q" * 38
WARM = 200
WARM_125M = 3
LEVELS = (1, 3)
GPT = {"n_layer": 2, "n_head": 2, "n_embd": 64, "block_size": 64}  # gonka_diloco.devnet_config "small"
EMBED = "embed_tokens"


def _stream(state: Mapping[str, Tensor]) -> tuple[bytes, StateLayout]:
    """A state's canonical bytes (one buffer: the biggest here is 1.5 GB) and its layout."""
    data = b"".join(bytes(p) for p in canonical_pieces(state))
    return data, StateLayout.of(specs_of(state), DEFAULT_CHUNK_BYTES)


def code_state(
    state: Mapping[str, Tensor],
    base: Mapping[str, Tensor],
    variants: list[tuple[str, int]],
    chunks: set[int] | None = None,
) -> list[dict[str, Any]]:
    """Every variant over every chunk (or over `chunks` only: the canonical bytes counted are
    theirs): coded bytes, encode and decode CPU seconds (this thread)."""
    data, layout = _stream(state)
    which = sorted(chunks) if chunks is not None else range(layout.n_chunks)
    canonical = sum(b - a for a, b in map(layout.span, which))
    rows = []
    for name, level in variants:
        coded = enc = dec = 0.0
        for i in which:
            a, b = layout.span(i)
            chunk = memoryview(data)[a:b]
            t0 = time.thread_time()
            if name == "raw":
                out = zstandard.ZstdCompressor(level=level).compress(chunk)
            else:
                out = encode_chunk(layout, i, chunk, base if name == "diff" else None, level=level)
            t1 = time.thread_time()
            if name == "raw":
                back = zstandard.ZstdDecompressor().decompress(out)
            else:
                back = decode_chunk(layout, i, out, base if name == "diff" else None)
            t2 = time.thread_time()
            if back != chunk:
                raise AssertionError(f"{name} L{level} chunk {i} does not round-trip")
            coded += len(out) + (0 if name != "raw" else HEADER.size)
            enc += t1 - t0
            dec += t2 - t1
        mb = canonical / 1e6
        rows.append({"coding": name, "level": level, "canonical_bytes": canonical, "coded_bytes": coded,
                     "ratio": canonical / coded, "encode_mb_s": mb / max(enc, 1e-9),
                     "decode_mb_s": mb / max(dec, 1e-9)})  # fmt: skip
    return rows


def genuine(state: Mapping[str, Tensor], inner: InnerOptim) -> float:
    from verifier.update_space import genuine_ratio

    return genuine_ratio(state, inner)


def trajectory(
    spec: ModelSpec, corpus: Corpus, moments: Moments, warm: int, points: list[int], batch: int, seq: int
) -> Iterator[tuple[int, dict[str, Tensor], dict[str, Tensor], InnerOptim, int]]:
    """(t, state at t inner steps into the outer step, G_n's params, inner, params): `warm` steps
    of earlier outer steps first (carried moments), then the step from G_n."""
    inner = InnerOptim(moments=moments, warmup_steps=20)
    cfg = RunConfig(model=spec, dataset_manifest_hash=corpus.manifest_hash, initial_model_hash="0" * 64,
                    inner_steps=max(points), segment_len=1, sampled_segments=1, batch_size=batch, seq_len=seq,
                    inner=inner)  # fmt: skip
    model = build_model(spec)
    opt = make_optimizer(model, inner)
    train_segment(TrainJob(cfg, corpus, HOST, 0), model, opt, 0, warm)
    base = {n: p.detach().clone() for n, p in model.named_parameters()}
    n_params = sum(p.numel() for p in model.parameters())
    done = 0
    job = TrainJob(cfg, corpus, HOST, 1)
    for t in points:
        train_segment(job, model, opt, done, t - done)
        done = t
        yield t, training_state(model, opt, copy=True), base, inner, n_params


def measure(name: str, spec: ModelSpec, corpus: Corpus, warm: int, points: list[int], batch: int, seq: int,
            body: bool) -> list[dict[str, Any]]:  # fmt: skip
    """Rows of one model: every moment format, point and coding."""
    variants = [("raw", 1), *((c, lvl) for c in ("planes", "diff") for lvl in LEVELS)]
    rows = []
    for moments in (Moments.FP32, Moments.INT8):
        t0 = time.perf_counter()
        for t, state, base, inner, n_params in trajectory(spec, corpus, moments, warm, points, batch, seq):
            g = genuine(state, inner)
            coded = code_state(state, base, variants)
            if body:  # the same state without the token embedding, at the planner's coding
                rest = {k: v for k, v in state.items() if EMBED not in k}
                extra = code_state(rest, base, [("diff", DEFAULT_LEVEL)])
                coded += [{**r, "coding": f"{r['coding']}_body"} for r in extra]
            coded += parts(state, base, body)
            for r in coded:
                rows.append({"model": name, "moments": moments.value, "t": t, "params": n_params,
                             "state_bytes_per_param": r["canonical_bytes"] / n_params,
                             "wire_bytes_per_param": r["coded_bytes"] / n_params,
                             "genuine_ratio": g, **r})  # fmt: skip
            print(f"  {name} {moments.value} t={t}: done ({time.perf_counter() - t0:.0f}s)", flush=True)
            del state
    return rows


def parts(state: Mapping[str, Tensor], base: Mapping[str, Tensor], body: bool) -> list[dict[str, Any]]:
    """The state's parts at the planner's coding (DIFF, `DEFAULT_LEVEL`), as the nodes code them:
    - `theta_h`: the chunks a dispute panel member fetches of θ_H for its Δ check, its parameters
      alone (`verifier.source.param_chunks`: the header's chunk and every chunk holding `param/*`,
      so with the moments that share their edge chunks; a one-chunk state is all of it);
    - `params`: the `param/*` tensors alone, as a state of their own (chunked the same way): what
      θ_H's parameters cost once chunks are all parameters (a large model, whose three edge chunks
      are nothing beside its parameters' thousands); `params_body` without the token embedding;
    - `moments`: everything else (moments, scales, step), for comparison."""
    from verifier.source import param_chunks

    mine = [("diff", DEFAULT_LEVEL)]
    fetch = param_chunks(specs_of(state), DEFAULT_CHUNK_BYTES)
    params = {k: v for k, v in state.items() if k.startswith(f"{PARAM}/")}
    moments = {k: v for k, v in state.items() if not k.startswith(f"{PARAM}/")}
    out = [{**r, "coding": "diff_theta_h"} for r in code_state(state, base, mine, fetch)]
    out += [{**r, "coding": "diff_params"} for r in code_state(params, base, mine)]
    if body:
        rest = {k: v for k, v in params.items() if EMBED not in k}
        out += [{**r, "coding": "diff_params_body"} for r in code_state(rest, base, mine)]
    out += [{**r, "coding": "diff_moments"} for r in code_state(moments, base, mine)]
    return out


def _lowest(rows: list[dict[str, Any]]) -> dict[str, float]:
    return {"ratio": min(r["ratio"] for r in rows), "encode_mb_s": min(r["encode_mb_s"] for r in rows),
            "decode_mb_s": min(r["decode_mb_s"] for r in rows)}  # fmt: skip


def planner(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """What the planner uses: per moment format, the lowest ratio of the chosen coding (DIFF at
    `DEFAULT_LEVEL`, whole or body) over every model and point, and the slowest per-core speeds;
    under `theta_h`, the same of θ_H's parameters alone (`params`, `params_body`: the lowest), what
    a dispute panel member fetches of θ_H at scale (`parts`; a measurement only: no check the
    planner counts fetches it since only the check that ends at θ_H checks Δ, specs §6)."""
    out: dict[str, Any] = {"coding": Transform.DIFF.name.lower(), "level": DEFAULT_LEVEL,
                           "link_mb_s": LINK_MB_S}  # fmt: skip
    theta: dict[str, Any] = {}
    for m in (Moments.FP32, Moments.INT8):
        at = [r for r in rows if r["moments"] == m.value and r["level"] == DEFAULT_LEVEL]
        if mine := [r for r in at if r["coding"] in ("diff", "diff_body")]:
            out[m.value] = _lowest(mine)
        if mine := [r for r in at if r["coding"] in ("diff_params", "diff_params_body")]:
            theta[m.value] = _lowest(mine)
    if theta:
        out["theta_h"] = theta
    return out


def prediction(plan: dict[str, Any]) -> list[dict[str, Any]]:
    """What `gonka_diloco.plan` then says of one opened state at the planner's default model (30B)."""
    from gonka_diloco.plan import (
        PARAM_BYTES_PER_PARAM,
        Constants,
        Inputs,
        optimizer_wire_bytes,
        state_canonical_bytes,
        state_wire_bytes,
    )

    i = Inputs()
    ratio = {m.value: plan[m.value]["ratio"] if m.value in plan else 1.0 for m in Moments}
    theta = {m: r["ratio"] for m, r in plan.get("theta_h", {}).items()}
    c = Constants(state_code_ratio=ratio)
    out = []
    for m in Moments:
        wire = state_wire_bytes(i, c, m)
        # θ_H's parameters alone, what a dispute panel fetches (the planner counts no such fetch)
        theta_h = PARAM_BYTES_PER_PARAM * i.params / (theta.get(m.value) or ratio[m.value])
        out.append({"moments": m.value, "params": i.params,
                    "state_gb": state_canonical_bytes(i.params, m) / 1e9,
                    "wire_gb": wire / 1e9, "wire_bytes_per_param": wire / i.params,
                    "minutes_at_1gbit": wire / (LINK_MB_S * 1e6) / 60,
                    "optimizer_gb": optimizer_wire_bytes(i, m) / 1e9,
                    "theta_h_gb": theta_h / 1e9})  # fmt: skip
    return out


def main(quick: bool = False) -> dict[str, Any]:
    configure_determinism(1)
    corpus = open_dataset("")
    result: dict[str, Any] = {"quick": quick, "load_before": os.getloadavg(), "link_mb_s": LINK_MB_S,
                              "chunk_bytes": DEFAULT_CHUNK_BYTES,
                              "torch_threads": torch.get_num_threads()}  # fmt: skip
    gpt = ModelSpec(factory="trainer.model:small_gpt", config=GPT)
    rows = measure("gpt-devnet", gpt, corpus, WARM // (4 if quick else 1), [5, 50] if quick else [5, 50, 250],
                   8, 64, False)  # fmt: skip
    if not quick:
        from replay.hf import spec_config

        llama = ModelSpec(factory="trainer.hf:llama", config=spec_config("llama", "125m"))
        rows += measure("llama-125m", llama, corpus, WARM_125M, [1, 3, 6], 2, 64, True)
    result["rows"] = rows
    result["planner"] = planner(rows)
    result["prediction_30b"] = prediction(result["planner"])
    result["load_after"] = os.getloadavg()
    print("\n| model | moments | t | coding | level | B/param state | B/param wire | ratio "
          "| encode MB/s/core | decode MB/s/core | genuine ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['moments']} | {r['t']} | {r['coding']} | {r['level']} "
              f"| {r['state_bytes_per_param']:.2f} | {r['wire_bytes_per_param']:.2f} | {r['ratio']:.3f} "
              f"| {r['encode_mb_s']:.0f} | {r['decode_mb_s']:.0f} | {r['genuine_ratio']:.3f} |")  # fmt: skip
    print(f"planner: {result['planner']} (link {LINK_MB_S:.0f} MB/s)")
    for p in result["prediction_30b"]:
        print(f"30B, {p['moments']} moments: an opened state {p['state_gb']:.0f} GB, on the wire "
              f"{p['wire_gb']:.0f} GB ({p['wire_bytes_per_param']:.2f} B/param, "
              f"{p['minutes_at_1gbit']:.0f} min at 1 Gbit/s); carried optimizer state "
              f"{p['optimizer_gb']:.0f} GB; θ_H's parameters {p['theta_h_gb']:.0f} GB")  # fmt: skip
    write_result("statecode", result)
    return result


def predict_only() -> dict[str, Any]:
    """`--predict`: the planner's figures (at today's `DEFAULT_LEVEL`) and the 30B prediction again,
    from the measured rows in the results file (the full run's if there is one)."""
    from bench.sim import RESULTS_DIR

    full = RESULTS_DIR / "statecode.full.json"
    result = json.loads((full if full.is_file() else RESULTS_DIR / "statecode.json").read_text())
    result["planner"] = planner(result["rows"])
    result["prediction_30b"] = prediction(result["planner"])
    for p in result["prediction_30b"]:
        print(f"30B, {p['moments']} moments: {p['wire_gb']:.0f} GB on the wire "
              f"({p['minutes_at_1gbit']:.0f} min)")  # fmt: skip
    write_result("statecode", result)
    return result


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--predict", action="store_true", help="only the 30B prediction, from the results file")
    args = ap.parse_args()
    if args.predict:
        predict_only()
    else:
        main(args.quick)
