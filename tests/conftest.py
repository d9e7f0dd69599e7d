"""Suite-wide fixtures."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch

import replay.device


@contextlib.contextmanager
def _torch_globals() -> Iterator[None]:
    """Nodes and replays pin torch's thread count, deterministic mode, cuDNN flags, replay device
    and attention backend process-wide (`replay.device.configure_determinism`, `pin_numerics`);
    give them back."""
    threads, det = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    cudnn = torch.backends.cudnn
    cudnn_det, cudnn_bench, dev = cudnn.deterministic, cudnn.benchmark, replay.device._replay_device
    cuda = torch.backends.cuda
    sdp = [(cuda.enable_math_sdp, cuda.math_sdp_enabled()), (cuda.enable_flash_sdp, cuda.flash_sdp_enabled()),
           (cuda.enable_mem_efficient_sdp, cuda.mem_efficient_sdp_enabled()),
           (cuda.enable_cudnn_sdp, cuda.cudnn_sdp_enabled())]  # fmt: skip
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(det)
        cudnn.deterministic, cudnn.benchmark, replay.device._replay_device = cudnn_det, cudnn_bench, dev
        for enable, was in sdp:
            enable(was)


@pytest.fixture(autouse=True, scope="module")
def _restore_torch_globals_module() -> Iterator[None]:
    """Around a module: its module-scoped fixtures (set up before any test's) pin them too."""
    with _torch_globals():
        yield


@pytest.fixture(autouse=True)
def _restore_torch_globals() -> Iterator[None]:
    """Around each test."""
    with _torch_globals():
        yield
