"""Process helpers for the tests that spawn process trees (devnet supervision, DDP ranks): wait
for a process the test did not spawn to end."""

from __future__ import annotations

import os
import select
from pathlib import Path


def gone(pid: int, timeout: float = 10.0) -> bool:
    """Wait for a process we did not spawn to end: a pidfd becomes readable when it exits."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        readable, _, _ = select.select([fd], [], [], timeout)
        return bool(readable) or _zombie(pid)
    finally:
        os.close(fd)


def _zombie(pid: int) -> bool:
    try:
        return "\nState:\tZ" in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
