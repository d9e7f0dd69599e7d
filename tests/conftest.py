"""Suite-wide fixtures."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def _restore_torch_globals() -> Iterator[None]:
    """Nodes and replays pin torch's thread count and deterministic mode process-wide; give them back."""
    threads, det = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    yield
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(det)
