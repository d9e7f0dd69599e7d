"""One validator: the chain's `App` as a CometBFT 0.38 ABCI application, and its REST routes.

A `Validator` is the embedded `Node` with block production handed to CometBFT: the same `App`
(ante, module, header), the same `Store` (row-wise persistence), the same mempool bookkeeping and
the same HTTP routes (`chain.node.create_app`). CometBFT runs as a child process and talks to the
app over its ABCI socket protocol; every ABCI call is answered on the event loop that also serves
HTTP, one call at a time, so nothing needs a lock.

Which call does what (specs/protocol.md §2.9):
- `Info`: last committed height and app hash: CometBFT's handshake replays what the app lacks.
- `InitChain`: checks that CometBFT's genesis carries the app's genesis (`app_state`, which is
  also where the app read it from) and answers the genesis app hash.
- `CheckTx`: the ante (decode, signature, sequence, fee, limits) against committed state, with
  the sequences of txs already admitted (`RECHECK` after each block rebuilds them).
- `PrepareProposal` / `ProcessProposal`: the app's block limits, applied and checked
  deterministically; a proposal with an undecodable or oversized tx is rejected.
- `FinalizeBlock`: begin_block, the txs, end_block and the header, with the block time and the
  block hash from CometBFT's header (`RequestFinalizeBlock.time` / `.hash`), never a local clock.
- `Commit`: the block and the rows it changed are written in one SQLite transaction; only then do
  HTTP readers see the new state (they wait while a block is between FinalizeBlock and Commit).
"""

from __future__ import annotations

import asyncio
import base64
import importlib.metadata
import json
import re
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
from cosmpy.protos.tendermint.abci import types_pb2 as abci
from cosmpy.protos.tendermint.types.validator_pb2 import BlockIDFlag

from chain.abci import cometbft, faults
from chain.abci.wire import FramingError, frame, read_request
from chain.app import BlockResult, Limits, TxRejected, tx_hash
from chain.errors import ChainError
from chain.genesis import Genesis, genesis_state
from chain.node import ERR_MEMPOOL_FULL, ERR_TX_IN_CACHE, QUERIES, EngineUnavailable, Node, log_json
from chain.state import app_hash

APP_VERSION = 1
MAX_QUERY_BYTES = 64 * 1024
ENGINE_CODESPACE = "cometbft"
STOP_GRACE_S = 5.0
ENGINE_WATCH_S = 0.2
"""How often the validator checks that its engine is alive and has not reported a consensus failure."""


def _app_version() -> str:
    try:
        return importlib.metadata.version("gonka-diloco")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


class AbciError(RuntimeError):
    """A request the app cannot answer without diverging (wrong height, unknown genesis): CometBFT
    receives an exception response and stops, which is what it must do."""


def _events(events: list[dict[str, Any]]) -> list[abci.Event]:
    return [
        abci.Event(
            type=e["type"],
            attributes=[abci.EventAttribute(key=k, value=v, index=True) for k, v in e["attributes"].items()],
        )
        for e in events
    ]


def _int64(n: int) -> int:
    """ABCI's gas fields are int64; a tx's gas limit is a uint64 (clamped, never a ValueError)."""
    return max(-(1 << 63), min(int(n), (1 << 63) - 1))


def _refused_check(exc: Exception) -> abci.ResponseCheckTx:
    rejected = TxRejected.unexpected("CheckTx", exc)
    return abci.ResponseCheckTx(code=rejected.code, codespace=rejected.codespace, log=rejected.log)


_TOTAL: dict[str, Any] = {
    "check_tx": _refused_check,
    "prepare_proposal": lambda _: abci.ResponsePrepareProposal(),  # an empty block is always valid
    "process_proposal": lambda _: abci.ResponseProcessProposal(
        status=abci.ResponseProcessProposal.ProposalStatus.REJECT
    ),
    "query": lambda exc: abci.ResponseQuery(
        code=1, codespace="undefined", log=f"query: {type(exc).__name__}"[:200]
    ),
}
"""What a request a tx or a client reaches answers when its handler fails unexpectedly."""


class Validator(Node):
    """The app side of one validator, and the supervisor of its CometBFT process."""

    def __init__(
        self,
        home: Path,
        *,
        min_gas_price: float = 1.0,
        limits: Limits | None = None,
        log: Any = log_json,
        fault: str | None = None,
    ):
        self.info = cometbft.read_home(home)
        super().__init__(
            home / "app",
            self.info.genesis,
            block_interval=self.info.block_interval,
            min_gas_price=min_gas_price,
            limits=limits,
            log=log,
            app_class=faults.app_class(fault),
        )
        self.cometbft_home = home
        self.fault = fault
        self._pending: BlockResult | None = None
        self._pending_started = 0.0
        self._settled: asyncio.Event | None = None
        self._recheck_seq: dict[str, int] = {}
        self._abci_sock: socket.socket | None = None
        self._rpc: httpx.AsyncClient | None = None
        self.engine: subprocess.Popen[bytes] | None = None
        self.engine_log = home / "cometbft.log"

    # ------------------------------------------------------------ the engine process

    def start_engine(self) -> int:
        """Listen for ABCI on a free loopback port, then start CometBFT pointed at it (it connects
        as soon as it starts: the socket is already listening). Returns the ABCI port."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        self._abci_sock = sock
        port = sock.getsockname()[1]
        self.engine = cometbft.spawn(self.cometbft_home, port, self.engine_log)
        self.log(event="engine_started", pid=self.engine.pid, abci_port=port, rpc=self.info.rpc_url)
        return port

    async def run_blocks(self) -> None:
        """Serve ABCI to the engine for the process's lifetime, watching it. If the engine exits, or
        reports that the network committed a block whose header disagrees with this app's hash
        (CometBFT then stops its consensus but keeps running), the validator halts: its REST stops
        serving state (503) but stays up to say why."""
        self._settled = asyncio.Event()
        self._settled.set()
        if self._abci_sock is None:
            self.start_engine()
        assert self._abci_sock is not None and self.engine is not None
        server = await asyncio.start_server(self._serve, sock=self._abci_sock)
        offset = self.engine_log.stat().st_size if self.engine_log.exists() else 0
        async with server:
            while True:
                await asyncio.sleep(ENGINE_WATCH_S)
                code = self.engine.poll()
                failure, offset = self._engine_failure(offset)
                if failure is not None or code is not None:
                    break
            reason = failure or self._last_words()
            self.halted = (
                f"cometbft {'exited with code ' + str(code) if code is not None else 'stopped'}: {reason}"
            )
            self._settled.set()  # readers waiting for a Commit that will not come: they get the 503
            self.log(event="engine_halted", code=code, reason=reason)
            self.stop_engine()
            await asyncio.Event().wait()

    def _engine_failure(self, offset: int) -> tuple[str | None, int]:
        """A consensus failure the engine logged since `offset` (a divergence says so), and the new offset."""
        try:
            with self.engine_log.open("rb") as f:
                f.seek(offset)
                chunk = f.read(4 * 1024 * 1024)
        except OSError:
            return None, offset
        end = chunk.rfind(b"\n") + 1  # whole lines only; the rest is read next time
        text = chunk[:end].decode(errors="replace")
        found = re.search(r"wrong Block\.Header\.AppHash[^\n]{0,200}", text)
        if found:
            return (
                f"diverged: the network committed another app hash ({found.group(0).strip()})",
                offset + end,
            )
        failure = re.search(r"CONSENSUS FAILURE[^\n]{0,300}", text)
        if failure:
            return failure.group(0), offset + end
        return None, offset + end

    def _last_words(self) -> str:
        try:
            with self.engine_log.open("rb") as f:
                f.seek(max(0, f.seek(0, 2) - 64 * 1024))
                tail = f.read().decode(errors="replace")
        except OSError:
            return "no engine log"
        panic = re.search(r"panic: [^\n]{0,300}", tail)
        if panic:
            return panic.group(0)
        lines = [line for line in tail.splitlines() if line.strip()]
        return lines[-1][:300] if lines else "no output"

    def stop_engine(self) -> None:
        if self.engine is not None and self.engine.poll() is None:
            self.engine.terminate()
            try:
                self.engine.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                self.engine.kill()
                self.engine.wait()

    def close(self) -> None:
        self.stop_engine()
        if self._abci_sock is not None:
            self._abci_sock.close()
        super().close()

    # ------------------------------------------------------------ what the HTTP routes use

    async def committed(self) -> None:
        if self._settled is not None:
            await self._settled.wait()

    async def broadcast_tx(self, raw: bytes) -> tuple[str, TxRejected | None]:
        """Broadcast through CometBFT's RPC (`broadcast_tx_sync`): its mempool runs our CheckTx and
        gossips the tx to the other validators."""
        hash_hex = tx_hash(raw)
        if self._rpc is None:
            self._rpc = httpx.AsyncClient(base_url=self.info.rpc_url, timeout=10.0)
        request = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "broadcast_tx_sync",
            "params": {"tx": base64.b64encode(raw).decode()},
        }
        try:
            body = (await self._rpc.post("/", json=request)).json()
        except (httpx.HTTPError, ValueError) as exc:
            raise EngineUnavailable(f"CometBFT RPC {self.info.rpc_url} unreachable: {exc}") from None
        error = body.get("error") if isinstance(body, dict) else None
        if error:
            text = f"{error.get('message', '')}: {error.get('data', '')}"
            if "already exists in cache" in text:
                return hash_hex, TxRejected(ERR_TX_IN_CACHE, "tx already in mempool")
            if "mempool is full" in text:
                return hash_hex, TxRejected(ERR_MEMPOOL_FULL, f"mempool is full: {text[:200]}")
            return hash_hex, TxRejected(1, f"CometBFT refused the tx: {text[:500]}", ENGINE_CODESPACE)
        result = body.get("result", {}) if isinstance(body, dict) else {}
        code = int(result.get("code", 0))
        if code:
            return hash_hex, TxRejected(code, str(result.get("log", "")), str(result.get("codespace", "")))
        return hash_hex, None

    def engine_status(self) -> dict[str, Any]:
        return {
            "engine": "cometbft",
            "name": self.info.name,
            "validator_address": self.info.address,
            "rpc": self.info.rpc_url,
            "engine_alive": self.engine is not None and self.engine.poll() is None,
            "fault": self.fault or None,
        }

    # ------------------------------------------------------------ the ABCI socket

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One ABCI connection (CometBFT opens four): requests answered in order, one by one."""
        try:
            while (request := await read_request(reader)) is not None:
                writer.write(frame(self.handle(request)))
                await writer.drain()
        except FramingError as exc:
            self.log(event="abci_error", error=str(exc))
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    def handle(self, request: abci.Request) -> abci.Response:
        """One ABCI request to its response. The calls a tx reaches (CheckTx, PrepareProposal,
        ProcessProposal) never answer with an exception, on which CometBFT stops the connection and
        the validator: an unexpected error there refuses the tx (CheckTx), proposes an empty block
        (PrepareProposal) or rejects the proposal (ProcessProposal), decisions that depend on the
        bytes alone. FinalizeBlock is total for txs inside the app (`chain.app`); what still raises
        there, or in Info, InitChain and Commit, is a state the app cannot vouch for (a wrong height,
        another genesis, a failed write), and halting is right: the alternative is guessing."""
        kind = request.WhichOneof("value")
        handler = getattr(self, f"_abci_{kind}", None)
        try:
            if handler is None:
                raise AbciError(f"unsupported ABCI request {kind}")
            return abci.Response(**{kind: handler(getattr(request, kind))})
        except Exception as exc:
            self.log(event="abci_exception", request=kind, error=repr(exc)[:2000])
            fallback = None if isinstance(exc, MemoryError) else _TOTAL.get(str(kind))
            if fallback is not None:
                return abci.Response(**{kind: fallback(exc)})
            return abci.Response(exception=abci.ResponseException(error=f"{kind}: {exc!r}"[:4000]))

    def _abci_echo(self, req: abci.RequestEcho) -> abci.ResponseEcho:
        return abci.ResponseEcho(message=req.message)

    def _abci_flush(self, req: abci.RequestFlush) -> abci.ResponseFlush:
        return abci.ResponseFlush()

    def _abci_info(self, req: abci.RequestInfo) -> abci.ResponseInfo:
        header = self.last_header
        return abci.ResponseInfo(
            data="gonka-diloco",
            version=_app_version(),
            app_version=APP_VERSION,
            last_block_height=self.height,
            last_block_app_hash=bytes.fromhex(header["app_hash"]) if header and self.height else b"",
        )

    def _abci_init_chain(self, req: abci.RequestInitChain) -> abci.ResponseInitChain:
        if req.chain_id != self.genesis.chain_id:
            raise AbciError(f"CometBFT chain id {req.chain_id!r}, app genesis {self.genesis.chain_id!r}")
        offered = Genesis.model_validate_json(req.app_state_bytes or b"{}")
        if offered != self.genesis:
            raise AbciError("CometBFT's genesis app_state is not the genesis this app was started with")
        if self.height != 0:
            raise AbciError(f"InitChain at app height {self.height}")
        return abci.ResponseInitChain(app_hash=app_hash(genesis_state(self.genesis)))

    def _abci_query(self, req: abci.RequestQuery) -> abci.ResponseQuery:
        """`path` = `/diloco/<query name>` (chain.queries), `data` = JSON object of its parameters."""
        height = self.height
        if self._pending is not None:
            return abci.ResponseQuery(code=1, log="a block is being committed: retry", height=height)
        name = req.path.removeprefix("/diloco/").strip("/")
        fn = QUERIES.get(name)
        if fn is None:
            return abci.ResponseQuery(
                code=6, codespace="sdk", log=f"unknown query {req.path[:64]!r}", height=height
            )
        try:
            if len(req.data) > MAX_QUERY_BYTES:
                raise ValueError(f"query data larger than {MAX_QUERY_BYTES} bytes")
            params = json.loads(req.data) if req.data else {}
            if not isinstance(params, dict):
                raise ValueError("query data must be a JSON object")
            value = fn(self.app.state, **params)
        except ChainError as exc:
            return abci.ResponseQuery(code=exc.code, codespace=exc.codespace, log=exc.log, height=height)
        except (ValueError, TypeError) as exc:
            return abci.ResponseQuery(code=3, codespace="sdk", log=f"bad query: {exc}"[:500], height=height)
        return abci.ResponseQuery(code=0, value=json.dumps(value).encode(), height=height)

    def _abci_check_tx(self, req: abci.RequestCheckTx) -> abci.ResponseCheckTx:
        hash_hex = tx_hash(req.tx)
        if req.type == abci.CheckTxType.RECHECK:
            try:
                tx = self.app.check_tx(req.tx, self._recheck_seq)
            except TxRejected as exc:
                dropped = self.mempool.pop(hash_hex, None)
                self.app.forget(hash_hex)
                if dropped is not None:
                    self.pending_seq.pop(dropped.signer, None)
                return self._check_response(exc)
            self._recheck_seq[tx.signer] = tx.sequence + 1
            self.mempool.setdefault(hash_hex, tx)
            return abci.ResponseCheckTx(code=0, gas_wanted=_int64(tx.gas_limit))
        _, rejection = self.submit(req.tx)
        if rejection is not None:
            return self._check_response(rejection)
        return abci.ResponseCheckTx(code=0, gas_wanted=_int64(self.mempool[hash_hex].gas_limit))

    @staticmethod
    def _check_response(exc: TxRejected) -> abci.ResponseCheckTx:
        return abci.ResponseCheckTx(
            code=exc.code,
            codespace=exc.codespace,
            log=exc.log,
            gas_wanted=_int64(exc.gas_wanted),
            gas_used=_int64(exc.gas_used),
        )

    def _gas_limit(self, raw: bytes) -> int:
        """The tx's gas limit; raises `TxRejected` if it does not decode (a pure function of the bytes,
        so reading it from our own mempool's decoding gives the same answer on every validator)."""
        known = self.mempool.get(tx_hash(raw))
        return known.gas_limit if known is not None else self.app.decode(raw).gas_limit

    def _abci_prepare_proposal(self, req: abci.RequestPrepareProposal) -> abci.ResponsePrepareProposal:
        """The mempool's txs in order, without undecodable ones, up to the app's block limits."""
        lim = self.app.limits
        max_bytes = (
            min(lim.block_max_bytes, req.max_tx_bytes) if req.max_tx_bytes > 0 else lim.block_max_bytes
        )
        chosen: list[bytes] = []
        size = gas = 0
        for raw in req.txs:
            try:
                tx_gas = self._gas_limit(raw)
            except TxRejected:
                continue
            if (
                len(chosen) >= lim.block_max_txs
                or size + len(raw) > max_bytes
                or gas + tx_gas > lim.block_max_gas
            ):
                break
            chosen.append(raw)
            size, gas = size + len(raw), gas + tx_gas
        return abci.ResponsePrepareProposal(txs=chosen)

    def _abci_process_proposal(self, req: abci.RequestProcessProposal) -> abci.ResponseProcessProposal:
        """Reject, the same way on every validator, a proposal no honest PrepareProposal makes."""
        status = abci.ResponseProcessProposal.ProposalStatus
        lim = self.app.limits
        if len(req.txs) > lim.block_max_txs:
            return abci.ResponseProcessProposal(status=status.REJECT)
        size = gas = 0
        for raw in req.txs:
            try:
                gas += self._gas_limit(raw)
            except TxRejected:
                return abci.ResponseProcessProposal(status=status.REJECT)
            size += len(raw)
        if size > lim.block_max_bytes or gas > lim.block_max_gas:
            return abci.ResponseProcessProposal(status=status.REJECT)
        return abci.ResponseProcessProposal(status=status.ACCEPT)

    def _abci_extend_vote(self, req: abci.RequestExtendVote) -> abci.ResponseExtendVote:
        return abci.ResponseExtendVote(vote_extension=b"")

    def _abci_verify_vote_extension(
        self, req: abci.RequestVerifyVoteExtension
    ) -> abci.ResponseVerifyVoteExtension:
        accept = abci.ResponseVerifyVoteExtension.VerifyStatus.ACCEPT
        reject = abci.ResponseVerifyVoteExtension.VerifyStatus.REJECT
        return abci.ResponseVerifyVoteExtension(status=reject if req.vote_extension else accept)

    def _abci_finalize_block(self, req: abci.RequestFinalizeBlock) -> abci.ResponseFinalizeBlock:
        if req.height != self.height + 1:
            raise AbciError(f"FinalizeBlock for height {req.height}, the app is at {self.height}")
        if self._pending is not None:
            raise AbciError(f"FinalizeBlock {req.height} before block {self._pending.height} was committed")
        self._pending_started = time.perf_counter()
        missed = sorted(
            v.validator.address.hex().upper()
            for v in req.decided_last_commit.votes
            if v.block_id_flag != BlockIDFlag.BLOCK_ID_FLAG_COMMIT
        )
        block = self.deliver(
            list(req.txs),
            req.time.ToNanoseconds(),
            block_hash=req.hash.hex(),
            extra_header={
                "engine": "cometbft",
                "proposer": req.proposer_address.hex().upper(),
                "missed_validators": missed,
            },
        )
        self._pending = block
        if self._settled is not None:
            self._settled.clear()
        return abci.ResponseFinalizeBlock(
            events=_events(block.events),
            tx_results=[
                abci.ExecTxResult(
                    code=r.code,
                    log=r.log,
                    codespace=r.codespace,
                    gas_wanted=_int64(r.gas_wanted),  # a tx may ask for 2^64 - 1 (refused by the ante)
                    gas_used=_int64(r.gas_used),
                    events=_events(r.events),
                )
                for r in block.results
            ],
            app_hash=bytes.fromhex(block.header["app_hash"]),
        )

    def _abci_commit(self, req: abci.RequestCommit) -> abci.ResponseCommit:
        block = self._pending
        if block is None:
            raise AbciError("Commit without a finalized block")
        try:
            self.commit(block, self._pending_started)
        finally:
            self._pending = None
            self._recheck_seq = {}
            if self._settled is not None:
                self._settled.set()
        return abci.ResponseCommit(retain_height=0)

    def _abci_list_snapshots(self, req: abci.RequestListSnapshots) -> abci.ResponseListSnapshots:
        return abci.ResponseListSnapshots()

    def _abci_offer_snapshot(self, req: abci.RequestOfferSnapshot) -> abci.ResponseOfferSnapshot:
        return abci.ResponseOfferSnapshot(result=abci.ResponseOfferSnapshot.Result.REJECT)

    def _abci_load_snapshot_chunk(self, req: abci.RequestLoadSnapshotChunk) -> abci.ResponseLoadSnapshotChunk:
        return abci.ResponseLoadSnapshotChunk()

    def _abci_apply_snapshot_chunk(
        self, req: abci.RequestApplySnapshotChunk
    ) -> abci.ResponseApplySnapshotChunk:
        return abci.ResponseApplySnapshotChunk(result=abci.ResponseApplySnapshotChunk.Result.ABORT)
