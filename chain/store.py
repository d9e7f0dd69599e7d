"""Durable chain storage: one SQLite database in WAL mode, one transaction per block.

A block, its txs with their results and the rows of the state that the block changed
(`chain.persist`) are written in a single transaction with `synchronous=FULL`, so after a
`kill -9` (or power loss) the database holds either the whole block or none of it. The node only
reports a tx as committed after that transaction returns, hence a reported tx is never lost.
What a block writes is proportional to what it changed: a finished outer step is written once,
an idle block rewrites the root row. Restart reads the rows back and checks the rebuilt state
against the last header's app hash; there is no replay. Both engines (the embedded node and the
CometBFT app) persist through this class.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chain.app import BlockResult, TxResult
from chain.persist import RowDelta, RowError, RowTracker, all_rows, build_state, path_key, subtree_range
from chain.state import ChainState, app_hash, state_from_json

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS blocks (
    height INTEGER PRIMARY KEY,
    hash TEXT NOT NULL,
    header TEXT NOT NULL,
    events TEXT NOT NULL,
    tx_hashes TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS txs (
    hash TEXT PRIMARY KEY,
    height INTEGER NOT NULL,
    idx INTEGER NOT NULL,
    raw BLOB NOT NULL,
    result TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS txs_by_height ON txs (height, idx);
CREATE TABLE IF NOT EXISTS state_rows (path TEXT PRIMARY KEY, body TEXT NOT NULL);
"""
# state_rows is an ordinary (rowid) table: WITHOUT ROWID keeps whole rows in the key's B-tree,
# where a contribution's ~1.5 kB row spills into overflow pages; measured at 1,000 hosts, that
# took about 3x the CPU per block. Databases made with WITHOUT ROWID keep it: the SQL is the same.
UPSERT_ROW = "INSERT INTO state_rows VALUES (?, ?) ON CONFLICT (path) DO UPDATE SET body = excluded.body"
LEGACY_STATE = "state"
"""The table of earlier versions: one whole-state JSON snapshot, rewritten every block."""


@dataclass
class CommitStats:
    """What the last commit wrote (the benchmark and the node's log report it)."""

    rows: int = 0
    deleted: int = 0
    bytes: int = 0
    seconds: float = 0.0


class StoreError(RuntimeError):
    """The database on disk is inconsistent (e.g. the snapshot does not match the last header)."""


class Store:
    """Thread-safe (one connection behind a lock): the node's block loop writes, HTTP reads."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(SCHEMA)
        self._tracker: RowTracker | None = None  # None: the next commit rewrites every row
        self.last_commit = CommitStats()

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # ------------------------------------------------------------ writes

    def init_genesis(self, state: ChainState, genesis_json: str) -> None:
        """Record the genesis state as height 0 once; later starts reuse what is on disk."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.execute("INSERT OR IGNORE INTO meta VALUES ('genesis', ?)", (genesis_json,))
                empty = self._db.execute("SELECT 1 FROM state_rows LIMIT 1").fetchone() is None
                if empty and not self._has_legacy():
                    self._db.executemany("INSERT INTO state_rows VALUES (?, ?)", all_rows(state))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def commit_block(self, block: BlockResult, state: ChainState) -> CommitStats:
        """The block, its txs, results and the state rows it changed: all or nothing. Call after the
        block's app hash was computed (the header holds it): the rows are the texts that hash pass
        serialized, and a state that no longer matches the header is refused (StoreError)."""
        started = time.perf_counter()
        tx_rows = [
            (r.hash, block.height, r.index, raw, json.dumps(r.to_json()))
            for r, raw in zip(block.results, block.txs, strict=True)
        ]
        expected = block.header.get("app_hash")  # one more hash pass over the caches (nothing changed:
        # about an idle block's hashing) refreshes every cache the rows are read from, and checks them
        if expected is not None and app_hash(state).hex() != expected:
            raise StoreError(
                f"block {block.height}: the state is not the one its header's app hash commits to"
            )
        rewrite = self._tracker is None
        tracker = RowTracker() if rewrite else self._tracker
        assert tracker is not None
        delta = tracker.delta(state)  # a fresh tracker returns every row
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.execute(
                    "INSERT INTO blocks VALUES (?, ?, ?, ?, ?)",
                    (
                        block.height,
                        block.hash,
                        json.dumps(block.header),
                        json.dumps(block.events),
                        json.dumps([r.hash for r in block.results]),
                    ),
                )
                # A tx hash seen twice (a replay rejected in the block) keeps its first, real result.
                self._db.executemany("INSERT OR IGNORE INTO txs VALUES (?, ?, ?, ?, ?)", tx_rows)
                if rewrite:
                    self._db.execute("DELETE FROM state_rows")
                    self._db.execute(f"DROP TABLE IF EXISTS {LEGACY_STATE}")
                self._write_rows(delta)
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                self._tracker = None  # it believes rows were written: the next commit rewrites all
                raise
        self._tracker = tracker
        self.last_commit = CommitStats(
            rows=len(delta.upserts),
            deleted=len(delta.deletes),
            bytes=delta.bytes,
            seconds=time.perf_counter() - started,
        )
        return self.last_commit

    def _write_rows(self, delta: RowDelta) -> None:
        for path in delta.deletes:
            low, high = subtree_range(path)
            self._db.execute(
                "DELETE FROM state_rows WHERE path = ? OR (path >= ? AND path < ?)",
                (path_key(path), low, high),
            )
        self._db.executemany(UPSERT_ROW, delta.upserts)

    @staticmethod
    def _fresh_tracker(state: ChainState) -> RowTracker:
        tracker = RowTracker()
        tracker.prime(state)
        return tracker

    def _has_legacy(self) -> bool:
        return (
            self._db.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (LEGACY_STATE,)
            ).fetchone()
            is not None
        )

    # ------------------------------------------------------------ reads

    def genesis_json(self) -> str | None:
        with self._lock:
            row = self._db.execute("SELECT value FROM meta WHERE key = 'genesis'").fetchone()
        return row[0] if row else None

    def load_state(self) -> tuple[ChainState, dict[str, Any] | None, str | None]:
        """The latest state, the header and hash of the block that produced it (None at genesis);
        checks that the rebuilt state hashes to the header's app hash."""
        with self._lock:
            rows = self._db.execute("SELECT path, body FROM state_rows").fetchall()
            legacy = None
            if not rows and self._has_legacy():
                legacy = self._db.execute(f"SELECT json FROM {LEGACY_STATE} WHERE id = 1").fetchone()
            block = self._db.execute(
                "SELECT header, hash FROM blocks ORDER BY height DESC LIMIT 1"
            ).fetchone()
        if legacy is not None:
            state = state_from_json(legacy[0])
        elif rows:
            try:  # the texts are adopted only when the header's app hash will check them
                state = build_state(rows, adopt_texts=block is not None)
            except (RowError, ValueError, KeyError, TypeError) as exc:
                raise StoreError(f"{self.path}: state rows are corrupt: {exc}") from None
        else:
            raise StoreError(f"{self.path}: no state; the store was never initialised")
        if block is None:
            if state.height != 0:
                raise StoreError(f"{self.path}: state at height {state.height} but no blocks")
            self._tracker = self._fresh_tracker(state) if legacy is None else None
            return state, None, None
        header = json.loads(block[0])
        if header["height"] != state.height or app_hash(state).hex() != header["app_hash"]:
            raise StoreError(f"{self.path}: state does not match block {header['height']}")
        # Primed after the app hash: its digest caches let the walk skip sealed history.
        self._tracker = self._fresh_tracker(state) if legacy is None else None
        return state, header, block[1]

    def latest_height(self) -> int:
        with self._lock:
            row = self._db.execute("SELECT MAX(height) FROM blocks").fetchone()
        return row[0] or 0

    def block(self, height: int) -> dict[str, Any] | None:
        """A block as the node serves it: header, hash, events and its txs with results and bytes."""
        with self._lock:
            row = self._db.execute(
                "SELECT hash, header, events FROM blocks WHERE height = ?", (height,)
            ).fetchone()
            if row is None:
                return None
            txs = self._db.execute(
                "SELECT raw, result FROM txs WHERE height = ? ORDER BY idx", (height,)
            ).fetchall()
        return {
            "hash": row[0],
            "header": json.loads(row[1]),
            "events": json.loads(row[2]),
            "txs": [bytes(raw) for raw, _ in txs],
            "results": [json.loads(res) for _, res in txs],
        }

    def tx(self, hash_hex: str) -> tuple[bytes, TxResult, dict[str, Any]] | None:
        """A committed tx: its bytes, its result and the header of its block."""
        with self._lock:
            row = self._db.execute(
                "SELECT t.raw, t.result, b.header FROM txs t JOIN blocks b ON b.height = t.height "
                "WHERE t.hash = ?",
                (hash_hex.upper(),),
            ).fetchone()
        if row is None:
            return None
        return bytes(row[0]), TxResult(**json.loads(row[1])), json.loads(row[2])
