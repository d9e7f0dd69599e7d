"""THE replayable step: a segment replayed in another process lands on the same hash, bit for bit;
a skipped step or a swapped batch does not."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from replay.step import (
    StateError,
    TrainJob,
    configure_determinism,
    env_fingerprint,
    load_training_state,
    lr_at,
    optimizer_hash,
    train_segment,
    training_hash,
    training_state,
)
from tests.support.replay import HOST, ROOT, fresh, tiny_cfg, tiny_corpus

REPLAY = """
import json, sys, torch
from safetensors.torch import load_file
sys.path.insert(0, {root!r})
from tests.support.replay import HOST, fresh, tiny_cfg, tiny_corpus
from replay.step import TrainJob, configure_determinism, load_training_state, train_segment
from replay.step import training_hash, training_state
configure_determinism(1)
cfg = tiny_cfg(inner=json.loads({inner!r}))
model, opt = fresh(cfg)
load_training_state(model, opt, load_file({path!r}))
train_segment(TrainJob(cfg, tiny_corpus(), HOST, 3), model, opt, 5, 5)
print(training_hash(training_state(model, opt)))
"""


def test_segment_replays_bitwise_in_another_process(tmp_path: Path) -> None:
    configure_determinism(1)
    cfg = tiny_cfg(inner={"warmup_steps": 4})
    data = tiny_corpus()
    model, opt = fresh(cfg)
    train_segment(TrainJob(cfg, data, HOST, 3), model, opt, 0, 5)
    start = training_state(model, opt, copy=True)
    save_file(start, str(tmp_path / "start.safetensors"))
    train_segment(TrainJob(cfg, data, HOST, 3), model, opt, 5, 5)
    end_hash = training_hash(training_state(model, opt))

    path = str(tmp_path / "start.safetensors")
    code = REPLAY.format(root=str(ROOT), inner=cfg.inner.model_dump_json(), path=path)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == end_hash

    # cheating variants, replayed in this process from the same start
    def replay(start_inner: int, n: int, host: str = HOST, outer: int = 3) -> str:
        m, o = fresh(cfg)
        load_training_state(m, o, load_file(str(tmp_path / "start.safetensors")))
        train_segment(TrainJob(cfg, data, host, outer), m, o, start_inner, n)
        return training_hash(training_state(m, o))

    assert replay(5, 5) == end_hash
    assert replay(5, 4) != end_hash  # skipped step
    assert replay(6, 5) != end_hash  # shifted (swapped) batches
    assert replay(5, 5, outer=4) != end_hash  # batches of another outer step


def test_fresh_state_equals_loaded_zero_state() -> None:
    cfg = tiny_cfg()
    a_model, a_opt = fresh(cfg)
    zero = training_state(a_model, a_opt, copy=True)
    assert float(zero["step"]) == 0 and all(not v.any() for k, v in zero.items() if k.startswith("exp_avg"))
    b_model, b_opt = fresh(cfg)
    load_training_state(b_model, b_opt, zero)
    data = tiny_corpus()
    train_segment(TrainJob(cfg, data, HOST, 0), a_model, a_opt, 0, 3)
    train_segment(TrainJob(cfg, data, HOST, 0), b_model, b_opt, 0, 3)
    sa, sb = training_state(a_model, a_opt), training_state(b_model, b_opt)
    assert training_hash(sa) == training_hash(sb)
    assert optimizer_hash(sa) == optimizer_hash(sb)
    assert float(sa["step"]) == 3


def test_foreach_and_per_tensor_adamw_agree() -> None:
    """`make_optimizer` updates tensor by tensor (no model-sized temporaries); the multi-tensor
    update it replaced lands on the same bits, with weight decay and gradient slices."""
    cfg = tiny_cfg()
    data = tiny_corpus()
    hashes = []
    for foreach in (True, False):
        model, opt = fresh(cfg)
        assert opt.param_groups[0]["foreach"] is False and opt.param_groups[0]["weight_decay"] > 0
        for g in opt.param_groups:
            g["foreach"] = foreach
        train_segment(TrainJob(cfg, data, HOST, 0, micro_batches=2), model, opt, 0, 3)
        hashes.append(training_hash(training_state(model, opt)))
        assert all(p.grad is None for p in model.parameters())  # freed at the segment's end
    assert hashes[0] == hashes[1]


def test_micro_batches_change_the_trajectory_only_slightly() -> None:
    cfg = tiny_cfg()
    data = tiny_corpus()
    (m1, o1), (m2, o2) = fresh(cfg), fresh(cfg)
    l1 = train_segment(TrainJob(cfg, data, HOST, 0), m1, o1, 0, 3)
    l2 = train_segment(TrainJob(cfg, data, HOST, 0, micro_batches=2), m2, o2, 0, 3)
    assert l1[0] == pytest.approx(l2[0], rel=1e-5)
    p1, p2 = dict(m1.named_parameters()), dict(m2.named_parameters())
    assert all(torch.allclose(p1[k], p2[k], atol=1e-4) for k in p1)
    with pytest.raises(ValueError, match="equal slices"):
        train_segment(TrainJob(cfg, data, HOST, 0, micro_batches=3), m1, o1, 0, 1)


def test_warmup_and_bad_states() -> None:
    cfg = tiny_cfg(inner={"warmup_steps": 10})
    assert lr_at(cfg.inner, 0) == pytest.approx(cfg.inner.lr / 10)
    assert lr_at(cfg.inner, 9) == cfg.inner.lr == lr_at(cfg.inner, 500)
    model, opt = fresh(cfg)
    state = training_state(model, opt, copy=True)
    with pytest.raises(StateError, match="missing"):
        load_training_state(model, opt, {k: v for k, v in state.items() if k != "step"})
    bad = dict(state)
    bad["param/wte.weight"] = torch.zeros(3, 3)
    with pytest.raises(StateError, match="wte"):
        load_training_state(model, opt, bad)
    with pytest.raises(StateError, match="step"):
        load_training_state(model, opt, {**state, "step": torch.tensor(float("nan"))})
    configure_determinism(1)
    fp = env_fingerprint(1)
    assert fp.threads == 1 and fp.torch_version == torch.__version__
    assert json.loads(fp.model_dump_json())["deterministic"] is True


def test_inner_lr_warms_up_then_follows_a_cosine_to_its_floor() -> None:
    from protocol.config import InnerOptim

    inner = InnerOptim(lr=1.0, warmup_steps=10, decay_steps=110, min_lr_fraction=0.1)
    assert [lr_at(inner, t) for t in (0, 9)] == [pytest.approx(0.1), 1.0]
    assert lr_at(inner, 60) == pytest.approx(0.55) and lr_at(inner, 110) == lr_at(inner, 10_000) == 0.1
    assert lr_at(inner.model_copy(update={"decay_steps": 0}), 10_000) == 1.0  # constant after warm-up
