"""The device plumbing of the replayable step, on CPU: settings, fingerprints and replay classes,
host snapshots, and bf16 autocast replaying bit for bit in another process.

The CUDA paths of the same functions run in `bench/gpu_check.py` on a GPU machine.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from protocol.config import Numerics, Precision
from protocol.envclass import ReplayDecision, class_pair, replay_class, replay_decision
from protocol.messages import EnvFingerprint, MsgCommitPseudoGradient
from protocol.wire import WireError, from_any, to_any
from replay.device import (
    CUBLAS_WORKSPACE,
    DeviceError,
    env_facts,
    forward_context,
    host_view,
    pin_numerics,
    resolve_device,
)
from replay.step import (
    TrainJob,
    configure_determinism,
    env_fingerprint,
    load_training_state,
    snapshot_to_host,
    train_segment,
    training_hash,
    training_state,
)
from tests.support.replay import HOST, ROOT, fresh, tiny_cfg, tiny_corpus
from trainer.node_config import HostConfig

BF16 = Numerics(precision=Precision.BF16)


def test_device_setting_resolves_or_fails_clearly() -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    for bad in ("tpu", "cuda:x", ""):
        with pytest.raises(DeviceError):
            resolve_device(bad)
    if not torch.cuda.is_available():
        with pytest.raises(DeviceError, match="CUDA is not available"):
            resolve_device("cuda")
    base = {"chain_url": "http://x", "run_id": 1, "data_dir": "d", "key": {"test_index": 0}}
    assert HostConfig.model_validate(base).device == "cpu"  # the default: CPU stays fully supported
    assert HostConfig.model_validate({**base, "device": "cuda:3"}).device == "cuda:3"
    with pytest.raises(ValueError, match="device"):
        HostConfig.model_validate({**base, "device": "gpu"})


def test_determinism_is_pinned_in_one_place_and_reported() -> None:
    device = configure_determinism(1, "cpu")
    assert device == torch.device("cpu") and torch.get_num_threads() == 1
    assert torch.are_deterministic_algorithms_enabled() and torch.backends.cudnn.deterministic
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == CUBLAS_WORKSPACE  # set before any CUDA start
    pin_numerics(False, "flash")
    cuda = torch.backends.cuda
    assert cuda.flash_sdp_enabled() and not cuda.math_sdp_enabled() and not cuda.mem_efficient_sdp_enabled()
    pin_numerics(False, "math")
    assert cuda.math_sdp_enabled() and not cuda.flash_sdp_enabled()
    with pytest.raises(DeviceError):
        pin_numerics(False, "fastest")
    with pytest.raises(DeviceError):
        forward_context("fp8", device)
    fp = env_fingerprint(1)
    assert fp.device == "cpu" and fp.cpu_capability == torch.backends.cpu.get_cpu_capability()
    assert fp.torch_git == torch.version.git_version and fp.gpu_name == "" and fp.sm_count == 0
    assert fp.replay_class == replay_class(env_facts("cpu"))  # the class of exactly these facts


def test_snapshots_hold_the_state_as_of_the_call() -> None:
    cfg = tiny_cfg()
    model, opt = fresh(cfg)
    live = training_state(model, opt)
    snap = snapshot_to_host(live, opt)
    copy = training_state(model, opt, copy=True)
    before = training_hash(copy)
    train_segment(TrainJob(cfg, tiny_corpus(), HOST, 0), model, opt, 0, 1)
    assert training_hash(snap) == before != training_hash(training_state(model, opt))  # not aliased
    assert sorted(snap) == sorted(live) and len(snap) == len(live)
    assert all(v.device.type == "cpu" for v in copy.values())
    view = host_view(live)
    assert all(view[k] is live[k] for k in live)  # already in host memory: no copy on the verifier


def test_bf16_autocast_keeps_float32_master_state_and_replays_bitwise_in_another_process(
    tmp_path: Path,
) -> None:
    configure_determinism(1)
    data = tiny_corpus()
    cfg16, cfg32 = tiny_cfg(numerics=BF16), tiny_cfg()
    model, opt = fresh(cfg16)
    train_segment(TrainJob(cfg16, data, HOST, 3), model, opt, 0, 2)
    start = training_state(model, opt, copy=True)
    save_file(start, str(tmp_path / "start.safetensors"))
    train_segment(TrainJob(cfg16, data, HOST, 3, micro_batches=2), model, opt, 2, 3)
    end = training_state(model, opt, copy=True)
    # parameters, the step and the moments' scales hashed and stored as float32 (the default int8
    # moments' codes are int8/uint8, specs §6.2.1)
    assert all(v.dtype == torch.float32 for k, v in end.items() if "_code/" not in k)
    assert any("_code/" in k for k in end)

    m32, o32 = fresh(cfg32)
    load_training_state(m32, o32, start)
    train_segment(TrainJob(cfg32, data, HOST, 3, micro_batches=2), m32, o32, 2, 3)
    assert training_hash(training_state(m32, o32)) != training_hash(end)  # autocast really ran

    code = f"""
import sys
sys.path.insert(0, {str(ROOT)!r})
from safetensors.torch import load_file
from protocol.config import Numerics
from tests.support.replay import HOST, fresh, tiny_cfg, tiny_corpus
from replay.step import TrainJob, configure_determinism, load_training_state, train_segment
from replay.step import training_hash, training_state
configure_determinism(1)
cfg = tiny_cfg(numerics=Numerics(precision="bf16"))
model, opt = fresh(cfg)
load_training_state(model, opt, load_file({str(tmp_path / "start.safetensors")!r}))
train_segment(TrainJob(cfg, tiny_corpus(), HOST, 3, micro_batches=2), model, opt, 2, 3)
print(training_hash(training_state(model, opt)))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == training_hash(end)


H200 = dict(torch_version="2.13.0+cu130", threads=1, device="cuda", gpu_name="NVIDIA H200",
            compute_capability="9.0", sm_count=132, cuda_version="13.0", cudnn_version="92000")  # fmt: skip


def test_replay_classes_decide_abstain_bitwise_or_tolerance() -> None:
    cpu = env_fingerprint(1)
    cpu2 = env_fingerprint(2)
    gpu = EnvFingerprint(**H200)
    assert cpu.replay_class != cpu2.replay_class  # CPU reductions depend on the thread count
    assert EnvFingerprint(**{**H200, "threads": 8, "nccl_version": "2.27"}).replay_class == gpu.replay_class
    assert EnvFingerprint(**{**H200, "sm_count": 114}).replay_class != gpu.replay_class
    assert replay_decision("bitwise", cpu, cpu) is ReplayDecision.BITWISE
    assert replay_decision("bitwise", gpu, cpu) is ReplayDecision.ABSTAIN
    assert replay_decision("tolerance", gpu, cpu) is ReplayDecision.TOLERANCE
    calibrated = [class_pair(gpu.replay_class, cpu.replay_class)]
    assert replay_decision("tolerance", gpu, cpu, calibrated) is ReplayDecision.TOLERANCE
    assert replay_decision("tolerance", gpu, cpu2, calibrated) is ReplayDecision.ABSTAIN  # never measured

    # the class is derived: a fingerprint cannot name another class than its fields', on the wire either
    with pytest.raises(ValueError, match="replay_class"):
        EnvFingerprint(**{**H200, "replay_class": cpu.replay_class})
    msg = MsgCommitPseudoGradient(
        creator=HOST, run_id=1, outer_step=0, base_model_hash="a" * 64, trajectory_root="b" * 64,
        leaf_count=3, delta_hash="c" * 64, final_optimizer_hash="d" * 64, codec="int8", tokens=1, env=gpu,
    )  # fmt: skip
    assert from_any(to_any(msg)) == msg
    forged = to_any(msg)
    forged.value = forged.value.replace(gpu.replay_class.encode(), cpu.replay_class.encode())
    with pytest.raises(WireError, match="replay_class"):
        from_any(forged)
