"""What every node stands on, host and verifier alike: who it is (name, wallet, address), the chain
and its typed view, its own folder, its status board and log lines, its blob client and server,
and its worker threads. A node is its protocol script over this; nothing here knows a phase.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chain.client import ChainClient
from nodekit.board import Board, NodePhase
from nodekit.chainview import ChainView
from nodekit.config import NodeConfig
from nodekit.fetch import BlobClient
from nodekit.objects import TransferPolicy
from nodekit.serve import ServerThread
from nodekit.store import sweep_temps

Log = Callable[[dict[str, Any]], None]


@dataclass(frozen=True)
class Patience:
    """How long a node waits for the chain and for a peer's blob, and how often it asks again.
    Operators never set these (host.toml's `min_transfer_bps` scales blob deadlines); tests and the
    devnet shorten them."""

    poll_timeout: float = 10.0
    """Longest wait for the next block in one poll (`ChainView`)."""
    blob_timeout: float = 30.0
    """A transfer's fixed deadline part (`TransferPolicy.base_s`; the size-scaled part is added)."""
    blob_retries: int = 3
    blob_backoff: float = 0.5


class NodeRuntime:
    """One node's plumbing. `server` is bound by the node (each keeps its port its own way) and
    started by `start()`; `close()` stops it and the blob client."""

    def __init__(
        self,
        *,
        role: str,
        config: NodeConfig,
        chain: ChainClient,
        log: Log,
        patience: Patience,
        data_dir: Path | None = None,
        wallet: Any = None,
        **status: Any,
    ) -> None:
        """`data_dir` and `wallet` default to the config's (a host passes the ones it already made)."""
        self.role, self.chain, self.run_id = role, chain, config.run_id
        self.wallet = wallet if wallet is not None else config.wallet()
        self.address = str(self.wallet.address())
        self.dir = data_dir if data_dir is not None else config.data_path
        self.name = self.dir.name or role
        self.public_url = config.public_url
        self.sink = log
        self.view = ChainView(chain, config.run_id, poll_timeout=patience.poll_timeout)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.board = Board(
            node=self.name, role=role, address=self.address, run_id=config.run_id, outer_step=None,
            phase=NodePhase.STARTING, **status,
        )  # fmt: skip
        self.on_set: Callable[[dict[str, Any]], None] | None = None
        """Called with every `set`'s fields (a node's Prometheus phase and step gauges)."""
        self.on_bytes: Callable[[int], None] = lambda n: None
        """Called with every fetched byte count (the node's metrics, made from `board.registry`)."""
        policy = TransferPolicy(min_bytes_per_s=config.min_transfer_bps, base_s=patience.blob_timeout)
        self.blobs = BlobClient(
            [], patience.blob_timeout, patience.blob_retries, backoff=patience.blob_backoff,
            on_bytes=lambda n: self.on_bytes(n), policy=policy,
        )  # fmt: skip
        self.server: ServerThread | None = None
        self._sent: dict[str, int] = {}
        self._sent_lock = threading.Lock()
        self.board.extra = lambda: {"traffic": self.traffic()}

    # ---------------------------------------------------------------- traffic

    def sent(self, kind: str, n: int) -> None:
        """Object bytes this node's server sent (its `build_app(on_sent=...)`)."""
        with self._sent_lock:
            self._sent[kind] = self._sent.get(kind, 0) + n

    def traffic(self) -> dict[str, dict[str, int]]:
        """Object bytes up (served) and down (fetched) by kind since start: the devnet's bytes table."""
        with self._sent_lock:
            up = dict(self._sent)
        down = self.blobs.received_by_kind()
        return {"up": dict(sorted(up.items())), "down": dict(sorted(down.items()))}

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
