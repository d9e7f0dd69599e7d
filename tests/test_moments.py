"""Int8 AdamW moments (`InnerOptim.moments = int8`, specs §6.2.1): the grid and its rounding, the
training state's layout and hashes, bitwise replays in another process (1 and 2 pinned threads),
the genuine-state check on decoded moments, and a verifier that accepts an honest int8 host and
rejects cheaters."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

from nodekit.objects import Kind, ObjectPolicy
from protocol import moments as qm
from protocol.config import InnerOptim, Moments, ReplayMode, RunConfig
from protocol.inner import optimizer_bytes_per_param, state_bytes_per_param
from protocol.tensors import canonical_header, canonical_size, specs_of
from protocol.wire import from_any, to_any
from replay.step import (
    Int8AdamW,
    StateError,
    TrainJob,
    configure_determinism,
    load_training_state,
    optimizer_hash,
    train_segment,
    training_hash,
    training_state,
)
from tests.support.replay import HOST, ROOT, fresh, tiny_cfg, tiny_corpus
from verifier.update_space import genuine_mismatch, genuine_ratio

INT8 = {"moments": "int8", "warmup_steps": 4}
FP32 = {"moments": "fp32"}
"""The float32 moments, named: the default is int8, and these tests set an int8 state beside one."""


def _grid(signed: bool) -> torch.Tensor:
    return torch.tensor(sorted(set((qm.M_VALUES if signed else qm.V_VALUES).abs().tolist())))


@pytest.mark.parametrize("signed", [True, False])
def test_codes_are_the_nearest_grid_value_ties_up(signed: bool) -> None:
    grid = _grid(signed)
    mids = (grid[1:] + grid[:-1]) / 2
    g = torch.Generator().manual_seed(1)
    octaves = torch.randint(0, 40, (50_000,), generator=g).float()
    r = torch.rand(50_000, generator=g) * torch.pow(2.0, -octaves)
    x = torch.cat([r, mids, grid, mids.nextafter(torch.tensor(0.0)), mids.nextafter(torch.tensor(2.0))])
    x = torch.cat([x, torch.zeros((-x.numel()) % qm.BLOCK)])
    x.view(-1, qm.BLOCK)[:, 0] = 1.0  # every block's scale is 1: the codes are of x itself
    if signed:
        x = x * torch.where(torch.rand(x.numel(), generator=g) < 0.5, -1.0, 1.0)
    q, s = qm.quantize(x, signed)
    assert bool((s == 1).all())
    got = qm.dequantize(q, s).abs()
    d = (x.abs()[:, None] - grid[None, :]).abs()
    nearest = torch.where(d == d.min(dim=1, keepdim=True).values, grid, torch.tensor(-1.0)).max(dim=1).values
    assert torch.equal(got, nearest)
    assert torch.equal(torch.sign(qm.dequantize(q, s)), torch.sign(x) * (got > 0))


def test_the_grid() -> None:
    assert qm.M_VALUES[-1] == 1 and qm.V_VALUES[-1] == 1 and qm.M_VALUES[qm.M_TOP] == 0
    assert qm.mag(1) == 15 / 16 and qm.mag(8) == 0.5 and qm.mag(254) == 10 * 2.0**-35
    assert float(qm.M_VALUES[qm.M_TOP + 1]) == qm.mag(126) == 10 * 2.0**-19
    assert optimizer_bytes_per_param(Moments.INT8) == 2 + 8 / 256 == qm.bytes_per_param(Moments.INT8)
    assert state_bytes_per_param(Moments.INT8) == 6.03125 and state_bytes_per_param() == 12


def test_quantize_pair_zeroes_m_where_v_is_below_the_grid() -> None:
    m = torch.tensor([1.0, 1e-3, -0.5, 0.25] * 64)
    v = torch.tensor([1.0, 1e-12, 0.5, 0.0] * 64)
    qm_, _, qv, _ = qm.quantize_pair(m, v)
    assert bool((qv[1::4] == 0).all()) and bool((qm_[1::4] == 0).all()) and bool((qm_[3::4] == 0).all())
    assert bool((qm_[2::4] < 0).all())


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(allow_nan=False, allow_infinity=False, width=32), min_size=1, max_size=700))
def test_any_float32_tensor_quantizes_to_valid_codes_within_half_a_step(xs: list[float]) -> None:
    x = torch.tensor(xs, dtype=torch.float32)
    for signed in (True, False):
        y = x if signed else x.abs()
        q, s = qm.quantize(y, signed)
        qm.check_codes(qm.M_NAME if signed else qm.V_NAME, q, s, tuple(y.shape))
        back = qm.dequantize(q, s)
        per = s.repeat_interleave(qm.BLOCK)[: y.numel()]
        # half a grid step (≤ 1/18 of the value) above the grid's floor, else at most the floor
        floor = per * qm.mag((qm.M_TOP if signed else qm.V_TOP) - 1)
        err = (back - y).abs()
        assert bool((err <= torch.maximum(y.abs() / 17, floor)).all())


def test_bad_codes_are_refused_with_one_error() -> None:
    shape = (300,)
    good_q, good_s = torch.zeros(shape, dtype=torch.int8), torch.zeros(2)
    qm.check_codes(qm.M_NAME, good_q, good_s, shape)
    for q, s in [
        (torch.full(shape, -128, dtype=torch.int8), good_s),
        (good_q, torch.tensor([1.0, -1.0])),
        (good_q, torch.tensor([1.0, float("nan")])),
        (good_q, torch.zeros(3)),
        (torch.zeros(shape, dtype=torch.uint8), good_s),
    ]:
        with pytest.raises(qm.MomentCodeError):
            qm.check_codes(qm.M_NAME, q, s, shape)


# ---------------------------------------------------------------- config


def test_config_field_is_int8_by_default_omitted_there_and_refused_with_tolerance_mode() -> None:
    default, int8 = tiny_cfg(), tiny_cfg(inner={"moments": "int8"})
    fp32 = tiny_cfg(inner=FP32)
    assert default.inner.moments is Moments.INT8 and default.config_hash() == int8.config_hash()
    assert "moments" not in default.inner.model_dump() and "moments" not in int8.inner.model_dump()
    assert fp32.inner.moments is Moments.FP32 and fp32.inner.model_dump()["moments"] == "fp32"
    assert fp32.config_hash() != default.config_hash()
    assert InnerOptim(moments="") == InnerOptim() == InnerOptim(moments="int8")  # an unset proto3 string
    tol = dict(replay_mode=ReplayMode.TOLERANCE, tolerance=1e-3, tolerance_exp_avg=1e-3,
               tolerance_exp_avg_sq=1e-3)  # fmt: skip
    with pytest.raises(ValueError, match=r"replay_mode 'tolerance' needs inner\.moments = 'fp32'"):
        RunConfig(**{**default.model_dump(), **tol})  # the default's moments, unnamed
    with pytest.raises(ValueError, match=r"needs inner\.moments = 'fp32'"):
        tiny_cfg(inner=INT8, **tol)  # named: not replaced by tolerance_moments
    assert tiny_cfg(**tol).inner.moments is Moments.FP32  # unnamed: the test helper fills fp32 in


def test_config_crosses_the_wire() -> None:
    from protocol.messages import MsgCreateRun

    msg = MsgCreateRun(creator="gonka1" + "q" * 38, config=tiny_cfg(inner=INT8))
    back = from_any(to_any(msg))
    assert isinstance(back, MsgCreateRun) and back.config.inner.moments is Moments.INT8
    assert back.config.config_hash() == msg.config.config_hash()


# ---------------------------------------------------------------- the state


def test_int8_state_layout_sizes_and_fresh_hash() -> None:
    configure_determinism(1)
    cfg = tiny_cfg(inner=INT8)
    model, opt = fresh(cfg)
    assert isinstance(opt, Int8AdamW)
    state = training_state(model, opt, copy=True)
    assert not any(k.startswith(("exp_avg/", "exp_avg_sq/")) for k in state)
    policy = ObjectPolicy.of(model, cfg)
    assert specs_of(state) == policy.specs[Kind.STATE]
    assert canonical_size(specs_of(state)) == policy.length(Kind.STATE)
    data = sum(p.numel() * 6 + 2 * 4 * qm.n_blocks(p.numel()) for p in model.parameters()) + 4  # + step
    assert canonical_size(specs_of(state)) - len(canonical_header(specs_of(state))) == data
    fp32_len = ObjectPolicy.of(model, tiny_cfg(inner=FP32)).length(Kind.STATE)
    assert policy.length(Kind.STATE) / fp32_len < 0.52

    from verifier.verify import fresh_optimizer_hash

    assert fresh_optimizer_hash(model, cfg.state_chunk_bytes, Moments.INT8) == optimizer_hash(state)
    assert fresh_optimizer_hash(model, cfg.state_chunk_bytes, Moments.FP32) != optimizer_hash(state)


def test_moments_are_their_codes_after_every_step_and_a_loaded_state_continues_bitwise() -> None:
    configure_determinism(1)
    cfg, data = tiny_cfg(inner=INT8), tiny_corpus()
    model, opt = fresh(cfg)
    train_segment(TrainJob(cfg, data, HOST, 0), model, opt, 0, 5)
    mid = training_state(model, opt, copy=True)
    for p in model.parameters():
        st_ = opt.state[p]
        assert st_["exp_avg_code"].dtype == torch.int8 and st_["exp_avg_sq_code"].dtype == torch.uint8
        assert bool((st_["exp_avg_sq_code"] > 0).any())
    train_segment(TrainJob(cfg, data, HOST, 0), model, opt, 5, 5)
    end = training_hash(training_state(model, opt))
    m2, o2 = fresh(cfg)
    load_training_state(m2, o2, mid)
    train_segment(TrainJob(cfg, data, HOST, 0), m2, o2, 5, 5)
    assert training_hash(training_state(m2, o2)) == end
    # the codes are the state: a fetch written into them in place is what the next step uses
    m3, o3 = fresh(cfg)
    live = training_state(m3, o3)
    with torch.no_grad():
        for k, t in live.items():
            t.copy_(mid[k])
    for p in m3.parameters():
        o3.state[p]["step"].copy_(mid["step"])
    train_segment(TrainJob(cfg, data, HOST, 0), m3, o3, 5, 5)
    assert training_hash(training_state(m3, o3)) == end
    # an int8 state does not load into an fp32 optimizer, nor bad codes into an int8 one
    with pytest.raises(StateError):
        load_training_state(*fresh(tiny_cfg(inner=FP32)), mid)
    bad = dict(mid)
    bad[next(k for k in mid if k.startswith("exp_avg_code/"))] = torch.full_like(bad[next(
        k for k in mid if k.startswith("exp_avg_code/"))], -128)  # fmt: skip
    with pytest.raises(StateError, match="-128"):
        load_training_state(*fresh(cfg), bad)


REPLAY = """
import json, sys, torch
from safetensors.torch import load_file
sys.path.insert(0, {root!r})
from tests.support.replay import HOST, fresh, tiny_cfg, tiny_corpus
from replay.step import TrainJob, configure_determinism, load_training_state, train_segment
from replay.step import training_hash, training_state
configure_determinism({threads})
cfg = tiny_cfg(inner=json.loads({inner!r}))
model, opt = fresh(cfg)
load_training_state(model, opt, load_file({path!r}))
train_segment(TrainJob(cfg, tiny_corpus(), HOST, 3), model, opt, 5, 5)
print(training_hash(training_state(model, opt)))
"""


@pytest.mark.parametrize("threads", [1, 2])
def test_int8_segment_replays_bitwise_in_another_process(tmp_path: Path, threads: int) -> None:
    before = torch.get_num_threads()
    try:
        configure_determinism(threads)
        cfg, data = tiny_cfg(inner=INT8), tiny_corpus()
        model, opt = fresh(cfg)
        train_segment(TrainJob(cfg, data, HOST, 3), model, opt, 0, 5)
        save_file(training_state(model, opt, copy=True), str(tmp_path / "start.safetensors"))
        train_segment(TrainJob(cfg, data, HOST, 3), model, opt, 5, 5)
        end_hash = training_hash(training_state(model, opt))
    finally:
        torch.set_num_threads(before)
    path = str(tmp_path / "start.safetensors")
    code = REPLAY.format(root=str(ROOT), inner=cfg.inner.model_dump_json(), path=path, threads=threads)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == end_hash

    m, o = fresh(cfg)  # a skipped step is not the same state
    load_training_state(m, o, load_file(str(tmp_path / "start.safetensors")))
    train_segment(TrainJob(cfg, data, HOST, 3), m, o, 5, 4)
    assert training_hash(training_state(m, o)) != end_hash


def test_genuine_check_on_int8_states() -> None:
    configure_determinism(1)
    cfg, data = tiny_cfg(inner=INT8, inner_steps=40), tiny_corpus()
    model, opt = fresh(cfg)
    assert genuine_mismatch(training_state(model, opt), cfg.inner) is None  # fresh: all zero
    worst = 0.0
    for j in range(8):
        train_segment(TrainJob(cfg, data, HOST, 0), model, opt, 5 * j, 5)
        state = training_state(model, opt, copy=True)
        assert genuine_mismatch(state, cfg.inner) is None
        worst = max(worst, genuine_ratio(state, cfg.inner))
    assert 0 < worst < 1.5
    # a forged exp_avg where exp_avg_sq's code is 0 (AdamW would step lr·m/ε) is not genuine
    name = next(k.split("/", 1)[1] for k in state if k.startswith("exp_avg_code/"))
    forged = dict(state)
    forged[f"exp_avg_code/{name}"] = torch.full_like(state[f"exp_avg_code/{name}"], 127)
    forged[f"exp_avg_scale/{name}"] = state[f"exp_avg_scale/{name}"].clamp_min(1e-3)
    forged[f"exp_avg_sq_code/{name}"] = torch.zeros_like(state[f"exp_avg_sq_code/{name}"])
    assert "no AdamW run" in (genuine_mismatch(forged, cfg.inner) or "")
    bad = dict(state)
    bad[f"exp_avg_scale/{name}"] = -state[f"exp_avg_scale/{name}"] - 1
    assert "non-negative" in (genuine_mismatch(bad, cfg.inner) or "")


# ---------------------------------------------------------------- a verifier


def test_verifier_accepts_an_honest_int8_host_and_rejects_cheaters(tmp_path: Path) -> None:
    from gonka_diloco.adversaries import resolve_host
    from gonka_diloco.adversaries.hosts import LazyHost
    from gonka_diloco.adversaries.lab import (
        Lab,
        carried_optimizer,
        next_global,
        synthetic_corpus,
        tiny_config,
    )
    from nodekit.globalmodel import GlobalModel
    from protocol.messages import Reason
    from trainer.behaviour import HostBehaviour
    from verifier.verify import verify

    a, b, seed = "gonka1" + "a" * 38, "gonka1" + "b" * 38, "ab" * 32
    threads = torch.get_num_threads()
    configure_determinism(1)
    try:
        lab = Lab(tiny_config(inner={"moments": "int8"}), synthetic_corpus(), tmp_path)
        g0 = GlobalModel.from_module(lab.build()[0])
        step0 = {a: lab.train(HostBehaviour(), a, 0, g0), b: lab.train(HostBehaviour(), b, 0, g0)}
        last = lab.cfg.n_segments - 1
        for run in step0.values():
            out = verify(lab.job(run, 0, seed, sampled=[0, last]), run.source(), lab.replay_context(g0))
            assert out.reason is Reason.ACCEPT, out.detail
        g1 = next_global(g0, list(step0.values()), lab.cfg)
        carried, h = carried_optimizer(step0[a])

        def step1(behaviour: HostBehaviour, sampled: list[int]) -> Reason:
            run = lab.train(behaviour, a, 1, g1, carried, h, extra={"peer_payloads": {}})
            return verify(lab.job(run, 1, seed, sampled=sampled), run.source(), lab.replay_context(g1)).reason

        assert step1(HostBehaviour(), [0, last]) is Reason.ACCEPT  # carries its int8 optimizer state
        for name in ("noise", "wrong_data"):
            assert step1(resolve_host(name), [0, last]) is not Reason.ACCEPT, name
        lazy = LazyHost(fraction=0.5, seed=3)
        faked = lazy.faked(lab.cfg, a, 1)
        assert step1(lazy, [min(faked), last]) is Reason.REPLAY_MISMATCH
    finally:
        torch.set_num_threads(threads)


def test_moment_vectors() -> None:
    """specs/vectors/moments.json recomputed from its inputs (§6.2.1)."""
    import json

    from specs.make_vectors import VECTORS
    from specs.state_vectors import _bits, _floats

    vs = json.loads((VECTORS / "moments.json").read_text())
    for v in vs[:2]:
        q, s = qm.quantize(_floats(v["input"]["x"]), v["input"]["signed"])
        assert [int(c) for c in q.tolist()] == v["output"]["codes"] and _bits(s) == v["output"]["scales"]
        assert _bits(qm.dequantize(q, s)) == v["output"]["decoded"]
    pair = vs[2]
    got = qm.quantize_pair(_floats(pair["input"]["m"]), _floats(pair["input"]["v"]))
    assert [int(c) for c in got[0].tolist()] == pair["output"]["m_codes"]
    assert [int(c) for c in got[2].tolist()] == pair["output"]["v_codes"]
    assert any(c == 0 for c in pair["output"]["v_codes"])
