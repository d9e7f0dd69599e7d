"""Process supervision for the devnet: every node in its own process group, always stopped.

Each node runs in a new session (its own process group), so stopping it also stops anything it
spawned (torchrun ranks, uvicorn workers). A reader thread drains the node's stdout into its log
file, so a chatty node never blocks on a full pipe, and turns the JSON `listening` line into an
event the orchestrator can wait on instead of sleeping. `Supervisor` stops everything it started
on normal exit, on an exception, on Ctrl-C / SIGTERM, and at interpreter exit.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import IO, Any

EventSink = Callable[[str, dict[str, Any]], None]
"""Called (node name, parsed JSON line) for every JSON object a node prints."""

MAX_LINE = 64 * 1024
"""Longer stdout lines are cut in the log: a runaway node must not eat the orchestrator's memory."""


class NodeStartError(RuntimeError):
    """A node exited or stayed silent before printing its `listening` line."""


class NodeProcess:
    """One supervised node: its command line, log file, and the URL it announced."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        *,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        on_event: EventSink | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.env = env
        self.cwd = cwd
        self.on_event = on_event
        self.url: str | None = None
        self.expected_exit = False
        self.proc: subprocess.Popen[str] | None = None
        self._listening = threading.Event()
        self._reader: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """(Re)start the process; a restart appends to the same log file."""
        if self.alive:
            raise RuntimeError(f"{self.name} is already running")
        self.url = None
        self.expected_exit = False
        self._listening = threading.Event()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **(self.env or {})}
        self.proc = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            bufsize=1,
            env=env,
            cwd=self.cwd,
            start_new_session=True,
        )
        assert self.proc.stdout is not None
        self._reader = threading.Thread(
            target=self._drain, args=(self.proc.stdout, self._listening), name=f"log-{self.name}", daemon=True
        )
        self._reader.start()

    def _drain(self, stream: IO[str], listening: threading.Event) -> None:
        with self.log_path.open("a", encoding="utf-8") as log:
            for raw in stream:
                line = raw[:MAX_LINE].rstrip("\n")
                log.write(line + "\n")
                log.flush()
                event = _parse_json(line)
                if event is None:
                    continue
                if event.get("event") == "listening" and isinstance(event.get("url"), str):
                    self.url = event["url"]
                    listening.set()
                if self.on_event is not None:
                    with contextlib.suppress(Exception):  # a broken view must not stop the log
                        self.on_event(self.name, event)
        listening.set()  # EOF: wake anybody waiting, they will see the process is gone

    def wait_listening(self, timeout: float) -> str:
        """Block until the node announced its URL; a clear error if it died or stayed silent."""
        if self._listening.wait(timeout) and self.url is not None:
            return self.url
        code = None
        if self.proc is not None:
            try:  # stdout closed: the exit status follows at once
                code = self.proc.wait(timeout=5) if self._listening.is_set() else self.proc.poll()
            except subprocess.TimeoutExpired:
                code = None
        why = f"exited with code {code}" if code is not None else f"was silent for {timeout:.0f}s"
        raise NodeStartError(f"{self.name} {why}; see {self.log_path}")

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def signal_group(self, sig: signal.Signals) -> None:
        """Signal the whole process group (the node and everything it spawned)."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)

    def kill(self) -> None:
        """SIGKILL the group now (fault injection); reaps the child."""
        self.expected_exit = True
        self.signal_group(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait()
        self._join_reader()

    def stop(self, grace: float = 5.0) -> None:
        """SIGTERM, then SIGKILL after `grace` seconds."""
        self.expected_exit = True
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.signal_group(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.signal_group(signal.SIGKILL)
                self.proc.wait()
        # Stragglers that left the group leader behind (or ignored SIGTERM) go too.
        self.signal_group(signal.SIGKILL)
        self._join_reader()

    def _join_reader(self) -> None:
        if self._reader is not None:
            self._reader.join(timeout=5)


def _parse_json(line: str) -> dict[str, Any] | None:
    if not line.startswith("{"):
        return None
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


class Supervisor:
    """Owns every node process; `close()` stops them all, whatever way the program ends."""

    def __init__(self, grace: float = 5.0) -> None:
        self.grace = grace
        self.nodes: dict[str, NodeProcess] = {}
        self._closed = False
        self._old_handlers: dict[int, Any] = {}

    def add(self, node: NodeProcess) -> NodeProcess:
        if node.name in self.nodes:
            raise ValueError(f"duplicate node name {node.name!r}")
        self.nodes[node.name] = node
        return node

    def crashed(self) -> list[NodeProcess]:
        """Nodes that exited with an error although nobody stopped them (exit 0 is a clean finish:
        a node leaves once its run is over)."""
        return [
            n
            for n in self.nodes.values()
            if n.proc is not None and not n.alive and not n.expected_exit and n.returncode != 0
        ]

    def close(self) -> None:
        """Terminate all groups at once, then wait (one shared grace period) and kill what is left."""
        if self._closed:
            return
        self._closed = True
        for node in self.nodes.values():
            node.expected_exit = True
            if node.alive:
                node.signal_group(signal.SIGTERM)
        deadline = time.monotonic() + self.grace
        for node in self.nodes.values():
            node.stop(max(0.0, deadline - time.monotonic()))
        self._restore_handlers()

    # ------------------------------------------------------------------ signals

    def install_handlers(self) -> None:
        """Ctrl-C / SIGTERM stop every node before the program exits; atexit as the last net."""
        atexit.register(self.close)
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old_handlers[sig] = signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        """Ctrl-C unwinds the program (so it can still report; `with` and atexit stop the nodes);
        SIGTERM stops every node first, then exits."""
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.close()
        raise SystemExit(128 + signum)

    def _restore_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig, handler in self._old_handlers.items():
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(sig, handler)
        self._old_handlers.clear()

    def __enter__(self) -> Supervisor:
        self.install_handlers()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def python_cli(*args: str) -> list[str]:
    """The `gonka-diloco` command run with this interpreter (no reliance on PATH)."""
    return [sys.executable, "-m", "gonka_diloco.cli", *args]
