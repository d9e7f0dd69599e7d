"""The chain client that hosts and verifiers use: sign, broadcast, wait, query, follow blocks.

`ChainClient` is the interface; `HttpChainClient` talks to a node over HTTP (cosmpy's
`LedgerClient` for accounts and broadcast, the node's long-poll routes for inclusion and blocks)
and `chain.inprocess.InProcessChain` runs the same `App` in memory for fast tests. Txs are
standard Cosmos SDK txs built with cosmpy's `Transaction`, so the same code could sign for any
Cosmos chain carrying the module.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
from cosmpy.aerial.client import LedgerClient
from cosmpy.aerial.config import NetworkConfig
from cosmpy.aerial.tx import SigningCfg, Transaction, TxFee
from cosmpy.aerial.wallet import LocalWallet
from cosmpy.protos.cosmos.tx.v1beta1.service_pb2 import BroadcastMode, BroadcastTxRequest

from chain.app import Limits
from chain.params import DENOM
from protocol.messages import AnyMsg
from protocol.wire import to_proto

CHAIN_ID = "gonka-devnet"
DEFAULT_GAS_PRICE = 1.0
"""ngonka per unit of gas; the devnet node's default minimum."""
GAS_ADJUSTMENT = 1.3
ERR_WRONG_SEQUENCE = 32
ERR_TX_IN_CACHE = 19
ERR_MEMPOOL_FULL = 20
RESUBMIT_SECONDS = 1.0
"""A broadcast tx not in a block after this long is broadcast again (a restarted node's mempool is
empty). Short: after a chain node's restart its blocks resume at once, and every second before the
resubmission is a second of the tx's phase lost (5 s of 0.2 s blocks outlasted a devnet's train
phase: the host's commit missed its deadline). A copy still pending is refused as already cached."""


class ChainClientError(RuntimeError):
    """The node could not be reached or answered something unusable."""


class TxFailed(ChainClientError):
    """The chain refused a tx (at broadcast or in its block): code, codespace and log say why."""

    def __init__(self, tx_hash: str, code: int, codespace: str, log: str, height: int = 0):
        super().__init__(f"tx {tx_hash} failed [{codespace}:{code}] {log}")
        self.tx_hash, self.code, self.codespace, self.log, self.height = tx_hash, code, codespace, log, height


class ChainTimeout(ChainClientError):
    """A block or a tx did not appear before the timeout."""


class AccountNotFound(ChainClientError):
    """The signer's account does not exist on chain: nobody has sent it tokens yet. The message
    says how to fund it, in one line (cosmpy's own is a multi-line HTTP dump)."""

    def __init__(self, address: str, url: str = "") -> None:
        where = f" --chain-url {url}" if url else ""
        super().__init__(
            f"account {address} does not exist on the chain{' at ' + url if url else ''} (it was never "
            f"funded): send it tokens from a funded key with `gonka-diloco keys send FROM {address} "
            f"20GNK{where}`, or on a new local chain start it with `gonka-diloco chain start --fund "
            f"NAME:AMOUNT`"
        )
        self.address = address


def _is_missing_account(exc: Exception) -> bool:
    """cosmpy's error for a 404 from the auth account route (grpc code 5, NOT_FOUND)."""
    text = str(exc)
    return "Response: 404" in text and "not found" in text


@dataclass(frozen=True)
class Event:
    type: str
    attributes: dict[str, str]


@dataclass(frozen=True)
class TxResult:
    hash: str
    height: int
    code: int
    codespace: str
    log: str
    gas_wanted: int
    gas_used: int
    events: tuple[Event, ...] = ()

    @property
    def ok(self) -> bool:
        return self.code == 0

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TxResult:
        return cls(
            hash=data["hash"],
            height=int(data["height"]),
            code=int(data["code"]),
            codespace=data["codespace"],
            log=data["log"],
            gas_wanted=int(data["gas_wanted"]),
            gas_used=int(data["gas_used"]),
            events=_events(data.get("events", [])),
        )


@dataclass(frozen=True)
class Block:
    """A committed block with every tx result and the begin/end-block events."""

    height: int
    hash: str
    time: float
    app_hash: str
    prev_block_hash: str
    txs: tuple[TxResult, ...] = ()
    events: tuple[Event, ...] = ()
    header: dict[str, Any] = field(default_factory=dict, compare=False)

    def all_events(self) -> list[Event]:
        """Tx events in order, then block events (where the module's end-block outcomes are)."""
        return [e for tx in self.txs for e in tx.events] + list(self.events)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Block:
        header = data["header"]
        return cls(
            height=int(header["height"]),
            hash=data["hash"],
            time=int(header["time_ns"]) / 1e9,
            app_hash=header["app_hash"],
            prev_block_hash=header["prev_block_hash"],
            txs=tuple(TxResult.from_json(r) for r in data.get("results", [])),
            events=_events(data.get("events", [])),
            header=header,
        )


def _events(items: list[dict[str, Any]]) -> tuple[Event, ...]:
    return tuple(
        Event(type=str(e["type"]), attributes={str(k): str(v) for k, v in e["attributes"].items()})
        for e in items
    )


def sign_tx(
    wallet: LocalWallet,
    msgs: Sequence[AnyMsg],
    *,
    chain_id: str,
    account_number: int,
    sequence: int,
    gas_limit: int,
    fee: int,
    memo: str = "",
) -> bytes:
    """A signed SIGN_MODE_DIRECT TxRaw, built with cosmpy's `Transaction`."""
    tx = Transaction()
    for msg in msgs:
        tx.add_message(to_proto(msg))
    tx.seal(
        SigningCfg.direct(wallet.public_key(), sequence),
        fee=TxFee(amount=f"{fee}{DENOM}" if fee else [], gas_limit=gas_limit),
        memo=memo,
    )
    tx.sign(wallet.signer(), chain_id, account_number)
    tx.complete()
    return tx.tx.SerializeToString()


def estimate_gas(n_bytes: int, n_msgs: int, limits: Limits = Limits()) -> int:
    """The devnet's deterministic gas meter with headroom for the fee field: the figure the node's
    simulate would give, without the round trip."""
    used = limits.base_gas + limits.gas_per_byte * (n_bytes + 64) + limits.gas_per_msg * n_msgs
    return math.ceil(used * GAS_ADJUSTMENT)


class ChainClient(ABC):
    """What a host or verifier needs from the chain."""

    chain_id: str = CHAIN_ID
    gas_price: float = DEFAULT_GAS_PRICE

    def __init__(self) -> None:
        self._wallet_locks: dict[str, threading.Lock] = {}
        self._accounts: dict[str, tuple[int, int]] = {}  # address -> (number, next sequence)
        self._locks_guard = threading.Lock()

    # ---- what each transport provides

    @abstractmethod
    def _account(self, address: str) -> tuple[int, int]:
        """(account number, sequence) as committed."""

    @abstractmethod
    def _submit(self, tx_bytes: bytes) -> tuple[str, int, str, str]:
        """Broadcast (sync): (hash, code, codespace, log) of the mempool check."""

    @abstractmethod
    def wait_for_tx(self, tx_hash: str, timeout: float = 30.0) -> TxResult:
        """The result of a committed tx; raises `ChainTimeout`."""

    @abstractmethod
    def height(self) -> int: ...

    @abstractmethod
    def wait_for_block(self, after_height: int, timeout: float = 30.0) -> Block:
        """Block `after_height + 1` (with events), as soon as it is committed."""

    @abstractmethod
    def query(self, name: str, **params: Any) -> Any:
        """A module query by its `chain.queries` function name."""

    @abstractmethod
    def balance(self, address: str) -> int: ...

    # ---- shared logic

    def _lock_for(self, address: str) -> threading.Lock:
        with self._locks_guard:
            return self._wallet_locks.setdefault(address, threading.Lock())

    def broadcast(
        self,
        wallet: LocalWallet,
        msgs: Sequence[AnyMsg],
        *,
        wait: bool = True,
        timeout: float = 30.0,
        memo: str = "",
        attempts: int = 5,
    ) -> TxResult:
        """Sign and broadcast; on a sequence mismatch refetch the account and re-sign. With `wait`,
        return once the tx is in a block and raise `TxFailed` if it failed there."""
        address = str(wallet.address())
        with self._lock_for(address):
            for attempt in range(attempts):
                if address not in self._accounts:
                    self._accounts[address] = self._account(address)
                number, sequence = self._accounts[address]
                unsigned = sign_tx(
                    wallet,
                    msgs,
                    chain_id=self.chain_id,
                    account_number=number,
                    sequence=sequence,
                    gas_limit=1,
                    fee=0,
                    memo=memo,
                )
                gas = estimate_gas(len(unsigned), len(msgs))
                raw = sign_tx(
                    wallet,
                    msgs,
                    chain_id=self.chain_id,
                    account_number=number,
                    sequence=sequence,
                    gas_limit=gas,
                    fee=math.ceil(gas * self.gas_price),
                    memo=memo,
                )
                tx_hash, code, codespace, log = self._submit(raw)
                # Already in a mempool (a retry on another validator after a dropped answer): the
                # same bytes, so the same tx; it is admitted.
                if code == 0 or (code == ERR_TX_IN_CACHE and codespace == "sdk"):
                    self._accounts[address] = (number, sequence + 1)
                    break
                if code == ERR_WRONG_SEQUENCE and codespace == "sdk" and attempt + 1 < attempts:
                    self._accounts.pop(address, None)
                    continue
                if code == ERR_MEMPOOL_FULL and attempt + 1 < attempts:
                    time.sleep(0.05 * 2**attempt)
                    continue
                self._accounts.pop(address, None)
                raise TxFailed(tx_hash, code, codespace, log)
        if not wait:
            return TxResult(hash=tx_hash, height=0, code=0, codespace="", log="", gas_wanted=gas, gas_used=0)
        result = self._wait_resubmitting(raw, tx_hash, timeout)
        if not result.ok:
            with self._lock_for(address):
                self._accounts.pop(address, None)  # an ante failure in the block leaves the sequence
            raise TxFailed(result.hash, result.code, result.codespace, result.log, result.height)
        return result

    def _wait_resubmitting(self, raw: bytes, tx_hash: str, timeout: float) -> TxResult:
        """Wait for the tx; every `RESUBMIT_SECONDS` without it, broadcast the same signed bytes
        again: a node killed after admitting it lost its mempool on restart. The same bytes are the
        same tx (same hash, same sequence), so a copy still pending or already committed is refused
        by the ante and nothing runs twice."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ChainTimeout(f"tx {tx_hash} not committed within {timeout}s")
            try:
                return self.wait_for_tx(tx_hash, min(remaining, RESUBMIT_SECONDS))
            except ChainTimeout:
                pass
            except Exception as e:  # the node stayed down through the client's own retries:
                if not _is_transient(e):  # keep waiting until the timeout, resubmitting
                    raise
            with contextlib.suppress(RuntimeError, OSError):  # still down: resubmit at the next slice
                self._submit(raw)

    def follow(self, from_height: int, timeout: float = 30.0) -> Callable[[], Block]:
        """A cursor: each call returns the next block after `from_height`."""
        cursor = [from_height]

        def next_block() -> Block:
            block = self.wait_for_block(cursor[0], timeout)
            cursor[0] = block.height
            return block

        return next_block

    # ---- typed queries (thin wrappers over chain.queries by name)

    def params(self) -> dict[str, Any]:
        return self.query("params")

    def run(self, run_id: int) -> dict[str, Any]:
        return self.query("run", run_id=run_id)

    def outer_step(self, run_id: int, outer_step: int) -> dict[str, Any]:
        return self.query("outer_step", run_id=run_id, step=outer_step)

    def account(self, address: str) -> dict[str, Any]:
        return self.query("account", address=address)


class EndpointUnavailable(ChainClientError):
    """An endpoint answered 502/503/504: restarting, halted (a validator that stopped, or whose
    state diverged from the network's) or overloaded. Try another."""


def _is_transient(exc: Exception) -> bool:
    text = str(exc)
    return (
        isinstance(exc, (httpx.TransportError, ConnectionError, EndpointUnavailable))
        or "Response: 5" in text
        or "Connection" in type(exc).__name__
    )


T = TypeVar("T")


def retrying(fn: Callable[[], T], attempts: int = 8, base_delay: float = 0.1, max_delay: float = 2.0) -> T:
    """Retry transient transport failures (reset connections, 5xx) with capped exponential backoff.

    The defaults ride out ≈ 7 s of outage: a devnet node restarting after a crash takes 1–3 s
    on a loaded 2-core machine, and a node process must not die of it.
    """
    for attempt in range(attempts):
        try:
            return fn()
        except Exception as exc:
            if attempt + 1 == attempts or not _is_transient(exc):
                raise
            time.sleep(min(max_delay, base_delay * 2**attempt))
    raise AssertionError("unreachable")


def endpoints(url: str | Sequence[str]) -> list[str]:
    """One URL, a comma-separated list (what a node's `chain_url` setting may hold), or a list."""
    items = url.split(",") if isinstance(url, str) else list(url)
    urls = [u.strip().rstrip("/") for u in items if u.strip()]
    if not urls:
        raise ValueError("no chain endpoint given")
    return urls


class HttpChainClient(ChainClient):
    """Over HTTP to one node, or to several validators of one chain with failover between them.

    Each call goes to the active endpoint; a transport failure, a 5xx (a validator that is down,
    restarting or halted) or a long-poll on which that endpoint made no progress moves it to the
    next one, and only after every endpoint failed in a round does the client back off. All
    validators serve the same committed state, so callers never notice which one answered.
    Thread-safe (httpx.Client is, LedgerClients are per thread)."""

    ROUNDS = 8
    """Rounds over all endpoints before a transient failure is raised (≈ 7 s of backoff in all)."""

    def __init__(
        self,
        url: str | Sequence[str],
        *,
        chain_id: str = CHAIN_ID,
        gas_price: float = DEFAULT_GAS_PRICE,
        timeout: float = 10.0,
    ):
        super().__init__()
        self.urls = endpoints(url)
        self.chain_id = chain_id
        self.gas_price = gas_price
        self._https = [httpx.Client(base_url=u, timeout=timeout) for u in self.urls]
        # A long-poll must end before the HTTP timeout does, or every quiet wait is a ReadTimeout.
        self._poll = max(0.5, timeout - 2.0)
        self._local = threading.local()
        self._active = 0
        self._active_lock = threading.Lock()

    @property
    def url(self) -> str:
        """The endpoint calls go to now."""
        return self.urls[self._active]

    def close(self) -> None:
        for http in self._https:
            http.close()

    def _failover(self, failed: int) -> None:
        with self._active_lock:
            if self._active == failed:
                self._active = (failed + 1) % len(self.urls)

    def _call(self, fn: Callable[[int], T]) -> T:
        """`fn(endpoint index)` on the active endpoint, failing over on transient errors."""
        n = len(self.urls)
        attempts = self.ROUNDS * n
        for attempt in range(attempts):
            index = self._active
            try:
                return fn(index)
            except Exception as exc:
                if attempt + 1 == attempts or not _is_transient(exc):
                    raise
                self._failover(index)
                if (attempt + 1) % n == 0:  # every endpoint failed once more: back off
                    time.sleep(min(2.0, 0.1 * 2 ** ((attempt + 1) // n - 1)))
        raise AssertionError("unreachable")

    def _ledger(self, index: int) -> LedgerClient:
        """cosmpy's own client for one endpoint (one per thread: its requests session is not shared)."""
        ledgers = getattr(self._local, "ledgers", None)
        if ledgers is None:
            ledgers = self._local.ledgers = {}
        ledger = ledgers.get(index)
        if ledger is None:
            cfg = NetworkConfig(
                chain_id=self.chain_id,
                url=f"rest+{self.urls[index]}",
                fee_minimum_gas_price=self.gas_price,
                fee_denomination=DENOM,
                staking_denomination=DENOM,
            )
            ledger = ledgers[index] = LedgerClient(cfg)
        return ledger

    @property
    def ledger(self) -> LedgerClient:
        """cosmpy's client for the active endpoint."""
        return self._ledger(self._active)

    def _get_from(self, index: int, path: str, params: dict[str, Any]) -> httpx.Response:
        response = self._https[index].get(path, params=params or None)
        if response.status_code in (502, 503, 504):
            raise EndpointUnavailable(
                f"{self.urls[index]}{path}: HTTP {response.status_code} {response.text[:300]}"
            )
        return response

    def _get(self, path: str, **params: Any) -> httpx.Response:
        return self._call(lambda i: self._get_from(i, path, params))

    def _poll_get(self, path: str, wait: float, **params: Any) -> httpx.Response:
        """A long-poll; with several endpoints, one that made no progress in a whole poll period
        (stopped, or cut off from the others) is left for the next."""
        holder: list[int] = []

        def call(i: int) -> httpx.Response:
            holder.append(i)
            return self._get_from(i, path, {**params, "wait": wait})

        response = self._call(call)
        if response.status_code == 404 and len(self.urls) > 1 and wait >= self._poll:
            self._failover(holder[-1])
        return response

    def _json(self, response: httpx.Response) -> Any:
        if response.status_code >= 400:
            raise ChainClientError(
                f"{response.request.url}: HTTP {response.status_code} {response.text[:500]}"
            )
        return response.json()

    def _account(self, address: str) -> tuple[int, int]:
        try:
            account = self._call(lambda i: self._ledger(i).query_account(address))
        except RuntimeError as exc:
            if _is_missing_account(exc):
                raise AccountNotFound(address, self.url) from None
            raise
        return int(account.number), int(account.sequence)

    def _submit(self, tx_bytes: bytes) -> tuple[str, int, str, str]:
        request = BroadcastTxRequest(tx_bytes=tx_bytes, mode=BroadcastMode.BROADCAST_MODE_SYNC)
        resp = self._call(lambda i: self._ledger(i).txs.BroadcastTx(request)).tx_response
        return resp.txhash, int(resp.code), resp.codespace, resp.raw_log

    def wait_for_tx(self, tx_hash: str, timeout: float = 30.0) -> TxResult:
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ChainTimeout(f"tx {tx_hash} not committed within {timeout}s")
            wait = round(min(remaining, self._poll), 3)
            response = self._poll_get(f"/inference/diloco/v1/txs/{tx_hash}", wait)
            if response.status_code != 404:
                return TxResult.from_json(self._json(response)["result"])

    def height(self) -> int:
        return int(self._json(self._get("/inference/diloco/v1/status"))["height"])

    def wait_for_block(self, after_height: int, timeout: float = 30.0) -> Block:
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ChainTimeout(f"no block after {after_height} within {timeout}s")
            wait = round(min(remaining, self._poll), 3)
            response = self._poll_get(f"/inference/diloco/v1/blocks/{after_height + 1}", wait)
            if response.status_code != 404:
                return Block.from_json(self._json(response))

    def block(self, height: int) -> Block:
        return Block.from_json(self._json(self._get(f"/inference/diloco/v1/blocks/{height}")))

    def query(self, name: str, **params: Any) -> Any:
        return self._json(self._get(f"/inference/diloco/v1/query/{name}", **params))

    def balance(self, address: str) -> int:
        return self._call(lambda i: self._ledger(i).query_bank_balance(address, DENOM))
