"""What every node stands on, host and verifier alike: who it is (name, wallet, address), the chain
and its typed view, its own folder, its status board and log lines, its blob client and server,
and its worker threads. A node is its protocol script over this; nothing here knows a phase.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from chain.client import ChainClient
from nodekit.board import Board
from nodekit.chainview import ChainView
from nodekit.fetch import BlobClient
from nodekit.objects import TransferPolicy
from nodekit.serve import ServerThread
from nodekit.store import sweep_temps

Log = Callable[[dict[str, Any]], None]


class NodeRuntime:
    """One node's plumbing. `server` is bound by the node (each keeps its port its own way) and
    started by `start()`; `close()` stops it and the blob client."""

    def __init__(
        self,
        *,
        role: str,
        data_dir: Path,
        chain: ChainClient,
        wallet: Any,
        run_id: int,
        public_url: str,
        log: Log,
        poll_timeout: float,
        policy: TransferPolicy,
        blob_timeout: float,
        blob_retries: int,
        blob_backoff: float,
        **status: Any,
    ) -> None:
        self.role, self.chain, self.wallet, self.run_id = role, chain, wallet, run_id
        self.address = str(wallet.address())
        self.dir = data_dir
        self.name = data_dir.name or role
        self.public_url = public_url
        self.sink = log
        self.view = ChainView(chain, run_id, poll_timeout=poll_timeout)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.board = Board(
            node=self.name, role=role, address=self.address, run_id=run_id, outer_step=None,
            phase="STARTING", **status,
        )  # fmt: skip
        self.on_set: Callable[[dict[str, Any]], None] | None = None
        """Called with every `set`'s fields (a node's Prometheus phase and step gauges)."""
        self.on_bytes: Callable[[int], None] = lambda n: None
        """Called with every fetched byte count (the node's metrics, made from `board.registry`)."""
        self.blobs = BlobClient(
            [], blob_timeout, blob_retries, backoff=blob_backoff, on_bytes=lambda n: self.on_bytes(n),
            policy=policy,
        )  # fmt: skip
        self.server: ServerThread | None = None

    # ---------------------------------------------------------------- logs and status

    def log(self, event: str, **fields: Any) -> None:
        self.sink({"ts": round(time.time(), 3), "node": self.name, "event": event, **fields})

    def emit(self, line: dict[str, Any]) -> None:
        """A line as it is (the `listening` line the CLI and the devnet wait for)."""
        self.sink(line)

    def set(self, **fields: Any) -> None:
        self.board.set(**fields)
        if self.on_set is not None:
            self.on_set(fields)

    def sweep(self, folder: Path) -> None:
        """Remove the temps a killed process left in `folder`, and say so."""
        self.swept(sweep_temps(folder))

    def swept(self, gone: list[Path]) -> None:
        """Log what a start-up sweep removed (temp and part files a killed process left)."""
        if gone:
            self.log("swept", removed=len(gone), files=[p.name for p in gone[:8]])

    # ---------------------------------------------------------------- chain, server, threads

    def broadcast(self, msgs: list[Any]) -> None:
        self.chain.broadcast(self.wallet, msgs)

    @property
    def url(self) -> str:
        """The endpoint this node puts on chain."""
        assert self.server is not None, "bind the server first"
        return self.public_url or self.server.url

    def start(self) -> None:
        assert self.server is not None, "bind the server first"
        self.server.start()
        self.emit({"event": "listening", "url": self.server.url, "node": self.name})

    def spawn(self, name: str, fn: Callable[[], None]) -> threading.Thread:
        """Start a worker thread of this node (one place, so a test harness can count it)."""
        thread = threading.Thread(target=fn, name=name, daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        self.view.stop.set()

    def close(self) -> None:
        self.view.stop.set()
        if self.server is not None:
            self.server.stop()
        self.blobs.close()
