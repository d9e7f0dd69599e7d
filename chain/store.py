"""Durable chain storage: one SQLite database in WAL mode, one transaction per block.

A block, its txs with their results and the full state snapshot after it are written in a single
transaction with `synchronous=FULL`, so after a `kill -9` (or power loss) the database holds
either the whole block or none of it. The node only reports a tx as committed after that
transaction returns, hence a reported tx is never lost. Only the latest state snapshot is kept:
the state is small and a snapshot per block makes restart O(1) with no replay.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path
from typing import Any

from chain.app import BlockResult, TxResult
from chain.state import ChainState, app_hash, state_from_json, state_to_json

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
CREATE TABLE IF NOT EXISTS state (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    height INTEGER NOT NULL,
    json TEXT NOT NULL
);
"""


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
                self._db.execute("INSERT OR IGNORE INTO state VALUES (1, 0, ?)", (state_to_json(state),))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def commit_block(self, block: BlockResult, state: ChainState) -> None:
        """The block, its txs, results and the state after it: all or nothing."""
        tx_rows = [
            (r.hash, block.height, r.index, raw, json.dumps(r.to_json()))
            for r, raw in zip(block.results, block.txs, strict=True)
        ]
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
                self._db.execute(
                    "UPDATE state SET height = ?, json = ? WHERE id = 1", (block.height, state_to_json(state))
                )
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    # ------------------------------------------------------------ reads

    def genesis_json(self) -> str | None:
        with self._lock:
            row = self._db.execute("SELECT value FROM meta WHERE key = 'genesis'").fetchone()
        return row[0] if row else None

    def load_state(self) -> tuple[ChainState, dict[str, Any] | None, str | None]:
        """The latest state, the header and hash of the block that produced it (None at genesis);
        checks that the snapshot hashes to the header's app hash."""
        with self._lock:
            row = self._db.execute("SELECT height, json FROM state WHERE id = 1").fetchone()
            if row is None:
                raise StoreError(f"{self.path}: no state; the store was never initialised")
            block = self._db.execute(
                "SELECT header, hash FROM blocks ORDER BY height DESC LIMIT 1"
            ).fetchone()
        height, text = row
        state = state_from_json(text)
        if block is None:
            if height != 0:
                raise StoreError(f"{self.path}: state at height {height} but no blocks")
            return state, None, None
        header = json.loads(block[0])
        if header["height"] != height or app_hash(state).hex() != header["app_hash"]:
            raise StoreError(f"{self.path}: state snapshot does not match block {header['height']}")
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
