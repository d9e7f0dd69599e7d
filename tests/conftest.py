"""Suite-wide fixtures."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def _restore_torch_globals() -> Iterator[None]:
    """Nodes and replays pin torch's thread count, deterministic mode and attention backend
    process-wide; give them back."""
    threads, det = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    cuda = torch.backends.cuda
    sdp = [(cuda.enable_math_sdp, cuda.math_sdp_enabled()), (cuda.enable_flash_sdp, cuda.flash_sdp_enabled()),
           (cuda.enable_mem_efficient_sdp, cuda.mem_efficient_sdp_enabled()),
           (cuda.enable_cudnn_sdp, cuda.cudnn_sdp_enabled())]  # fmt: skip
    yield
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(det)
    for enable, was in sdp:
        enable(was)
