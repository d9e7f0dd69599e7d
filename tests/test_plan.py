"""The cost model's formulas against hand-worked cases, and `gonka-diloco plan` end to end."""

from __future__ import annotations

import itertools
import json
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gonka_diloco import plan as pm
from gonka_diloco.plan import (
    Cheat,
    Constants,
    Floors,
    Inputs,
    PhaseBlocks,
    Pipeline,
    Sharding,
    Timeline,
)
from gonka_diloco.plan_cli import app, parse_bytes, parse_count, parse_rate
from gonka_diloco.plan_constants import load_constants
from protocol.config import Codec, ReplayMode, RunConfig, Sampling
from protocol.inner import Moments

C = Constants(codec_ratio={"fp32": 1.0, "bf16": 2.0, "int8": 4.0, "int4": 8.0}, sha256_bytes_per_s=2e9)
"""Round constants so every expected value below can be worked by hand."""
FP32 = Moments.FP32
"""The hand-worked byte counts below are float32 moments' (12 B/param states, 8 B/param optimizer
states), so those tests name them; the default, int8 (6.03 and 2.03), is worked by hand in
`test_int8_moments_halve_what_a_check_downloads_and_the_host_keeps`."""
SEGMENTS = Sampling.SEGMENTS
"""The old rule (every check opens the same s segments): the tests of it say so."""


# ---------------------------------------------------------------- compute and sizes


def test_inner_step_is_six_flops_per_param_token() -> None:
    # 6 · 1e9 · 1e6 = 6e15 FLOP on 8 GPUs × 1e15 × 0.5 = 4e15 FLOP/s → 1.5 s
    assert pm.inner_step_seconds(1e9, 1_000_000, 8, 1e15, 0.5) == pytest.approx(1.5)


def test_model_shape() -> None:
    assert pm.model_shape(1e9, d_model=2048, layers=16) == (2048, 16)
    p = 12 * 32 * 4096**2  # Llama-7B-like: d/L = 128
    assert pm.model_shape(p) == (4096, 32)
    assert pm.model_shape(p, layers=32) == (4096, 32)
    assert pm.model_shape(p, d_model=4096) == (4096, 32)


def test_sizes() -> None:
    assert pm.state_bytes(1e9) == 12e9
    assert pm.delta_bytes(1e6, Codec.INT8, C) == 1e6  # 4 MB of fp32 at 4×
    assert pm.delta_bytes(1e6, Codec.FP32, C) == 4e6


def test_leaf_hashing_uses_at_most_one_thread_per_chunk() -> None:
    # 12 GB in 64 MiB chunks = 179 chunks > 96 cores: 12e9 / (96 · 2e9 · 0.8) s
    assert pm.leaf_hash_seconds(1e9, 96, 64 * 2**20, C) == pytest.approx(12e9 / (96 * 1.6e9))
    # 12 MB is one chunk: one thread, however many cores
    assert pm.leaf_hash_seconds(1e6, 96, 64 * 2**20, C) == pytest.approx(12e6 / 1.6e9)


def test_boundary_costs() -> None:
    assert pm.snapshot_seconds(1e9, 8, 25e9) == pytest.approx(12e9 / 200e9)
    assert pm.boundary_stall(3.0, 5.0) == 0.0
    assert pm.boundary_stall(7.0, 5.0) == 2.0
    # 2·4·1e9 / (8 · 25e9) = 0.04 s over PCIe + 28e9 / 200e9 = 0.14 s of CPU AdamW
    assert pm.offload_seconds(1e9, 8, 25e9, 200e9) == pytest.approx(0.18)


# ---------------------------------------------------------------- checkpoints and disk


def test_recompute_segments_by_hand() -> None:
    # n = 4, s = 2, m = 2: the random opening is 0, 1 or 2; the last (3) needs 1 segment from 2.
    # j = 0 → 0 + 1; j = 1 → 1 + 1; j = 2 → shares the pass to 3 → 1. Mean 4/3.
    assert pm.recompute_segments(4, 2, 2) == pytest.approx(4 / 3)
    assert pm.recompute_segments(100, 8, 1) == 0.0


@pytest.mark.parametrize(("n", "s", "m"), [(6, 3, 2), (7, 2, 3), (9, 4, 4), (10, 3, 5), (5, 5, 2)])
def test_recompute_segments_against_enumeration(n: int, s: int, m: int) -> None:
    costs = []
    for chosen in itertools.combinations(range(n - 1), s - 1):
        opened = {*chosen, n - 1}
        costs.append(sum(max((j % m for j in opened if j // m == b), default=0) for b in range(n // m + 1)))
    assert pm.recompute_segments(n, s, m) == pytest.approx(sum(costs) / len(costs))


def test_disk_states() -> None:
    sparse = Inputs(moments=FP32, H=500, k=5, m=10, s=8, sampling=SEGMENTS)
    assert pm.disk_states(sparse) == 100 / 10 + 8 + 3
    assert pm.disk_states(replace(sparse, m=3)) == 34 + 8 + 3  # ⌈100/3⌉
    today = replace(sparse, pipeline=Pipeline.TODAY)
    assert pm.disk_states(today) == pytest.approx(101 + 4 * 8 / 12)  # all boundaries + 2 G + 2 optimizer
    assert pm.disk_bytes(today, C) == pytest.approx((101 + 8 / 3) * 12 * 30e9 + 30e9)


# ---------------------------------------------------------------- memory


def test_gpu_memory_sharding() -> None:
    i = Inputs(params=8e9, gpus_per_host=8, d_model=4096, layers=40, micro_tokens=1000)
    fsdp = pm.gpu_memory(i)
    assert fsdp["sharded"] == 16 * 8e9 / 8  # weights, moments, gradients: 16 B/param over 8 ranks
    assert fsdp["replicated"] == 12 * 4096**2 * 8  # two bf16 layers gathered + one fp32 layer of grads
    assert fsdp["activations"] == 1000 * 4096 * (2 * 40 + 34)
    assert fsdp["total"] == pytest.approx(fsdp["sharded"] + fsdp["replicated"] + fsdp["activations"] + 3e9)
    assert pm.gpu_memory(replace(i, sharding=Sharding.NONE))["replicated"] == 16 * 8e9
    assert pm.gpu_memory(replace(i, sharding=Sharding.ZERO1))["sharded"] == 8 * 8e9 / 8
    assert pm.gpu_memory(replace(i, sharding=Sharding.ZERO2))["sharded"] == 12 * 8e9 / 8
    assert pm.gpu_memory(replace(i, sharding=Sharding.FSDP_OFFLOAD))["sharded"] == 8 * 8e9 / 8


# ---------------------------------------------------------------- bytes


def test_verifier_bytes_per_contribution() -> None:
    i = Inputs(moments=FP32, params=1e9, s=8, codec=Codec.INT8, sampling=SEGMENTS)
    assert pm.verifier_bytes_per_contribution(replace(i, pipeline=Pipeline.TODAY), C) == 8 * 12e9 + 1e9
    f = pm.segment_fetches(i.n, i.s)
    assert pm.verifier_bytes_per_contribution(i, C) == pytest.approx(f.starts * 12e9 + f.segment_zero * 8e9)
    tol = replace(i, replay=ReplayMode.TOLERANCE)
    assert pm.verifier_bytes_per_contribution(tol, C) == pytest.approx(
        f.boundaries * 12e9 + f.segment_zero * 8e9 + 1e9
    )
    # n = 3, s = 2: segment 2 always, one of 0, 1: {0, 2} fetches 2's start and the optimizer, {1, 2}
    # only 1's start (2's is the end of 1, replayed); tolerance {0,2}: 1, 2, 3; {1,2}: 1, 2, 3
    three = pm.segment_fetches(3, 2)
    assert (three.starts, three.segment_zero, three.boundaries) == pytest.approx((1.0, 0.5, 3.0))


@pytest.mark.parametrize(("n", "s"), [(5, 2), (6, 3), (8, 4), (4, 4), (2, 1), (10, 1)])
def test_segment_fetches_against_enumeration(n: int, s: int) -> None:
    """Every draw of the s − 1 random openings; downloads as `verifier.verify` makes them: an opened
    start unless it is 0 or the end of the opened segment before (bitwise), every boundary of an
    opened segment but 0 (tolerance), the optimizer when segment 0 is opened."""
    draws = [{*r, n - 1} for r in itertools.combinations(range(n - 1), s - 1)]
    starts = [sum(1 for j in o if j > 0 and j - 1 not in o) for o in draws]
    bounds = [len({b for j in o for b in (j, j + 1)} - {0}) for o in draws]
    zero = [0 in o for o in draws]
    f = pm.segment_fetches(n, s)
    assert f.starts == pytest.approx(sum(starts) / len(draws))
    assert f.boundaries == pytest.approx(sum(bounds) / len(draws))
    assert f.segment_zero == pytest.approx(sum(zero) / len(draws))


def test_host_and_verifier_transfers() -> None:
    i = Inputs(moments=FP32, params=1e9, s=2, v=2, hosts=4, verifier_nodes=2, audit_p=0.5, auditors=2,
               sampling=SEGMENTS)
    assert pm.checks_per_contribution(i) == 3.0  # 2 drawn + 0.5 × 2 auditors
    assert pm.contributions_per_verifier(i) == 6.0  # 4 hosts × 3 checks over 2 verifiers
    f = pm.segment_fetches(i.n, 2)
    per = f.starts * 12e9 + f.segment_zero * 8e9
    up = pm.host_upload_bytes(i, C)
    assert up["openings"] == pytest.approx(3 * per)
    assert up["delta"] == 3 * 1e9  # multi-source: about what it downloads
    assert pm.host_download_bytes(i, C) == 3 * 1e9
    assert pm.verifier_download_bytes(i, C) == pytest.approx(6 * per + 4 * 1e9)
    today = replace(i, pipeline=Pipeline.TODAY)
    assert pm.host_upload_bytes(today, C)["delta"] == (3 + 2) * 1e9  # the author serves everyone


# ---------------------------------------------------------------- detection and deterrence


def test_detection() -> None:
    assert pm.faked_segments(100, 0.5) == 50
    assert pm.faked_segments(4, 1.0) == 3  # never the last one
    assert pm.detection_probability(100, 50, 2) == pytest.approx(50 / 99)
    assert pm.detection_probability(4, 1, 2) == pytest.approx(1 / 3)
    assert pm.detection_probability(100, 50, 1) == 0.0  # only the last segment, which it did not fake
    assert pm.detection_probability(10, 9, 2) == 1.0
    assert pm.naive_detection(0.5, 3) == 0.875


def test_cheat_outcome_by_hand() -> None:
    # σ = 0.5, v = 2, p = 0.5, one auditor, a fake Δ (always caught by an honest check):
    # success = 0.5² · (1 − 0.5 + 0.5 · 0.5) = 0.1875; caught first 0.75; by audit 0.25 · 0.5 · 0.5
    c = pm.cheat_outcome(0.5, 2, 0.5, 1, 1.0)
    assert (c.success, c.caught_first, c.caught_audit) == pytest.approx((0.1875, 0.75, 0.0625))
    # no accomplices, a lazy host caught half the time, no audits: success = 1 − detection
    lazy = pm.cheat_outcome(0.0, 3, 0.0, 1, 0.5)
    assert (lazy.success, lazy.caught_first, lazy.caught_audit) == pytest.approx((0.5, 0.5, 0.0))
    # the brief's form: σ^v · (1 − p + p·σ^a)
    assert pm.cheat_outcome(0.2, 3, 0.1, 2, 1.0).success == pytest.approx(0.2**3 * (0.9 + 0.1 * 0.04))


def test_profit_and_deterrent_slash() -> None:
    c = Cheat(success=0.1875, caught_first=0.75, caught_audit=0.0625)
    assert pm.expected_profit(c, 10.0, 2.0, 8.0) == pytest.approx(1.875 - 1.5 - 0.5)
    assert pm.min_deterrent_slash(c, 10.0) == pytest.approx(1.875 / 0.8125)
    assert pm.expected_profit(c, 10.0, 1.875 / 0.8125, 1.875 / 0.8125) == pytest.approx(0.0)
    assert pm.min_deterrent_slash(Cheat(1.0, 0.0, 0.0), 1.0) == math.inf


def test_cheat_gain() -> None:
    i = Inputs(reward=32.0, hosts=16, gpus_per_host=8, gpu_hour_value=2.0, attack_value=5.0)
    # 2 GNK reward share + half of 8 GPUs × 1 h × 2 GNK + 5
    assert pm.cheat_gain(i, 0.5, 3600.0) == pytest.approx(2 + 8 + 5)


# ---------------------------------------------------------------- sampling windows


def test_block_lengths() -> None:
    assert pm.block_lengths(10, 3) == [3, 3, 3, 1]  # B = ⌈10/3⌉ = 4, the last short
    assert pm.block_lengths(100, 3) == [3] * 33 + [1]
    assert pm.block_lengths(6, 6) == [6]
    assert Inputs(H=50, k=5, w=3).blocks == 4
    assert Inputs(H=50, k=5, w=30).window_len == 10  # w as drawn: at most n


def test_window_check_bytes_by_hand() -> None:
    # n = 10, w = 3, P = 1e9: blocks of 3, 3, 3, 1 segments
    lengths = [3, 3, 3, 1]
    by = [pm.window_check_bytes(1e9, lengths, b, bitwise=True) for b in range(4)]
    # block 0: the optimizer; the others their start. No θ_H's parameters: only the last block's check
    # (ending at θ_H) checks Δ, and a window short of θ_H fetches the committed Δ to keep, the Δ its
    # verifier downloads anyway to aggregate (not counted here)
    assert by == [8e9, 12e9, 12e9, 12e9]
    # tolerance: + every later claimed boundary of the block (L_b states) + the Δ (1 GB); the block
    # before the lone last one replays on into it: θ_H's claimed end, a whole state (12 GB)
    tol = [pm.window_check_bytes(1e9, lengths, b, bitwise=False, delta=1e9) for b in range(4)]
    assert tol == [8e9 + 36e9 + 1e9, 12e9 + 36e9 + 1e9, 12e9 + 36e9 + 12e9 + 1e9, 12e9 + 12e9 + 1e9]
    i = Inputs(moments=FP32, params=1e9, H=50, k=5, w=3, codec=Codec.INT8)
    # (1/B)·8P + ((B−1)/B)·12P = 2 + 9 GB
    assert pm.verifier_bytes_per_contribution(i, C) == pytest.approx(11e9)
    assert pm.verifier_bytes_per_contribution(replace(i, codec=Codec.SPARSE), C) == pytest.approx(15e9)  # + e
    assert pm.verifier_bytes_per_contribution(replace(i, w=10), C) == 8e9  # B = 1: the optimizer only
    tolerance = replace(i, replay=ReplayMode.TOLERANCE)
    assert pm.verifier_bytes_per_contribution(tolerance, C) == pytest.approx((45 + 49 + 61 + 25) / 4 * 1e9)
    assert pm.opened_state_bytes(i) == pytest.approx(11e9)  # the utilization bound: states alone


def test_coded_states_on_the_wire_by_hand() -> None:
    """Training states travel coded against G_n (specs §8.2): ÷ the measured ratio for the run's
    moments; the carried optimizer state, e and Δ as they are."""
    coded = Constants(
        codec_ratio=C.codec_ratio, sha256_bytes_per_s=2e9, state_code_ratio={"fp32": 1.25, "int8": 2.0}
    )
    lengths = [3, 3, 3, 1]
    by = [pm.window_check_bytes(1e9, lengths, b, bitwise=True, ratio=1.25) for b in range(4)]
    assert by == pytest.approx([8e9, 9.6e9, 9.6e9, 9.6e9])
    i = Inputs(moments=FP32, params=1e9, H=50, k=5, w=3, codec=Codec.INT8)
    assert pm.code_ratio(i, coded) == 1.25 and pm.code_ratio(i, C) == 1.0  # nothing measured: uncoded
    assert pm.code_ratio(replace(i, pipeline=Pipeline.TODAY), coded) == 1.0  # the old design: uncoded
    assert pm.code_ratio(replace(i, moments=Moments.INT8), coded) == 2.0
    # (1/4)·8 + (3/4)·12/1.25 = 2 + 7.2 GB
    assert pm.verifier_bytes_per_contribution(i, coded) == pytest.approx(9.2e9)
    # int8 moments: states of 6.03125 B/param ÷ 2, the optimizer 2.03125 B/param as it is
    q = replace(i, moments=Moments.INT8)
    want = (2.03125 + 3 * 6.03125 / 2) / 4 * 1e9
    assert pm.verifier_bytes_per_contribution(q, coded) == pytest.approx(want)
    seg = Inputs(moments=FP32, params=1e9, s=8, codec=Codec.INT8, sampling=SEGMENTS)
    f = pm.segment_fetches(seg.n, seg.s)
    assert pm.verifier_bytes_per_contribution(seg, coded) == pytest.approx(
        f.starts * 9.6e9 + f.segment_zero * 8e9
    )
    assert pm.from_zero_check_bytes(1e9) == 8e9  # the optimizer alone, uncoded: no θ_H
    assert pm.opened_state_bytes(i, 1.25) == pytest.approx(9.2e9)


def test_windows_fetch_no_theta_h_and_the_author_sends_each_check_its_own() -> None:
    """Windows: only the check that ends at θ_H checks Δ against it, so no check fetches θ_H's
    parameters (specs §6); each check fetches its own block's start, distinct from the others', so
    the author uploads c × one check's bytes and there is nothing for swarming to save (§8.1)."""
    # n = 4 segments of w = 1: B = 4; v = 2 + p·a = 1 × 1: c = 3 checks on distinct blocks
    i = Inputs(moments=FP32, params=1e9, H=20, k=5, w=1, v=2, auditors=1, audit_p=1.0, codec=Codec.INT8)
    assert (i.blocks, pm.checks_per_contribution(i)) == (4, 3.0)
    # one check: (1/4)·8 + (3/4)·12 = 11 GB; all three 33 GB, from the author. Coded at 1.25: 3 × 9.2
    assert pm.verifier_bytes_per_contribution(i, C) == pytest.approx(11e9)
    assert pm.host_openings_bytes(i, C) == pytest.approx(33e9)
    coded = Constants(codec_ratio=C.codec_ratio, state_code_ratio={"fp32": 1.25, "int8": 1.25})
    assert pm.host_openings_bytes(i, coded) == pytest.approx(27.6e9)
    assert pm.host_upload_bytes(i, C)["openings"] == pm.host_openings_bytes(i, C)
    assert pm.states_by_kind(i, C)["theta_h"] == 0.0
    # segments (every check fetches the same opened states at once) and today's pipeline: c × one check
    seg = replace(i, sampling=SEGMENTS, s=2)
    assert pm.host_openings_bytes(seg, C) == pytest.approx(3 * pm.verifier_bytes_per_contribution(seg, C))
    today = replace(i, pipeline=Pipeline.TODAY)
    assert pm.host_openings_bytes(today, C) == pytest.approx(3 * pm.verifier_bytes_per_contribution(today, C))
    # the verification window: the host's uplink carries its openings, each verifier its load
    fast = replace(i, hosts=2, verifier_nodes=3, up=1e9, down=2e9)
    w = pm.verify_seconds(fast, C, t_step=1.0)
    load = pm.contributions_per_verifier(fast)  # 2 hosts × 3 checks ÷ 3 verifiers = 2
    assert w["data"] == pytest.approx(max(33e9 / 1e9, load * 11e9 / 2e9))
    # the sweep's utilization bound counts the same uploads (states alone), coded
    train = fast.H * pm.step_seconds(fast)
    assert pm.utilization_bound(fast, True, coded) == pytest.approx(train / max(train, 27.6))


def test_window_replay_and_the_start_from_segment_zero() -> None:
    assert pm.window_replay_segments(10, 3) == 2.5  # n/B
    assert pm.window_replay_segments(10, 3, tolerance=True) == 2.5 + 0.25  # block 2 takes on the lone 9
    assert pm.window_replay_segments(9, 3, tolerance=True) == 3.0  # no lone block
    # from segment 0 to the block's end: 3, 6, 9, 10 → 7 = w·(B − 1)/2 + n/B = 4.5 + 2.5
    assert pm.from_zero_segments(10, 3) == 7.0
    assert pm.from_zero_segments(9, 3) == pytest.approx((3 + 6 + 9) / 3)
    assert pm.from_zero_check_bytes(1e9) == 8e9 and pm.from_zero_check_bytes(1e9, ef=4e9) == 12e9
    i = Inputs(params=1e9, H=50, k=5, w=3, v=4, auditors=3, audit_p=1.0)
    assert pm.replay_segments_per_check(i) == 2.5
    assert pm.replay_share(i) == pytest.approx(7 * 2.5 * 5 / 50)  # checks · (n/B) · k/H
    assert pm.verify_seconds(i, C, t_step=2.0)["replay"] >= 2.5 * 5 * 2.0
    assert pm.replay_segments_per_check(replace(i, sampling=SEGMENTS, s=4)) == 4


def test_window_detection_by_hand() -> None:
    assert pm.window_fake_blocks(100, 3, 0.5) == 17  # 50 segments packed into ⌈50/3⌉ blocks
    assert pm.window_fake_blocks(100, 3, 0.01) == 1
    assert pm.window_fake_blocks(10, 3, 1.0) == 4  # every block, the last segment too
    assert pm.window_detection(34, 17, 7) == pytest.approx(1 - math.comb(17, 7) / math.comb(34, 7))
    assert pm.window_detection(4, 1, 9) == 1.0  # more draws than blocks: every block is drawn
    # one fake block of B = 4, v = 1, a = 1, p = 0.5: caught (v + p·a)/B = 1.5/4
    assert 1 - pm.window_cheat(4, 1, 1, 1, 0.5, 0.0).success == pytest.approx(0.375)
    i = Inputs(H=500, k=5, w=3, v=4, auditors=3, audit_p=1.0)
    assert pm.one_segment_detection(i) == pytest.approx(7 / 34)
    assert pm.one_segment_detection(replace(i, audit_p=0.5)) == pytest.approx(5.5 / 34)
    assert pm.lazy_detection(i, 0.5) == pytest.approx(pm.window_detection(34, 17, 7))  # p = 1: all 7 blocks
    # p = 0.5: the 4 initial blocks always, the 3 audit blocks half the time
    half = replace(i, audit_p=0.5)
    expect = 0.5 * pm.window_detection(34, 17, 4) + 0.5 * pm.window_detection(34, 17, 7)
    assert pm.lazy_detection(half, 0.5) == pytest.approx(expect)
    assert pm.one_segment_detection(replace(i, sampling=SEGMENTS, s=8)) == pytest.approx(7 / 99)


def test_window_collusion_by_hand() -> None:
    # B = 4 with F = 2 fake, v = 1, a = 1, p = 1, σ = 1/2: the two slots take distinct blocks;
    # (K1, K2) = (1, 1) w.p. 1/6, (1, 0) and (0, 1) 1/3 each, (0, 0) 1/6:
    # success = 1/6 + 2 · 1/3 · 1/2 + 1/6 · 1/4 = 13/24; caught first = 1 − E[σ^K1] = 1 − 3/4
    c = pm.window_cheat(4, 2, 1, 1, 1.0, 0.5)
    assert c.success == pytest.approx(13 / 24)
    assert c.caught_first == pytest.approx(1 / 4)
    assert c.caught_audit == pytest.approx(3 / 4 - 13 / 24)
    # every block fake: each slot holder must be an accomplice, as for a fake Δ
    every = pm.window_cheat(4, 4, 2, 1, 0.5, 0.3)
    assert every.success == pytest.approx(pm.fake_delta_success(0.3, 2, 0.5, 1))


@pytest.mark.parametrize(("B", "F", "v", "a"), [(5, 2, 2, 1), (4, 1, 3, 3), (3, 2, 4, 2), (6, 3, 1, 4)])
@pytest.mark.parametrize("sigma", [0.0, 0.3])
def test_window_cheat_against_enumeration(B: int, F: int, v: int, a: int, sigma: float) -> None:
    """Every keyed order of B blocks (slot j takes order[j mod B], `prf.draw_windows`), the fake ones
    being 0..F−1: a fake block passes a round iff every slot holder on it is an accomplice."""
    p = 0.4
    first = both = 0.0
    orders = list(itertools.permutations(range(B)))
    for order in orders:
        k1 = sum(1 for j in range(v) if order[j % B] < F)
        k2 = sum(1 for j in range(v, v + a) if order[j % B] < F)
        first += sigma**k1 / len(orders)
        both += sigma ** (k1 + k2) / len(orders)
    c = pm.window_cheat(B, F, v, a, p, sigma)
    assert c.success == pytest.approx((1 - p) * first + p * both)
    assert c.caught_first == pytest.approx(1 - first)
    assert c.caught_audit == pytest.approx(p * (first - both))


def test_recompute_windows_by_hand() -> None:
    # bitwise, n = 4, w = 1 (4 blocks), one drawn, m = 2: persisted 0, 2 and θ_H (4); block 1 needs
    # boundary 1 (one segment from 0), block 3 boundary 3 (one from 2), each drawn 1/4 of the time
    assert pm.recompute_windows(4, 1, 1, 2) == pytest.approx(0.5)
    # tolerance, n = 4, w = 2 (blocks 0..2 and 2..4), m = 4: persisted 0 and 4; the last segment's
    # ends (3, 4) are always needed, so either block costs one pass from 0 to 3
    assert pm.recompute_windows(4, 2, 1, 4, tolerance=True) == pytest.approx(3.0)
    assert pm.recompute_windows(100, 3, 7, 1) == 0.0


@pytest.mark.parametrize("tolerance", [False, True])
def test_blocks_needing_counts_window_needs(tolerance: bool) -> None:
    for n, w in ((10, 3), (12, 4), (7, 1), (5, 5)):
        B = -(-n // w)
        for lo in range(n + 1):
            for top in range(lo, n + 1):
                needs = [pm.window_needs(n, w, b, tolerance) for b in range(B)]
                want = sum(1 for need in needs if any(lo <= j <= top for j in need))
                assert pm.blocks_needing(w, B, lo, top, tolerance) == want, (n, w, lo, top)


@pytest.mark.parametrize(
    ("n", "w", "x", "m", "tolerance"),
    [(10, 3, 2, 3, False), (12, 2, 3, 5, False), (9, 1, 4, 4, False), (10, 3, 2, 4, True), (8, 2, 5, 3, True),
     (7, 7, 3, 2, False)],
)  # fmt: skip
def test_recompute_windows_against_enumeration(n: int, w: int, x: int, m: int, tolerance: bool) -> None:
    """Every draw of x distinct blocks; what the host needs is `trainer.recompute.needed_boundaries` of
    the drawn windows, rebuilt as `plan_openings` does: from the nearest persisted boundary below
    each (`Boundaries.persisted` with windows: every m-th and θ_H), one pass per source up to its
    farthest need."""
    from protocol.prf import window_blocks, windows_opened
    from trainer.recompute import needed_boundaries

    mode = ReplayMode.TOLERANCE if tolerance else ReplayMode.BITWISE
    on_disk = {j for j in range(n + 1) if j == n or j % m == 0}
    B = window_blocks(n, w)
    costs = []
    for drawn in itertools.combinations(range(B), min(x, B)):
        starts = [b * w for b in drawn]
        needed = needed_boundaries(windows_opened(starts, n, w), mode, starts)
        farthest: dict[int, int] = {}
        for j in needed - on_disk:
            q = max((q for q in on_disk if q <= j), default=0)
            farthest[q] = max(farthest.get(q, 0), j - q)
        costs.append(sum(farthest.values()))
    assert pm.recompute_windows(n, w, x, m, tolerance) == pytest.approx(sum(costs) / len(costs))


def test_window_disk_and_recompute_in_the_plan() -> None:
    i = Inputs(H=500, k=5, m=10, w=3, v=4, auditors=3)
    assert pm.disk_states(i) == 10 + (7 + 1) + 3  # ⌈n/m⌉ + (v + a) + θ_H + 3
    assert pm.disk_states(replace(i, w=50)) == 10 + (2 + 1) + 3  # only B = 2 distinct starts to hold
    assert pm.disk_states(replace(i, replay=ReplayMode.TOLERANCE)) == 10 + (7 * 4 + 2) + 3
    assert pm.opening_recompute(i) == pytest.approx(pm.recompute_windows(100, 3, 7, 10))
    assert pm.opening_recompute(replace(i, pipeline=Pipeline.TODAY)) == 0.0


def test_window_plan_figures() -> None:
    i = Inputs(moments=FP32, params=1e9, H=50, k=5, w=3, v=4, auditors=3, audit_p=1.0, codec=Codec.INT8, m=1)
    p = pm.plan(i, C)
    ver = p.verification
    assert ver["checks_per_contribution"] == 7.0
    assert ver["states_per_contribution"] == pytest.approx(7 * 11e9 / 12e9)  # all checks ÷ 12·P
    assert ver["one_segment_detection"] == 1.0  # 7 slots cover all B = 4 blocks
    assert (ver["window_segments"], ver["blocks"], ver["replay_segments_per_check"]) == (3, 4, 2.5)
    # each check its own block's start or the optimizer, and no θ_H: 7 × 11 GB leave the author
    assert p.network["host_upload_openings_bytes"] == pytest.approx(7 * 11e9)
    assert p.security["detection"] == pytest.approx(pm.lazy_detection(i, 0.5))
    seg = pm.plan(replace(i, sampling=SEGMENTS, s=2), C).verification
    f = pm.segment_fetches(10, 2)
    per = f.starts * 12e9 + f.segment_zero * 8e9
    assert seg["states_per_contribution"] == pytest.approx(7 * per / 12e9)
    assert seg["one_segment_detection"] == pytest.approx(1 / 9)  # (s − 1)/(n − 1)


def test_collusion_share_bound() -> None:
    assert pm.collusion_share_bound(4, 1.0, 3) == 0.5  # 0.5^7 = 0.78% ≤ 1%: every coalition below ½
    assert pm.collusion_share_bound(2, 0.0, 1) == pytest.approx(0.1)  # σ² ≤ 1%
    assert pm.collusion_share_bound(1, 0.0, 1) == pytest.approx(0.01)


def test_economics_at_the_defaults_and_off_them() -> None:
    from gonka_diloco.plan_cli import economics_sentence

    p = pm.plan(Inputs(), C)
    e = p.economics
    assert e["at_run_defaults"] and e["meets_all"], e
    assert e["half_fake_caught"] >= 0.9 and e["half_fake_profit"] < 0 and e["one_segment_caught"] >= 0.2
    # windows (the default): a fake Δ is a one-block fake of the last block, B = 34, 7 slots
    assert e["fake_delta_success_alone"] == pytest.approx(1 - 7 / 34)
    assert e["fake_delta_success_at_coalition"] == pytest.approx(1 - 7 / 34 * 0.5)
    assert e["fake_delta_caught_floor"] == pytest.approx(0.1) and e["fake_delta_sigma_bound"] == 0.5
    text = economics_sentence(e)
    assert text.startswith("defaults meet the cheating floors") and "one-block fake of the last block" in text
    weak = pm.plan(Inputs(v=1, audit_p=0.1, auditors=1), C).economics
    assert not weak["at_run_defaults"] and not weak["meets_all"]
    assert weak["meets"] == {"half_fake": False, "one_segment": False, "coalition": False}
    text = economics_sentence(weak)
    assert text.startswith("these settings do not meet") and text.count("NOT MET") == 3
    # sampling segments: every check replays segment n − 1, so every one checks Δ: σ^v·(1 − p + p·σ^a)
    seg = pm.plan(Inputs(sampling=SEGMENTS), C).economics
    assert seg["meets"]["coalition"] and seg["fake_delta_success_at_coalition"] == pytest.approx(0.5**7)
    assert "for every coalition below 50%" in economics_sentence(seg)
    weak = pm.plan(Inputs(v=1, audit_p=0.1, auditors=1, sampling=SEGMENTS), C).economics
    assert not weak["meets"]["coalition"]
    assert weak["fake_delta_sigma_bound"] == pytest.approx(0.0111, abs=1e-3)
    assert "only for coalitions up to σ = 0.011" in economics_sentence(weak)


def test_windows_coalition_floor_is_the_one_block_fake_of_the_last_block() -> None:
    """Windows: only the check that ends at θ_H checks Δ, so a fake Δ (with a θ_H to match) meets
    only the slots on the last block: `window_cheat(B, 1, …)`, not σ^v·(1 − p + p·σ^a); the floor
    is a catch of ≥ 20% × (1 − σ) at σ = ½, which many small blocks miss however many checkers."""
    i = Inputs(w=1)  # B = n = 100 blocks, 7 slots: caught 7% alone, 3.5% at σ = ½
    e = pm.plan(i, C).economics
    one_block = pm.window_cheat(100, 1, 4, 3, 1.0, 0.5).success
    assert e["fake_delta_success_at_coalition"] == pytest.approx(one_block)
    assert e["fake_delta_success_at_coalition"] == pytest.approx(1 - 0.07 * 0.5)
    assert e["fake_delta_success_at_coalition"] > 0.5**7  # what every check seeing Δ would have given
    assert not e["meets"]["coalition"] and e["fake_delta_sigma_bound"] is None  # 7% < 20% even alone
    assert "not even without accomplices) (NOT MET)" in economics_sentence_of(e)
    # while v + a ≤ B the catch is (v + p·a)/B·(1 − σ): the floor holds at every σ or at none, as the
    # one-segment floor does (B = 40: 17.5% < 20%)
    assert pm.plan(Inputs(H=600), C).economics["fake_delta_sigma_bound"] is None
    # v + a > B: a block holds several slots, and a coalition must hold every one on the last block
    small = Inputs(H=50, k=5, w=3)  # B = 4, 7 slots
    assert pm.fake_delta_cheat(small, 0.5) == pm.window_cheat(4, 1, 4, 3, 1.0, 0.5)
    assert pm.plan(small, C).economics["meets"]["coalition"]
    # tolerance with a lone last segment: the block before it replays on into segment n − 1 and
    # reaches θ_H too, so a fake Δ is seen from two blocks (n = 100, w = 3: 33 blocks and the lone 99)
    tol = replace(Inputs(moments=FP32), replay=ReplayMode.TOLERANCE)
    assert pm.fake_delta_blocks(tol) == 2 and pm.fake_delta_blocks(Inputs()) == 1
    assert pm.fake_delta_blocks(replace(tol, w=4)) == 1  # n mod w = 0: no lone last segment
    assert pm.fake_delta_cheat(tol, 0.0) == pm.window_cheat(34, 2, 4, 3, 1.0, 0.0)
    # the sweep holds its colluder (σ = `dishonest_stake`) to the same floor
    assert pm.collusion_floor_met(Inputs(), 0.1) and not pm.collusion_floor_met(i, 0.1)


def economics_sentence_of(e: dict[str, object]) -> str:
    from gonka_diloco.plan_cli import economics_sentence

    return economics_sentence(e)


@pytest.mark.parametrize("sampling", list(Sampling))
def test_most_profitable_fake_is_the_top_of_the_profit_curve(sampling: Sampling) -> None:
    i = Inputs(H=50, k=5, w=2, s=3, sampling=sampling)
    train = 3600.0
    slash, a_slash = pm.host_slash(i), pm.audit_slash(i)
    curve = {
        j: pm.expected_profit(pm.lazy_cheat(i, j / 10), pm.cheat_gain(i, j / 10, train), slash, a_slash)
        for j in range(1, 11)
    }
    faked, profit, deterring = pm.most_profitable_fake(i, train)
    assert profit == max(curve.values()) and curve[faked] == profit
    cheat = pm.lazy_cheat(i, faked / 10)
    assert deterring == pytest.approx(pm.min_deterrent_slash(cheat, pm.cheat_gain(i, faked / 10, train)))


def test_choose_window() -> None:
    i = Inputs()
    ch = pm.choose_window(i, C)
    fit = [o for o in ch.options if o.replay_share <= 0.25 and o.one_segment_detection >= 0.2]
    assert ch.within_budget and ch.replay_share <= 0.25 and len(ch.options) == i.n
    best = min(o.overlapped_s for o in fit)
    assert ch.overlapped_s <= best * 1.005
    assert not any(o.w > ch.w and o.overlapped_s <= best * 1.005 for o in fit)  # the largest of the fastest
    # the defaults' w is the one w within the budget that also catches a one-segment fake in ≥ 20%:
    # replay 7/B ≤ 25% needs B ≥ 28 (w ≤ 3), detection 7/B ≥ 20% needs B ≤ 35 (w ≥ 3)
    assert ch.w == ch.w_one_segment_floor == RunConfig.model_fields["window_segments"].default == 3
    # at this size a 360 GB start downloads faster than ~50 segments replay from G_n
    assert ch.start == "download" and ch.from_zero_check_s is not None
    assert ch.download_check_s < ch.from_zero_check_s
    tiny = pm.choose_window(i, C, budget=0.01)  # 7/B ≤ 1% needs B ≥ 700 > n
    assert not tiny.within_budget and tiny.w == 1
    fast_replay = pm.choose_window(replace(i, step_seconds=1e-3, up=1e6, down=1e6), C)
    assert fast_replay.start == "from-0"  # replay is free, bytes are not
    assert pm.choose_window(replace(i, replay=ReplayMode.TOLERANCE), C).from_zero_check_s is None


def test_sweep_varies_w_under_windows() -> None:
    floors = Floors(utilization=0.5, detection=0.9, collusion_success=0.01, max_H=100)
    base = Inputs(params=1e9, H=100, host_stake=10_000.0, up=1.25e9, down=1.25e9)
    found = pm.sweep(base, C, floors, top=50)
    assert found and len({p.inputs["w"] for p in found}) > 1
    for p in found:
        assert p.security["detection"] >= 0.9
        assert p.security["detection"] == pytest.approx(pm.lazy_detection(replace(
            base, H=p.inputs["H"], k=p.inputs["k"], w=p.inputs["w"], v=p.inputs["v"]), 0.5))  # fmt: skip


# ---------------------------------------------------------------- time and utilization


def test_timeline_schedules() -> None:
    tl = Timeline(train=100, stall=0, commit=3, recompute=10, reveal=1, verify=50, finalize=1, aggregate=20,
                  result=1, poc_wait=0)  # fmt: skip
    assert tl.sequential == 100 + 3 + 10 + 1 + 50 + 1 + 20 + 1
    assert tl.overlapped == 110  # GPU-bound: train + recompute outlasts the 86 s after training
    slow = replace(tl, verify=150)
    assert slow.overlapped == 3 + 10 + 1 + 150 + 1 + 20 + 1
    assert pm.utilization(100, 200) == 0.5
    assert pm.utilization(100, 200, poc_share=0.1) == pytest.approx(0.45)
    assert pm.run_cost(0.5, 0.1) == pytest.approx(2.1)


def test_overlapped_period_is_the_eager_schedule_with_two_steps_in_flight() -> None:
    tl = Timeline(train=100, stall=0, commit=3, recompute=10, reveal=1, verify=50, finalize=1, aggregate=20,
                  result=1, poc_wait=0)  # fmt: skip
    # step n+1's GPU work (its training + step n's opening recompute) hides step n's 86 s tail
    assert tl.overlap_fits and tl.overlapped == tl.gpu == 110
    slow = replace(tl, verify=150)  # the tail outlasts a train phase: hosts wait for step n's result
    assert not slow.overlap_fits and slow.overlapped == slow.after_training == 186
    # fixed phases (the chain's opening rule, specs §2.2.1): P ≥ train + 1 blocks, 2P ≥ a whole step
    ph = PhaseBlocks(16, 8, 12)
    assert pm.configured_overlapped_period(ph, 0.5, aggregate=0.2) == pytest.approx(19.5 / 2)  # 2P ≥ 39
    long_train = PhaseBlocks(40, 8, 12)
    assert pm.configured_overlapped_period(long_train, 0.5, aggregate=0.2) == pytest.approx(41 * 0.5)
    p = pm.plan(Inputs(params=1e9, phases=ph, block_seconds=5.0), Constants())
    assert p.utilization["configured_overlapped"] >= p.utilization["configured"]
    assert p.timeline["gpu"] >= p.timeline["train"] and p.timeline["after_training"] > 0


def test_configured_period_matches_the_devnet_phase_arithmetic() -> None:
    # train 16 + 1 + reveal 8 + verify 12 blocks to finalization, a result block, a block to open:
    # 39 blocks, as a 0.5 s devnet measures (open heights 51, 90).
    assert pm.configured_period(PhaseBlocks(16, 8, 12), 0.5, aggregate=0.2) == pytest.approx(19.5)
    assert pm.configured_period(PhaseBlocks(16, 8, 12), 0.5, aggregate=1.2) == pytest.approx(20.5)


def test_poc_wait() -> None:
    i = Inputs(epoch_blocks=100, poc_blocks=10, block_seconds=5.0)
    assert pm.poc_wait_seconds(i) == pytest.approx(10**2 / 200 * 5)
    assert pm.poc_wait_seconds(Inputs()) == 0.0


def test_verify_window() -> None:
    i = Inputs(moments=FP32, params=1e9, s=2, k=5, v=1, hosts=2, verifier_nodes=1, audit_p=0.0, up=1e9,
               down=2e9, sampling=SEGMENTS)  # fmt: skip
    f = pm.segment_fetches(i.n, 2)
    per = f.starts * 12e9 + f.segment_zero * 8e9  # the expected start states + the optimizer state
    w = pm.verify_seconds(i, C, t_step=1.0)
    assert w["data"] == pytest.approx(max(per / 1e9, 2 * per / 2e9))  # host uplink vs two downloads
    assert w["replay"] == 2 * 10.0
    assert w["total"] == pytest.approx(max(w["data"], w["replay"]) + min(per / 2e9, 10.0))


def test_plan_hangs_together() -> None:
    i = Inputs(params=30e9, hosts=16, H=500, k=5, s=8, v=1, m=10, sampling=SEGMENTS)
    p = pm.plan(i, C)
    tl = p.timeline
    assert tl["train"] == pytest.approx(500 * pm.step_seconds(i))
    assert p.utilization["sequential"] == pytest.approx(tl["train"] / tl["sequential"])
    assert p.utilization["overlapped"] >= p.utilization["sequential"]
    assert tl["recompute"] == pytest.approx(pm.recompute_segments(100, 8, 10) * 5 * pm.step_seconds(i))
    assert p.security["detection"] == pytest.approx(pm.detection_probability(100, 50, 8))
    # checks per contribution v + p·a = 1 + 1 × 3 (RunConfig's audits: every accepted one, by 3)
    assert p.verification["replay_share"] == pytest.approx(4 * 8 * 5 / 500)
    assert p.phases["train"] == math.ceil(tl["train"] * 1.2 / 1.0)  # the chain's 1 s blocks
    assert json.dumps(p.to_json(), default=str)
    big = pm.plan(replace(i, params=50e9), C)
    assert any("does not fit" in w for w in big.warnings)  # 16 B/param over 8 × 80 GB: no
    assert not pm.plan(replace(i, params=50e9, sharding=Sharding.FSDP_OFFLOAD), C).warnings


def test_the_codec_is_recommended_by_host_count() -> None:
    """int8 while its aggregation stays under half the training time, the sparse codec past it
    (issue 37); the limit is the first host count whose share reaches half."""
    i = Inputs(params=30e9, hosts=16, H=500)
    limit = pm.host_limit(i, C, Codec.INT8)
    assert limit is not None and 2 < limit < 1000
    assert pm.aggregation_share(replace(i, hosts=limit), C, Codec.INT8) >= pm.AGGREGATION_SHARE_LIMIT
    assert pm.aggregation_share(replace(i, hosts=limit - 1), C, Codec.INT8) < pm.AGGREGATION_SHARE_LIMIT
    sparse_limit = pm.host_limit(i, C, Codec.SPARSE)
    assert sparse_limit is not None and sparse_limit > 5 * limit  # a ~36× smaller Δ
    below, above = pm.plan(replace(i, hosts=limit - 1), C), pm.plan(replace(i, hosts=limit), C)
    assert below.codec["recommended"] == "int8" and not any("codec" in w for w in below.warnings)
    assert above.codec["recommended"] == "sparse"
    assert any("codec sparse recommended" in w for w in above.warnings)
    # the warning's own figure does not stand in for the plan's replay share (it once did)
    assert above.verification["replay_share"] == pytest.approx(pm.replay_share(replace(i, hosts=limit)))
    assert not any("codec" in w for w in pm.plan(replace(i, hosts=limit, codec=Codec.SPARSE), C).warnings)


def test_configured_phases_that_are_too_short_are_flagged() -> None:
    i = Inputs(params=1e9, phases=PhaseBlocks(train=1, reveal=1, verify=1))
    p = pm.plan(i, C)
    assert "configured" in p.utilization
    assert any("train phase too short" in w for w in p.warnings)


@pytest.mark.parametrize("sampling", list(Sampling))
def test_sweep_meets_its_floors_cheapest_first(sampling: Sampling) -> None:
    floors = Floors(utilization=0.85, detection=0.9, collusion_success=0.01)
    # audits as the published plan's scenario (p = 10%, one auditor): at the chain's own p = 1,
    # a = 3 the openings' upload keeps every setting under 85% at 1 Gbit/s
    base = Inputs(params=30e9, audit_p=0.1, auditors=1, host_stake=10_000.0, block_seconds=5.0,
                  sampling=sampling)  # fmt: skip
    found = pm.sweep(base, C, floors, top=5)
    assert found
    assert all(p.inputs["sampling"] == sampling for p in found)
    costs = [p.cost for p in found]
    assert costs == sorted(costs)
    for p in found:
        assert p.utilization["overlapped"] >= 0.85 and not p.warnings
        assert p.security["detection"] >= 0.9
        coll = p.security["collusion_success"]  # windows: a fake Δ caught ≥ 20% × (1 − σ) instead
        assert 1 - coll >= 0.2 * 0.9 - 1e-9 if sampling is Sampling.WINDOWS else coll <= 0.01
        assert p.security["lazy_profit"] < 0 and p.security["collusion_profit"] < 0
        assert p.inputs["codec"] != "int4"  # 9% error: above the default quality floor
    # a slower link can only make the best setting costlier (or impossible)
    slow = pm.sweep(replace(base, up=12.5e6, down=12.5e6), C, floors, top=1)
    assert not slow or slow[0].cost >= found[0].cost


# ---------------------------------------------------------------- constants


def test_constants_come_from_results_with_their_source(tmp_path: Path) -> None:
    (tmp_path / "hashing.json").write_text(json.dumps({"hashlib_sha256_gb_s": 1.5, "quick": True}))
    rows = [dict(codec="int8", ratio_vs_fp32=3.5, encode_mb_s=100, decode_mb_s=200, rel_l2_error=0.01)]
    (tmp_path / "codecs.json").write_text(json.dumps({"rows": rows}))
    (tmp_path / "chain_sim.json").write_text("{not json")
    c = load_constants(tmp_path)
    assert c.sha256_bytes_per_s == 1.5e9
    assert "hashing.json (quick run" in c.sources["sha256_bytes_per_s"]
    assert c.codec_ratio["int8"] == 3.5 and c.codec_decode["int8"] == 200e6
    assert c.codec_ratio["int4"] == Constants().codec_ratio["int4"]  # not measured: the default
    assert c.chain_ms_per_msg == Constants().chain_ms_per_msg
    assert c.sources["chain_ms_per_msg"] == "default"
    assert load_constants(tmp_path / "absent").sources["codec_ratio"] == "default"


def test_scale_figures_are_read_under_the_keys_bench_scale_writes(tmp_path: Path) -> None:
    from bench import plan as bp

    written = (Path(__file__).resolve().parents[1] / "bench" / "scale.py").read_text()
    for keys in bp.SCALE_KEYS.values():  # the first name of each is what bench.scale writes today
        assert f'"{keys[0]}"' in written, keys[0]
    d = {"hash_efficiency": 0.6, "disk_states": 6.8, "verifier_download_ratio": 1.0}
    d |= {"H": 6, "k": 2, "s": 2, "m": 2}
    (tmp_path / "scale.json").write_text(json.dumps(d))
    c = load_constants(tmp_path)
    assert c.hash_efficiency == 0.6 and "scale.json (full run" in c.sources["hash_efficiency"]
    measured = [r["measured"] for r in bp.scale_rows(tmp_path / "scale.json")]
    assert measured == [6.8, 1.0, 0.6]
    (tmp_path / "scale.json").write_text(json.dumps({"hashing_ratio": 0.48, "host_disk_peak_states": 6.84}))
    assert load_constants(tmp_path).hash_efficiency == 0.48  # results written before the keys were aligned
    assert [r["measured"] for r in bp.scale_rows(tmp_path / "scale.json")] == [6.84, None, 0.48]


# ---------------------------------------------------------------- the command


def test_units() -> None:
    assert parse_rate("1Gbit") == 125e6
    assert parse_rate("1 Gbps") == 125e6
    assert parse_rate("100Mb/s") == 12.5e6
    assert parse_rate("2GB/s") == 2e9
    assert parse_rate("125MBps") == 125e6
    assert parse_bytes("30TB") == 30e12
    assert parse_bytes("64MiB") == 64 * 2**20
    assert parse_count("30B") == 30e9
    assert parse_count("30e9") == 30e9
    assert parse_count("1Mi") == 2**20
    assert parse_count("500M") == 500e6
    for bad, parse in (("fast", parse_rate), ("1 parsec", parse_bytes), ("lots", parse_count)):
        with pytest.raises(ValueError):
            parse(bad)


runner = CliRunner()


def test_cli_json_follows_the_flags() -> None:
    r = runner.invoke(app, ["--params", "10B", "--hosts", "8", "-H", "100", "-k", "10", "-s", "3", "--up",
                            "10Gbit", "--down", "10Gbit", "--sampling", "segments", "--json"])  # fmt: skip
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    i = out["plan"]["inputs"]
    assert (i["params"], i["hosts"], i["H"], i["k"], i["s"], i["up"]) == (10e9, 8, 100, 10, 3, 1.25e9)
    assert out["plan"]["security"]["detection"] == pytest.approx(pm.detection_probability(10, 5, 3))
    assert "sources" in out["constants"]


def test_cli_sampling_flags_window_choice_and_economics() -> None:
    r = runner.invoke(app, ["--params", "1B", "-w", "5", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    i, ver = out["plan"]["inputs"], out["plan"]["verification"]
    assert (i["sampling"], i["w"]) == ("windows", 5)
    assert ver["blocks"] == 20 and ver["one_segment_detection"] == pytest.approx(7 / 20)
    ch = out["window_choice"]
    assert ch["replay_share"] <= 0.25 and ch["start"] in ("download", "from-0") and len(ch["options"]) == 100
    assert out["plan"]["economics"]["sentence"].startswith("these settings")  # w = 5 is not the default
    seg = json.loads(runner.invoke(app, ["--params", "1B", "--sampling", "segments", "--json"]).output)
    assert seg["plan"]["verification"]["one_segment_detection"] == pytest.approx(7 / 99)
    table = runner.invoke(app, ["--params", "1B"])
    assert table.exit_code == 0, table.output
    flat = " ".join(table.output.split())
    assert "window choice" in flat and "economics: defaults meet the cheating floors" in flat
    bad = runner.invoke(app, ["-w", "0"])
    assert bad.exit_code == 2 and "window-segments" in bad.output
    many = runner.invoke(app, ["-H", "20", "-k", "5", "--json"])  # s = 8 > n = 4 matters only for segments
    assert many.exit_code == 0, many.output
    assert runner.invoke(app, ["-H", "20", "-k", "5", "--sampling", "segments"]).exit_code == 2


def test_cli_tables_and_sweep() -> None:
    r = runner.invoke(app, ["--params", "1B", "--sweep", "--top", "2", "--min-util", "0.8"])
    assert r.exit_code == 0, r.output
    assert "utilization" in r.output and "machine constants" in r.output and "cheapest settings" in r.output


def test_cli_reads_a_run_config(tmp_path: Path) -> None:
    toml = tmp_path / "run.toml"
    toml.write_text(
        "inner_steps = 40\nsegment_len = 4\nsampled_segments = 3\nbatch_size = 4\nseq_len = 32\n"
        'audit_bps = 2500\naudit_verifiers = 2\nsampling = "segments"\nwindow_segments = 4\n'
        '[model]\nfactory = "trainer.model:small_gpt"\nconfig = { n_layer = 1, n_embd = 32, n_head = 2 }\n'
        "[phases]\ntrain_blocks = 30\nreveal_blocks = 5\nverify_blocks = 7\n"
    )
    r = runner.invoke(app, [str(toml), "--json", "-s", "2"])
    assert r.exit_code == 0, r.output
    i = json.loads(r.output)["plan"]["inputs"]
    assert (i["H"], i["k"], i["s"], i["tokens_per_step"]) == (40, 4, 2, 128)  # the flag wins over the file
    assert (i["sampling"], i["w"]) == ("segments", 4)
    assert i["phases"] == {"train": 30, "reveal": 5, "verify": 7}
    v = RunConfig.model_fields["verifiers_per_contribution"].default
    assert (i["v"], i["audit_p"], i["auditors"]) == (v, 0.25, 2)  # the run's audit, not the planner's
    assert 10_000 < i["params"] < 100_000  # counted from the model spec


def test_cli_bad_input_is_one_clear_error(tmp_path: Path) -> None:
    r = runner.invoke(app, ["-H", "100", "-k", "7"])
    assert r.exit_code == 2 and "not a multiple" in r.output
    r = runner.invoke(app, ["--up", "fast"])
    assert r.exit_code == 2 and "not a rate" in r.output
    r = runner.invoke(app, ["--gpu", "abacus"])
    assert r.exit_code == 2 and "unknown --gpu" in r.output
    bad = tmp_path / "bad.toml"
    bad.write_text('inner_steps = 10\nsegment_len = 3\n[model]\nfactory = "trainer.model:small_gpt"\n')
    r = runner.invoke(app, [str(bad)])
    assert r.exit_code == 2 and "multiple of segment_len" in r.output


def test_help_does_not_import_torch() -> None:
    code = (
        "import sys\nfrom typer.testing import CliRunner\nfrom gonka_diloco.cli import app\n"
        "r = CliRunner().invoke(app, ['plan', '--help'])\nassert r.exit_code == 0, r.output\n"
        "assert '--sweep' in r.output\nassert 'torch' not in sys.modules, 'torch imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# ---------------------------------------------------------------- one source of defaults, a budget, a plot


def test_defaults_are_the_chains() -> None:
    """`plan` with no flags plans the run `run create` makes of a bare config: RunConfig's H, k, s,
    v, audits, codec, replay and stake, and the chain's block interval (issue 27: the planner's own
    v = 1, p = 0.1, a = 1 showed a colluder succeeding 9.1% of the time at σ = 1/2)."""
    from chain.params import BLOCK_SECONDS

    f = RunConfig.model_fields
    i = Inputs()
    assert (i.H, i.k, i.s, i.v) == tuple(f[n].default for n in (
        "inner_steps", "segment_len", "sampled_segments", "verifiers_per_contribution"))  # fmt: skip
    assert (i.sampling, i.w) == (f["sampling"].default, f["window_segments"].default)
    assert (i.audit_p, i.auditors) == (f["audit_bps"].default / 10_000, f["audit_verifiers"].default)
    assert (i.codec, i.replay) == (f["codec"].default, f["replay_mode"].default)
    st = f["stake"].default
    assert (i.host_stake, i.host_slash_bps, i.audit_slash_bps, i.reward) == (
        st.min_host_stake / 1e9, st.host_slash_bps, st.fraud_host_slash_bps, st.reward_per_outer_step / 1e9
    )  # fmt: skip
    assert i.block_seconds == BLOCK_SECONDS
    r = runner.invoke(app, ["--dishonest-stake", "0.5", "--json", "--sampling", "segments"])
    assert r.exit_code == 0, r.output
    # the README's bound at the defaults v = 4, p = 1, a = 3: 0.5^4 · (1 − 1 + 1 · 0.5^3) = 0.5^7
    assert json.loads(r.output)["plan"]["security"]["collusion_success"] == pytest.approx(0.5**7)
    # windows (the default): a fake Δ is a one-block fake of the last block, met by the 7 slots' blocks
    # 7/34 of the time and then by an honest checker half the time
    r = runner.invoke(app, ["--dishonest-stake", "0.5", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["plan"]["security"]["collusion_success"] == pytest.approx(1 - 7 / 34 / 2)


README_RUN_TOML = """name = "mine"
inner_steps = 500
[inner]
lr = 4e-4
warmup_steps = 1000
decay_steps = 88000
[model]
factory = "trainer.hf:llama"
config = { preset = "small", vocab_size = 8192, seed = 1 }
"""
"""The run.toml the README's recipe wrote by hand before `gonka-diloco init` (issue 27: `plan`
refused it): a transformers preset that `run create` expands."""


def _readme_run_toml() -> str:
    return README_RUN_TOML


def test_plan_reads_the_readme_run_toml(tmp_path: Path) -> None:
    """Every run.toml `run create` accepts: here the README's own, a transformers preset (counted on
    the meta device, without building the weights), with flags on top."""
    from gonka_diloco.run_cli import parse_run_config
    from replay.hf import PRESETS

    toml = tmp_path / "run.toml"
    toml.write_text(_readme_run_toml())
    cfg = parse_run_config(toml)
    assert cfg.model.factory == "trainer.hf:llama"
    r = runner.invoke(app, [str(toml), "--json", "--hosts", "4"])
    assert r.exit_code == 0, r.output
    i = json.loads(r.output)["plan"]["inputs"]
    assert (i["H"], i["hosts"], i["tokens_per_step"]) == (cfg.inner_steps, 4, cfg.batch_size * cfg.seq_len)
    p = PRESETS["small"]
    embeddings = 2 * 8192 * p["hidden_size"]  # the config's vocab_size, untied input and output
    assert i["params"] > embeddings  # counted from the complete (expanded) config
    bad = tmp_path / "bad.toml"
    bad.write_text(_readme_run_toml().replace('preset = "small"', 'preset = "huge"'))
    r = runner.invoke(app, [str(bad)])
    assert r.exit_code == 2 and "unknown preset 'huge'" in r.output


def test_token_budget(tmp_path: Path) -> None:
    args = ["--params", "1B", "--hosts", "4", "-H", "100", "--tokens-per-step", "1Mi", "--tokens", "1T",
            "--json"]  # fmt: skip
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    b, p = out["budget"], out["plan"]
    per_outer = 4 * 100 * 2**20
    assert b["tokens_per_outer_step"] == per_outer and b["tokens_per_inner_step"] == 2**20
    assert b["outer_steps"] == math.ceil(1e12 / per_outer)
    assert b["wall_s"] == pytest.approx(b["outer_steps"] * p["timeline"]["overlapped"])
    gpus = 4 * 8
    assert b["host_gpu_hours"] == pytest.approx(b["wall_s"] * gpus / 3600)
    # hosts' wall time + verifiers' replays = the plan's cost × the useful training GPU-hours
    assert b["gpu_hours"] == pytest.approx(p["cost"] * b["useful_gpu_hours"])
    seq = json.loads(runner.invoke(app, [*args, "--no-overlap"]).output)["budget"]
    assert seq["wall_s"] > b["wall_s"]
    table = runner.invoke(app, ["--params", "1B", "--tokens", "1T"])
    assert table.exit_code == 0 and "GPU-hours" in table.output and "outer steps" in table.output
    bad = runner.invoke(app, ["--tokens", "lots"])
    assert bad.exit_code == 2 and "not a number" in bad.output


def test_plot(tmp_path: Path) -> None:
    png = tmp_path / "plan.png"
    r = runner.invoke(app, ["--params", "30B", "--plot", str(png)])
    assert r.exit_code == 0, r.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"plot: {png}" in r.output.replace("\n", "")
    r = runner.invoke(app, ["--plot", str(tmp_path / "missing" / "plan.png")])
    assert r.exit_code == 2 and "--plot" in r.output


def test_int8_moments_halve_what_a_check_downloads_and_the_host_keeps() -> None:
    i = Inputs(moments=FP32, params=1e9, H=500, k=5, w=3, v=4, auditors=3, m=3)
    half = replace(i, moments=Moments.INT8)
    B = 34
    state8, opt8 = 4e9 + 2.03125e9, 2.03125e9
    # block 0 downloads the optimizer, the others a start (no θ_H: only the last block checks Δ)
    want = (opt8 + (B - 1) * state8) / B
    assert pm.verifier_bytes_per_contribution(half, C) == pytest.approx(want)
    assert pm.disk_bytes(half, C) < pm.disk_bytes(i, C)
    assert pm.state_bytes(1e9, Moments.INT8) == pytest.approx(state8)
    assert pm.optimizer_bytes(1e9, Moments.INT8) == pytest.approx(opt8)


def test_states_by_kind_add_up_to_the_states_per_contribution() -> None:
    """Where a contribution's verification traffic goes (the plan's row prints it): the parts sum to
    `states_per_contribution`; bitwise, starts and no θ_H (only the check that ends at θ_H checks Δ,
    and fetches nothing for it); tolerance, claims, and θ_H whole where a window takes on the lone
    last segment."""
    i = Inputs(moments=FP32, params=1e9, H=50, k=5, w=3, codec=Codec.INT8)
    for mode in (ReplayMode.BITWISE, ReplayMode.TOLERANCE):
        j = replace(i, replay=mode)
        kinds = pm.states_by_kind(j, C)
        assert sum(kinds.values()) == pytest.approx(pm.states_per_contribution(j, C))
        assert (kinds["claims"] > 0) is (mode is ReplayMode.TOLERANCE)
    kinds = pm.states_by_kind(i, C)  # c = 7, B = 4: 3/4 of checks fetch a start (12 GB), none θ_H
    assert kinds["start"] == pytest.approx(7 * 0.75) and kinds["theta_h"] == 0.0
    # tolerance, n = 10, w = 3: block 2 of 4 takes on the lone segment 9 and fetches θ_H (a state)
    assert pm.states_by_kind(replace(i, replay=ReplayMode.TOLERANCE), C)["theta_h"] == pytest.approx(7 / 4)
    assert pm.states_by_kind(replace(i, sampling=Sampling.SEGMENTS), C) == {}


def test_states_per_contribution_at_defaults_have_no_theta_h() -> None:
    """Issue 35's aim (≤ 3 states per contribution at 30B, 64 hosts, the chain's defaults): with the
    opened states coded as `bench.statecode` measures them (r ≈ 1.27 for int8 moments), the starts
    alone, since no windowed check fetches θ_H's parameters (they were 1.88 of 4.61 states)."""
    coded = Constants(codec_ratio=C.codec_ratio, state_code_ratio={"fp32": 1.25, "int8": 1.25})
    i = Inputs(params=30e9, hosts=64)
    kinds = pm.states_by_kind(i, coded)
    assert kinds["theta_h"] == 0.0 and kinds["claims"] == 0.0
    # 7 checks: 33/34 of them a start of 6.03 B/param ÷ 1.25, 1/34 the optimizer (2.03 B/param), ÷ 12 B/param
    want = 7 * (33 / 34 * 6.03125 / 1.25 + 1 / 34 * 2.03125) / 12
    assert pm.states_per_contribution(i, coded) == pytest.approx(want) and want <= 3.0
