"""An in-process chain with the `ChainClient` API: the same `App`, real signatures, no HTTP.

Block production is in the test's hands: `produce_block()` / `advance(n)`. With `auto=True`
(the default) the chain also produces blocks on demand, when a caller waits for a tx or a block
that does not exist yet, so single-threaded host/verifier tests never deadlock; time is simulated
(genesis time + height × block interval), so runs are deterministic.
"""

from __future__ import annotations

import threading
from typing import Any

from chain.app import App, BlockResult, TxRejected, tx_hash
from chain.client import Block, ChainClient, ChainTimeout, TxResult
from chain.genesis import Genesis, genesis_state
from chain.node import QUERIES, dev_genesis


class InProcessChain(ChainClient):
    """A chain and its client in one object; thread-safe (one lock around the app)."""

    def __init__(
        self,
        genesis: Genesis | None = None,
        *,
        auto: bool = True,
        block_interval: float = 1.0,
        min_gas_price: float = 1.0,
    ):
        super().__init__()
        self.genesis = genesis or dev_genesis()
        self.chain_id = self.genesis.chain_id
        self.gas_price = min_gas_price
        self.auto = auto
        self.block_interval_ns = int(block_interval * 1e9)
        start_ns = int(self.genesis.genesis_time * 1e9)
        self.app = App(
            genesis_state(self.genesis), min_gas_price=min_gas_price, last_time_ns=max(start_ns - 1, 0)
        )
        self._start_ns = start_ns
        self._cond = threading.Condition()
        self._mempool: dict[str, Any] = {}
        self._pending_seq: dict[str, int] = {}
        self.blocks: list[Block] = []
        self._results: dict[str, TxResult] = {}

    @property
    def state(self) -> Any:
        return self.app.state

    # ---- test control

    def produce_block(self) -> Block:
        """Deliver everything in the mempool as the next block."""
        with self._cond:
            height = self.app.height + 1
            raws = [tx.raw for tx in self._mempool.values()]
            result: BlockResult = self.app.deliver_block(
                raws, self._start_ns + (height - 1) * self.block_interval_ns
            )
            self._mempool.clear()
            self._pending_seq.clear()
            block = Block.from_json(
                {
                    "hash": result.hash,
                    "header": result.header,
                    "events": result.events,
                    "results": [r.to_json() for r in result.results],
                }
            )
            self.blocks.append(block)
            for tx in block.txs:
                self._results.setdefault(tx.hash, tx)
            self._cond.notify_all()
            return block

    def advance(self, n: int = 1) -> Block:
        """Produce `n` blocks; returns the last."""
        if n < 1:
            raise ValueError("advance needs n >= 1")
        for _ in range(n):
            block = self.produce_block()
        return block

    # ---- ChainClient transport

    def _account(self, address: str) -> tuple[int, int]:
        with self._cond:
            acc = self.app.state.accounts.get(address)
            return (acc.number, acc.sequence) if acc else (0, 0)

    def _submit(self, tx_bytes: bytes) -> tuple[str, int, str, str]:
        with self._cond:
            try:
                tx = self.app.check_tx(tx_bytes, self._pending_seq)
            except TxRejected as exc:
                return tx_hash(tx_bytes), exc.code, exc.codespace, exc.log
            self._mempool[tx.hash] = tx
            self._pending_seq[tx.signer] = tx.sequence + 1
            return tx.hash, 0, "", ""

    def submit_raw(self, tx_bytes: bytes) -> tuple[str, int, str, str]:
        """Broadcast bytes as they are (for tests of bad txs): (hash, code, codespace, log)."""
        return self._submit(tx_bytes)

    def _wait(self, ready: Any, timeout: float, what: str) -> Any:
        with self._cond:
            while (value := ready()) is None:
                if self.auto:
                    self.produce_block()
                    continue
                if not self._cond.wait(timeout):
                    raise ChainTimeout(f"{what} within {timeout}s (no block produced; auto=False)")
            return value

    def wait_for_tx(self, tx_hash: str, timeout: float = 30.0) -> TxResult:
        def ready() -> TxResult | None:
            if tx_hash not in self._results and tx_hash not in self._mempool and self.auto:
                raise ChainTimeout(f"tx {tx_hash} is neither committed nor pending")
            return self._results.get(tx_hash)

        return self._wait(ready, timeout, f"tx {tx_hash} not committed")

    def height(self) -> int:
        with self._cond:
            return self.app.height

    def wait_for_block(self, after_height: int, timeout: float = 30.0) -> Block:
        return self._wait(
            lambda: self.blocks[after_height] if len(self.blocks) > after_height else None,
            timeout,
            f"no block after {after_height}",
        )

    def block(self, height: int) -> Block:
        return self.blocks[height - 1]

    def query(self, name: str, **params: Any) -> Any:
        fn = QUERIES.get(name)
        if fn is None:
            raise KeyError(f"unknown query {name!r}; known: {sorted(QUERIES)}")
        with self._cond:
            return fn(self.app.state, **params)

    def balance(self, address: str) -> int:
        with self._cond:
            account = self.app.state.accounts.get(address)
            return account.balance if account else 0
