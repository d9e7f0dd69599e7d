"""Process helpers for the tests that spawn process trees (devnet supervision, DDP ranks, real
validators): wait for a process the test did not spawn to end (`gone`), list the processes a run
left behind (`leftover_processes`), load the machine (`cpu_burners`), and `QUICK`, the CI-sized
devnet those runs start."""

from __future__ import annotations

import os
import select
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gonka_diloco.devnet_config import TINY_DEVNET

QUICK = {
    **TINY_DEVNET,
    "hosts": 3,
    "verifiers": 2,
    "adversaries": [{"behaviour": "noise"}],
    "outer_steps": 3,
    "timeout": 150.0,
}
"""A devnet small enough for CI: a 1-layer GPT, H=10, 0.2 s blocks, three outer steps; shared so the
devnet, fault and CometBFT tests vary one config rather than each keeping a copy."""


@contextmanager
def cpu_burners(n: int = 2) -> Iterator[None]:
    """`n` processes spinning on a core while the block runs, always stopped: races that an idle
    machine hides (the thread that happens to win) show under load."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


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


def leftover_processes(marker: str) -> list[str]:
    """Processes whose command line mentions `marker` (every node's argv holds its run folder):
    shared so every real-process test checks that its run left nothing behind the same way."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in argv and str(os.getpid()) != cmdline.parent.name:
            found.append(f"{cmdline.parent.name}: {argv[:200]}")
    return found
