"""The devnet node: mempool, a block every interval, SQLite persistence, and the HTTP API.

One asyncio event loop does everything (HTTP handlers, CheckTx, block production), so the app
and the mempool need no locks and a block is never built from a half-admitted tx. The Cosmos
REST routes are answered with cosmpy's own protobuf types rendered by protobuf's JSON mapping,
which is exactly what an unmodified `LedgerClient` parses; the module's own routes live under
`/inference/diloco/v1/` (queries, long-poll blocks and txs, status).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import inspect
import json
import sys
import time
import types
import typing
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from cosmpy.protos.cosmos.auth.v1beta1.auth_pb2 import BaseAccount
from cosmpy.protos.cosmos.auth.v1beta1.query_pb2 import QueryAccountResponse
from cosmpy.protos.cosmos.bank.v1beta1.query_pb2 import QueryAllBalancesResponse, QueryBalanceResponse
from cosmpy.protos.cosmos.base.abci.v1beta1.abci_pb2 import TxResponse
from cosmpy.protos.cosmos.base.tendermint.v1beta1.query_pb2 import GetLatestBlockResponse
from cosmpy.protos.cosmos.base.v1beta1.coin_pb2 import Coin as ProtoCoin
from cosmpy.protos.cosmos.consensus.v1.query_pb2 import QueryParamsResponse as ConsensusParamsResponse
from cosmpy.protos.cosmos.crypto.secp256k1.keys_pb2 import PubKey as Secp256k1PubKey
from cosmpy.protos.cosmos.tx.v1beta1.service_pb2 import (
    BroadcastTxResponse,
    GetTxResponse,
    SimulateRequest,
    SimulateResponse,
)
from cosmpy.protos.cosmos.tx.v1beta1.tx_pb2 import Tx
from cosmpy.protos.tendermint.abci.types_pb2 import Event as AbciEvent
from cosmpy.protos.tendermint.abci.types_pb2 import EventAttribute
from fastapi import FastAPI, Request
from fastapi.responses import Response
from google.protobuf import any_pb2, json_format
from google.protobuf.message import Message
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest

from chain import queries
from chain.app import App, BlockResult, DecodedTx, Limits, TxRejected, tx_hash
from chain.errors import ChainError
from chain.genesis import Genesis, genesis_state
from chain.params import DENOM, ZERO_HASH
from chain.store import Store, StoreError

API = "/inference/diloco/v1"
MAX_BODY_BYTES = 1024 * 1024
MAX_MEMPOOL = 50_000
MAX_WAIT_S = 30.0
ERR_TX_IN_CACHE = 19
ERR_MEMPOOL_FULL = 20
DEV_ACCOUNTS = 32
DEV_BALANCE = 10**18
"""ngonka per dev test wallet: 1e9 GNK, plenty for any devnet run."""


class EngineUnavailable(RuntimeError):
    """The consensus engine behind this node cannot take a tx now (a CometBFT restart): HTTP 503,
    so that a client tries another validator."""


def dev_genesis(n_accounts: int = DEV_ACCOUNTS, chain_id: str = "gonka-devnet") -> Genesis:
    """Deterministic test wallets 0..n-1 funded, wallet 0 the authority, a funded reward pool."""
    from protocol.keys import test_wallet

    addresses = [str(test_wallet(i).address()) for i in range(n_accounts)]
    return Genesis(
        chain_id=chain_id,
        authority=addresses[0],
        accounts=dict.fromkeys(addresses, DEV_BALANCE),
        reward_pool=DEV_BALANCE,
    )


def log_json(**fields: Any) -> None:
    """One structured log line on stdout (the node's only log format)."""
    sys.stdout.write(json.dumps({"ts": round(time.time(), 3), **fields}, separators=(",", ":")) + "\n")
    sys.stdout.flush()


class Metrics:
    """Prometheus metrics in a registry of their own (several nodes may share a test process)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.height = Gauge("chain_height", "Last committed block height", registry=self.registry)
        self.txs = Counter(
            "chain_txs_committed", "Txs included in blocks", ["result"], registry=self.registry
        )
        self.mempool = Gauge("chain_mempool_size", "Txs waiting for a block", registry=self.registry)
        self.rejected = Counter(
            "chain_rejected_txs", "Txs refused at broadcast", ["codespace", "code"], registry=self.registry
        )
        self.block_seconds = Gauge(
            "chain_last_block_seconds", "Time to build and commit the last block", registry=self.registry
        )


class Node:
    """The chain: an `App` over a `Store`, a mempool, and block production."""

    def __init__(
        self,
        home: str | Path,
        genesis: Genesis | None = None,
        *,
        block_interval: float = 1.0,
        min_gas_price: float = 1.0,
        limits: Limits | None = None,
        log: Callable[..., None] = log_json,
        app_class: type[App] = App,
    ):
        self.home = Path(home)
        self.block_interval = block_interval
        self.log = log
        self.store = Store(self.home / "chain.sqlite")
        stored = self.store.genesis_json()
        if stored is None:
            genesis = genesis or dev_genesis()
            self.store.init_genesis(genesis_state(genesis), genesis.model_dump_json())
        elif genesis is not None and Genesis.model_validate_json(stored) != genesis:
            raise StoreError(
                f"{self.home} holds a chain with a different genesis: --genesis, --authority and --fund "
                "shape a new chain only (use a new --home, or fund accounts with `gonka-diloco keys send`)"
            )
        self.genesis = Genesis.model_validate_json(self.store.genesis_json() or "")
        state, header, block_hash = self.store.load_state()
        last_time_ns = header["time_ns"] if header else int(self.genesis.genesis_time * 1e9) - 1
        self.app = app_class(
            state,
            min_gas_price=min_gas_price,
            limits=limits,
            last_block_hash=block_hash or ZERO_HASH,
            last_time_ns=max(last_time_ns, 0),
            committed=lambda: self.store.load_state()[0],  # a failed handler's block is replayed from it
        )
        self.last_header = header
        self.mempool: dict[str, DecodedTx] = {}
        self.pending_seq: dict[str, int] = {}
        self.metrics = Metrics()
        self.metrics.height.set(self.app.height)
        self.halted: str | None = None
        self._new_block: asyncio.Event | None = None

    @property
    def height(self) -> int:
        return self.app.height

    # ------------------------------------------------------------ mempool

    def submit(self, raw: bytes) -> tuple[str, TxRejected | None]:
        """CheckTx and mempool admission: (hash, None) when admitted, else the rejection."""
        hash_hex = tx_hash(raw)
        try:
            if hash_hex in self.mempool:
                raise TxRejected(ERR_TX_IN_CACHE, "tx already in mempool")
            if len(self.mempool) >= MAX_MEMPOOL:
                raise TxRejected(ERR_MEMPOOL_FULL, f"mempool is full ({MAX_MEMPOOL} txs)")
            tx = self.app.check_tx(raw, self.pending_seq)
        except TxRejected as exc:
            self.metrics.rejected.labels(exc.codespace, str(exc.code)).inc()
            self.log(event="tx_rejected", hash=hash_hex, code=exc.code, codespace=exc.codespace, log=exc.log)
            return hash_hex, exc
        self.mempool[hash_hex] = tx
        self.pending_seq[tx.signer] = tx.sequence + 1
        self.metrics.mempool.set(len(self.mempool))
        return hash_hex, None

    def _take_block_txs(self) -> list[bytes]:
        lim = self.app.limits
        taken: list[bytes] = []
        size = gas = 0
        for tx in self.mempool.values():
            if (
                len(taken) >= lim.block_max_txs
                or size + len(tx.raw) > lim.block_max_bytes
                or gas + tx.gas_limit > lim.block_max_gas
            ):
                break
            taken.append(tx.raw)
            size, gas = size + len(tx.raw), gas + tx.gas_limit
        return taken

    # ------------------------------------------------------------ blocks

    def produce_block(self, time_ns: int | None = None) -> BlockResult:
        """Deliver the mempool's head as the next block and commit it durably before anyone hears of it."""
        started = time.perf_counter()
        block = self.deliver(self._take_block_txs(), time_ns or time.time_ns())
        self.commit(block, started)
        return block

    def deliver(self, txs: list[bytes], time_ns: int, **header: Any) -> BlockResult:
        """Run a block through the app (FinalizeBlock under CometBFT); nothing is durable yet."""
        if self.halted:
            raise StoreError(f"node halted: {self.halted}")
        try:
            return self.app.deliver_block(txs, time_ns, **header)
        except BaseException as exc:  # the state may be half-written: stop producing
            self.halted = repr(exc)
            raise

    def commit(self, block: BlockResult, started: float | None = None) -> None:
        """Persist a delivered block, then let the mempool, the metrics and the waiters know."""
        started = time.perf_counter() if started is None else started
        try:
            stats = self.store.commit_block(block, self.app.state)
        except BaseException as exc:  # in-memory state ran ahead of the disk: stop producing
            self.halted = repr(exc)
            raise
        for result in block.results:
            self.mempool.pop(result.hash, None)
        self.pending_seq = {}
        for tx in self.mempool.values():
            self.pending_seq[tx.signer] = tx.sequence + 1
        self.last_header = block.header
        elapsed = time.perf_counter() - started
        m = self.metrics
        m.height.set(block.height)
        m.mempool.set(len(self.mempool))
        m.block_seconds.set(elapsed)
        for result in block.results:
            m.txs.labels("ok" if result.code == 0 else "failed").inc()
        self.log(
            event="block",
            height=block.height,
            hash=block.hash,
            app_hash=block.header["app_hash"],
            txs=len(block.results),
            failed=sum(r.code != 0 for r in block.results),
            events=len(block.events),
            rows=stats.rows,
            ms=round(elapsed * 1000, 2),
        )
        if self._new_block is not None:
            self._new_block.set()
            self._new_block = asyncio.Event()

    async def committed(self) -> None:
        """Return once no block is between delivery and commit: HTTP reads see committed state only.
        The embedded node delivers and commits in one step, so it never waits."""

    async def broadcast_tx(self, raw: bytes) -> tuple[str, TxRejected | None]:
        """The REST broadcast route's entry: CheckTx here; a CometBFT validator goes through its RPC."""
        return self.submit(raw)

    def engine_status(self) -> dict[str, Any]:
        """What `/status` says about the engine that makes the blocks."""
        return {"engine": "embedded"}

    async def run_blocks(self) -> None:
        """A block every `block_interval` seconds, on a fixed schedule (a slow block does not drift it)."""
        self._new_block = asyncio.Event()
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:
            next_at += self.block_interval
            await asyncio.sleep(max(0.0, next_at - loop.time()))
            self.produce_block()
            if loop.time() > next_at + self.block_interval:
                next_at = loop.time()

    async def wait_for_height(self, height: int, timeout: float) -> bool:
        """True once block `height` is committed; False after `timeout` seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, min(timeout, MAX_WAIT_S))
        while self.height < height:
            event = self._new_block
            remaining = deadline - loop.time()
            if event is None or remaining <= 0:
                return False
            try:
                await asyncio.wait_for(event.wait(), remaining)
            except TimeoutError:
                return self.height >= height
        return True

    def close(self) -> None:
        self.store.close()


# ---------------------------------------------------------------- HTTP


def _pb_json(message: Message, status: int = 200) -> Response:
    body = json_format.MessageToJson(
        message, preserving_proto_field_name=True, indent=None, always_print_fields_with_no_presence=True
    )
    return Response(body, status_code=status, media_type="application/json")


def _json(data: Any, status: int = 200) -> Response:
    return Response(
        json.dumps(data, separators=(",", ":")), status_code=status, media_type="application/json"
    )


MAX_HEIGHT = (1 << 63) - 1
"""Heights are int64 (CometBFT, SQLite): anything above is a block that cannot exist (404)."""


def _grpc_error(status: int, grpc_code: int, message: str) -> Response:
    """The grpc-gateway error shape a Cosmos REST endpoint answers with."""
    return _json({"code": grpc_code, "message": message, "details": []}, status)


async def _read_json(request: Request) -> Any:
    """The request body as JSON, bounded by MAX_BODY_BYTES; raises ValueError with a reason."""
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise ValueError(f"request body larger than {MAX_BODY_BYTES} bytes")
        chunks.append(chunk)
    try:
        return json.loads(b"".join(chunks))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"request body is not JSON: {exc}") from None
    except RecursionError:  # a body of nested brackets: bad input, not a server error
        raise ValueError("request body nests too deeply") from None


def _b64(value: Any, what: str) -> bytes:
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a base64 string")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"{what} is not valid base64") from None


def _abci_events(events: list[dict[str, Any]]) -> list[AbciEvent]:
    return [
        AbciEvent(
            type=e["type"],
            attributes=[EventAttribute(key=k, value=v, index=True) for k, v in e["attributes"].items()],
        )
        for e in events
    ]


def _tx_response(raw: bytes, result: dict[str, Any], header: dict[str, Any]) -> TxResponse:
    tx_any = any_pb2.Any()
    tx_any.Pack(Tx.FromString(raw), type_url_prefix="/")
    return TxResponse(
        height=result["height"],
        txhash=result["hash"],
        codespace=result["codespace"],
        code=result["code"],
        raw_log=result["log"],
        gas_wanted=result["gas_wanted"],
        gas_used=result["gas_used"],
        tx=tx_any,
        timestamp=header["time"],
        events=_abci_events(result["events"]),
    )


def _coerce(fn: Callable[..., Any], params: dict[str, str]) -> dict[str, Any]:
    """Query-string values typed by the query function's annotations (int or str)."""
    hints = typing.get_type_hints(fn)
    out: dict[str, Any] = {}
    names = [p for p in inspect.signature(fn).parameters if p != "state"]
    for key, value in params.items():
        if key not in names:
            raise ValueError(f"unknown parameter {key!r}; expected {names}")
        tp = hints.get(key, str)
        args = typing.get_args(tp) if typing.get_origin(tp) in (types.UnionType, typing.Union) else (tp,)
        if int in args:
            if not value.lstrip("-").isdigit() or len(value) > 20:
                raise ValueError(f"{key} must be an integer")
            out[key] = int(value)
        else:
            out[key] = value[:256]
    return out


QUERIES: dict[str, Callable[..., Any]] = {
    name: fn
    for name, fn in vars(queries).items()
    if inspect.isfunction(fn)
    and not name.startswith("_")
    and fn.__module__ == queries.__name__
    and next(iter(inspect.signature(fn).parameters), None) == "state"
}


class CommittedReads:
    """ASGI guard in front of every route: a request waits while a block is between delivery and
    commit (so it never sees uncommitted state), and a halted node, whose memory may have run
    ahead of its disk or, under CometBFT, of the network, answers 503 instead of serving state:
    clients fail over to another validator. Its status and metrics stay readable."""

    OPEN_WHEN_HALTED = frozenset({f"{API}/status", "/metrics"})

    def __init__(self, app: Any, node: Node) -> None:
        self.app, self.node = app, node

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            if not self.node.halted:
                await self.node.committed()
            if self.node.halted and scope["path"] not in self.OPEN_WHEN_HALTED:
                # halted before, or while waiting for a commit that will not come
                message = f"node halted: {self.node.halted}"[:2000]
                response = _json({"code": 14, "message": message, "details": []}, 503)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(node: Node, *, run_blocks: bool = True) -> FastAPI:
    """The HTTP API of one node. With `run_blocks` the block loop runs for the app's lifetime."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        node._new_block = asyncio.Event()
        task = asyncio.create_task(node.run_blocks()) if run_blocks else None
        try:
            yield
        finally:
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
            node.close()

    app = FastAPI(title="gonka-diloco devnet", lifespan=lifespan)
    app.add_middleware(CommittedReads, node=node)
    cosmos_tx = "/cosmos/tx/v1beta1"

    # ---- cosmos: auth, bank, consensus, tendermint

    @app.get("/cosmos/auth/v1beta1/accounts/{address}")
    async def account(address: str) -> Response:
        acc = node.app.state.accounts.get(address)
        if acc is None:
            return _grpc_error(404, 5, f"account {address[:128]} not found")
        base = BaseAccount(address=acc.address, account_number=acc.number, sequence=acc.sequence)
        if acc.pub_key:
            base.pub_key.Pack(Secp256k1PubKey(key=bytes.fromhex(acc.pub_key)), type_url_prefix="/")
        resp = QueryAccountResponse()
        resp.account.Pack(base, type_url_prefix="/")
        return _pb_json(resp)

    def _balance(address: str) -> int:
        acc = node.app.state.accounts.get(address)
        return acc.balance if acc else 0

    @app.get("/cosmos/bank/v1beta1/balances/{address}/by_denom")
    async def balance(address: str, denom: str = DENOM) -> Response:
        amount = _balance(address) if denom == DENOM else 0
        return _pb_json(QueryBalanceResponse(balance=ProtoCoin(denom=denom[:128], amount=str(amount))))

    @app.get("/cosmos/bank/v1beta1/balances/{address}")
    async def all_balances(address: str) -> Response:
        amount = _balance(address)
        coins = [ProtoCoin(denom=DENOM, amount=str(amount))] if amount else []
        return _pb_json(QueryAllBalancesResponse(balances=coins))

    @app.get("/cosmos/consensus/v1/params")
    async def consensus_params() -> Response:
        resp = ConsensusParamsResponse()
        resp.params.block.max_bytes = node.app.limits.block_max_bytes
        resp.params.block.max_gas = node.app.limits.block_max_gas
        return _pb_json(resp)

    def _cosmos_block(height: int) -> Response:
        data = node.store.block(height) if 0 < height <= MAX_HEIGHT else None
        if data is None:
            return _grpc_error(404, 5, f"block {height} not found")
        header = data["header"]
        resp = GetLatestBlockResponse()
        resp.block_id.hash = bytes.fromhex(data["hash"])
        resp.block.header.chain_id = header["chain_id"]
        resp.block.header.height = header["height"]
        resp.block.header.time.FromNanoseconds(header["time_ns"])
        resp.block.header.app_hash = bytes.fromhex(header["app_hash"])
        resp.block.header.data_hash = bytes.fromhex(header["txs_root"])
        resp.block.header.last_block_id.hash = bytes.fromhex(header["prev_block_hash"])
        resp.block.data.txs.extend(data["txs"])
        return _pb_json(resp)

    @app.get("/cosmos/base/tendermint/v1beta1/blocks/latest")
    async def latest_block() -> Response:
        return _cosmos_block(node.height)

    @app.get("/cosmos/base/tendermint/v1beta1/blocks/{height}")
    async def block_by_height(height: int) -> Response:
        return _cosmos_block(height)

    # ---- cosmos: tx service

    @app.post(f"{cosmos_tx}/txs")
    async def broadcast(request: Request) -> Response:
        try:
            body = await _read_json(request)
            if not isinstance(body, dict):
                raise ValueError("request body must be a JSON object")
            mode = body.get("mode", "BROADCAST_MODE_SYNC")
            if mode not in ("BROADCAST_MODE_SYNC", "BROADCAST_MODE_ASYNC", 2, 3):
                raise ValueError(f"unsupported broadcast mode {str(mode)[:40]!r}: use BROADCAST_MODE_SYNC")
            raw = _b64(body.get("tx_bytes", body.get("txBytes")), "tx_bytes")  # proto JSON allows both
        except ValueError as exc:
            return _grpc_error(400, 3, str(exc))
        if node.halted:
            return _grpc_error(503, 14, f"node halted: {node.halted}")
        try:
            hash_hex, rejection = await node.broadcast_tx(raw)
        except EngineUnavailable as exc:
            return _grpc_error(503, 14, str(exc))
        resp = BroadcastTxResponse()
        resp.tx_response.txhash = hash_hex
        if rejection is not None:
            resp.tx_response.code = rejection.code
            resp.tx_response.codespace = rejection.codespace
            resp.tx_response.raw_log = rejection.log
            resp.tx_response.gas_wanted = rejection.gas_wanted
            resp.tx_response.gas_used = rejection.gas_used
        return _pb_json(resp)

    @app.post(f"{cosmos_tx}/simulate")
    async def simulate(request: Request) -> Response:
        try:
            body = await _read_json(request)
            if not isinstance(body, dict):
                raise ValueError("request body must be a JSON object")
            if body.get("tx_bytes") or body.get("txBytes"):
                raw = _b64(body.get("tx_bytes") or body.get("txBytes"), "tx_bytes")
            else:
                req = json_format.ParseDict(body, SimulateRequest())
                raw = req.tx.SerializeToString()
        except (ValueError, json_format.ParseError) as exc:
            return _grpc_error(400, 3, f"invalid simulate request: {str(exc)[:500]}")
        try:
            gas, events = node.app.simulate(raw)
        except TxRejected as exc:
            return _grpc_error(400, 2, f"{exc.log}: [{exc.codespace}:{exc.code}]")
        resp = SimulateResponse()
        resp.gas_info.gas_used = gas
        resp.result.events.extend(_abci_events(events))
        return _pb_json(resp)

    @app.get(f"{cosmos_tx}/txs/{{hash_hex}}")
    async def get_tx(hash_hex: str) -> Response:
        found = node.store.tx(hash_hex[:64])
        if found is None:
            return _grpc_error(404, 5, f"tx not found: {hash_hex[:64]}")
        raw, result, header = found
        resp = GetTxResponse(tx=Tx.FromString(raw), tx_response=_tx_response(raw, result.to_json(), header))
        return _pb_json(resp)

    # ---- the module's own routes

    @app.get(f"{API}/status")
    async def status() -> Response:
        header = node.last_header or {}
        return _json(
            {
                "chain_id": node.app.chain_id,
                "height": node.height,
                "app_hash": header.get("app_hash"),
                "block_hash": node.app.last_block_hash,
                "time_ns": header.get("time_ns"),
                "mempool": len(node.mempool),
                "block_interval": node.block_interval,
                "min_gas_price": str(node.app.min_gas_price),
                "halted": node.halted,
                **node.engine_status(),
            }
        )

    @app.get(f"{API}/blocks/latest")
    async def diloco_latest_block() -> Response:
        return _block_json(node.height)

    def _block_json(height: int) -> Response:
        data = node.store.block(height) if 0 < height <= MAX_HEIGHT else None
        if data is None:
            return _json({"code": 5, "message": f"block {height} not found (latest {node.height})"}, 404)
        data["txs"] = [base64.b64encode(raw).decode() for raw in data["txs"]]
        return _json(data)

    @app.get(f"{API}/blocks/{{height}}")
    async def diloco_block(height: int, wait: float = 0.0) -> Response:
        """Long-poll: with `wait`, answer as soon as block `height` exists (404 after `wait` s)."""
        if wait > 0 and node.height < height <= MAX_HEIGHT:
            await node.wait_for_height(height, wait)
        return _block_json(height)

    @app.get(f"{API}/txs/{{hash_hex}}")
    async def diloco_tx(hash_hex: str, wait: float = 0.0) -> Response:
        """Long-poll: with `wait`, answer once the tx is in a committed block (404 after `wait` s)."""
        hash_hex = hash_hex[:64].upper()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, min(wait, MAX_WAIT_S))
        while (found := node.store.tx(hash_hex)) is None:
            remaining = deadline - loop.time()
            if remaining <= 0 or not await node.wait_for_height(node.height + 1, remaining):
                pending = hash_hex in node.mempool
                return _json({"code": 5, "message": f"tx not found: {hash_hex}", "in_mempool": pending}, 404)
        raw, result, header = found
        return _json({"result": result.to_json(), "tx": base64.b64encode(raw).decode(), "header": header})

    @app.get(f"{API}/query/{{name}}")
    async def query(name: str, request: Request) -> Response:
        fn = QUERIES.get(name)
        if fn is None:
            return _json(
                {"code": 5, "message": f"unknown query {name[:64]!r}", "queries": sorted(QUERIES)}, 404
            )
        try:
            kwargs = _coerce(fn, dict(request.query_params))
            return _json(fn(node.app.state, **kwargs))
        except ChainError as exc:
            return _json({"code": exc.code, "codespace": exc.codespace, "message": exc.log}, 404)
        except (ValueError, TypeError) as exc:
            return _json({"code": 3, "message": f"bad query parameters: {exc}"}, 400)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(node.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app
