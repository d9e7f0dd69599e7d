"""The devnet's application: real Cosmos txs in, blocks out.

`App` sits between bytes and the pure state machine (`chain.module`): it decodes a `TxRaw` with
the Cosmos SDK protobufs, runs an ante handler shaped like the SDK's (size, memo, gas, fees,
account number, sequence, SIGN_MODE_DIRECT secp256k1 signature), and delivers blocks
(begin_block, each tx, end_block, header with app hash). Rejections carry the SDK's codespace
and codes so that cosmpy's error parsing (e.g. "out of gas", "insufficient fees") works unchanged.
Nothing here does I/O; the node persists what `deliver_block` returns.

Total on purpose (specs §2.9): CheckTx, ProcessProposal and FinalizeBlock call into this class,
and an exception there stops a CometBFT validator (and, sent to all of them, the chain). Every
decode and ante failure is a `TxRejected` with a code; a message handler that raises anything but
a `ChainError` (a bug) fails its tx with `ErrInternal` and its writes are undone by replaying the
block without that tx's messages, so every validator reaches the same state. Only `MemoryError`,
a fact about one machine and not about the tx, is let through (the node halts rather than turn it
into a consensus decision).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from fractions import Fraction
from typing import Any

from cosmpy.crypto.address import Address
from cosmpy.crypto.keypairs import PublicKey
from cosmpy.protos.cosmos.crypto.secp256k1.keys_pb2 import PubKey as Secp256k1PubKey
from cosmpy.protos.cosmos.tx.signing.v1beta1.signing_pb2 import SignMode
from cosmpy.protos.cosmos.tx.v1beta1.tx_pb2 import AuthInfo, SignDoc, TxBody, TxRaw
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, utils
from google.protobuf.message import DecodeError

from chain import module
from chain.errors import ChainError, ErrInternal, ErrSignerMismatch
from chain.module import BlockContext, TxContext
from chain.params import DENOM, MODULE_ACCOUNT, ZERO_HASH
from chain.state import ChainState, app_hash, transfer
from protocol.amounts import parse_sdk_int
from protocol.merkle import merkle_root
from protocol.messages import DILOCO_MSGS, AnyMsg, MsgSend
from protocol.wire import WireError, from_any

SDK = "sdk"
"""Codespace of ante errors, with the Cosmos SDK's own numbers (types/errors/errors.go)."""

ERR_INTERNAL = 1  # codespace "undefined", as the SDK's errorsmod.ErrInternal
UNDEFINED = "undefined"
ERR_TX_DECODE = 2
ERR_UNAUTHORIZED = 4
ERR_INSUFFICIENT_FUNDS = 5
ERR_UNKNOWN_REQUEST = 6
ERR_INVALID_PUBKEY = 8
ERR_UNKNOWN_ADDRESS = 9
ERR_INVALID_COINS = 10
ERR_OUT_OF_GAS = 11
ERR_MEMO_TOO_LARGE = 12
ERR_INSUFFICIENT_FEE = 13
ERR_TOO_MANY_SIGNATURES = 14
ERR_NO_SIGNATURES = 15
ERR_INVALID_REQUEST = 18
ERR_MEMPOOL_FULL = 20
ERR_TX_TOO_LARGE = 21
ERR_TX_TIMEOUT_HEIGHT = 30
ERR_UNKNOWN_EXTENSION_OPTIONS = 31
ERR_WRONG_SEQUENCE = 32
ERR_INVALID_GAS_LIMIT = 41

KNOWN_TYPE_URLS = frozenset([m.type_url() for m in DILOCO_MSGS] + [MsgSend.type_url()])
SECP256K1_PUBKEY_URL = "/cosmos.crypto.secp256k1.PubKey"
SECP256K1_N = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141
BECH32_PREFIX = "gonka"
MAX_SIG_CACHE = 200_000
"""Tx hashes whose signature CheckTx verified, kept so the block need not verify them again."""


@dataclass(frozen=True)
class Limits:
    """Every bound the ante handler and block builder enforce, in one place."""

    max_tx_bytes: int = 256 * 1024
    max_memo_chars: int = 256
    max_msgs_per_tx: int = 64
    base_gas: int = 20_000
    gas_per_byte: int = 10
    gas_per_msg: int = 10_000
    max_tx_gas: int = 10_000_000
    block_max_gas: int = 200_000_000
    block_max_txs: int = 10_000
    block_max_bytes: int = 16 * 1024 * 1024


class TxRejected(Exception):
    """The ante handler (or decoder) refused a tx; nothing was written."""

    @classmethod
    def unexpected(cls, where: str, exc: BaseException, code: int = ERR_INTERNAL) -> TxRejected:
        """A check that raised something it should not have: refused all the same, with a log that
        names only the exception's type (its text may hold addresses that differ between nodes)."""
        codespace = SDK if code == ERR_TX_DECODE else UNDEFINED
        return cls(code, f"{where}: unexpected {type(exc).__name__}", codespace)

    def __init__(self, code: int, log: str, codespace: str = SDK, gas_wanted: int = 0, gas_used: int = 0):
        super().__init__(f"[{codespace}:{code}] {log}")
        self.code = code
        self.codespace = codespace
        self.log = log
        self.gas_wanted = gas_wanted
        self.gas_used = gas_used


class _HandlerFault(Exception):
    """A message handler of tx `index` raised something other than a `ChainError`."""

    def __init__(self, index: int, detail: str) -> None:
        super().__init__(detail)
        self.index = index
        self.detail = detail


@dataclass(frozen=True)
class DecodedTx:
    """What the stateless checks extracted from TxRaw bytes."""

    hash: str
    raw: bytes
    body_bytes: bytes
    auth_info_bytes: bytes
    signature: bytes
    msgs: tuple[AnyMsg, ...]
    signer: str
    pub_key: bytes | None
    sequence: int
    gas_limit: int
    fee: int
    timeout_height: int
    memo: str


@dataclass
class TxResult:
    hash: str
    height: int
    index: int
    code: int
    codespace: str
    log: str
    gas_wanted: int
    gas_used: int
    events: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """Shallow on purpose (events are already JSON): this runs for every tx of every block."""
        return {f: getattr(self, f) for f in _RESULT_FIELDS}


_RESULT_FIELDS = tuple(f.name for f in dataclasses.fields(TxResult))


@dataclass
class BlockResult:
    """A delivered block: its header (hashed), the tx bytes, their results and block events."""

    header: dict[str, Any]
    hash: str
    txs: list[bytes]
    results: list[TxResult]
    events: list[dict[str, Any]]

    @property
    def height(self) -> int:
        return int(self.header["height"])


def _fault_detail(msg: Any, exc: BaseException) -> str:
    """What a failed handler's result says: the message type and the exception's type only, the
    same on every validator (an exception's text may hold memory addresses)."""
    return f"{type(msg).__name__} handler raised {type(exc).__name__}"


def tx_hash(tx_bytes: bytes) -> str:
    """Cosmos convention: upper-case hex SHA-256 of the raw tx bytes."""
    return hashlib.sha256(tx_bytes).hexdigest().upper()


def canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def rfc3339(time_ns: int) -> str:
    seconds, nanos = divmod(time_ns, 1_000_000_000)
    return datetime.fromtimestamp(seconds, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S") + f".{nanos:09d}Z"


@functools.lru_cache(maxsize=65536)
def address_of(pub_key: bytes) -> str:
    return str(Address(PublicKey(pub_key), prefix=BECH32_PREFIX))


def event_to_json(event: Any) -> dict[str, Any]:
    """Module events in one JSON shape: {"type": str, "attributes": {key: str value}}."""
    if isinstance(event, dict):
        etype, attrs = event.get("type", ""), event.get("attributes", {})
    else:
        etype, attrs = getattr(event, "type", type(event).__name__), getattr(event, "attributes", {})
    if not isinstance(attrs, dict):
        attrs = dict(attrs)
    return {"type": str(etype), "attributes": {str(k): str(v) for k, v in attrs.items()}}


@functools.lru_cache(maxsize=65536)
def _load_key(pub_key: bytes) -> ec.EllipticCurvePublicKey:
    """Parsing a point costs as much as a third of a verification; accounts reuse their key."""
    return ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256K1(), pub_key)


def verify_signature(pub_key: bytes, message: bytes, signature: bytes) -> bool:
    """secp256k1 ECDSA over SHA-256, 64-byte r||s, low-S only (as the SDK requires)."""
    if len(signature) != 64:
        return False
    r, s = int.from_bytes(signature[:32], "big"), int.from_bytes(signature[32:], "big")
    if not (0 < r < SECP256K1_N and 0 < s <= SECP256K1_N // 2):
        return False
    try:
        key = _load_key(pub_key)
        key.verify(utils.encode_dss_signature(r, s), message, ec.ECDSA(hashes.SHA256()))
    except (InvalidSignature, ValueError):
        return False
    return True


class App:
    """The ante handler and block delivery around one `ChainState`."""

    def __init__(
        self,
        state: ChainState,
        *,
        min_gas_price: Fraction | float = 0,
        limits: Limits | None = None,
        last_block_hash: str = ZERO_HASH,
        last_time_ns: int = 0,
        committed: Callable[[], ChainState] | None = None,
    ):
        """`committed` loads the last committed state (a node's store): what a block is replayed
        from when a message handler fails. Without it the app keeps a copy of the state at the
        start of every block instead (in-process chains and tests: small states)."""
        self.state = state
        self._committed = committed
        self._faulted: dict[int, str] = {}  # this block's txs whose messages are skipped on replay
        self.chain_id = state.chain_id
        self.min_gas_price = Fraction(min_gas_price).limit_denominator(10**9)
        self.limits = limits or Limits()
        self.last_block_hash = last_block_hash
        self.last_time_ns = last_time_ns
        self._sig_verified: set[str] = set()  # tx hashes whose signature check_tx already verified
        self._delivering = False

    @property
    def height(self) -> int:
        return self.state.height

    # ------------------------------------------------------------ stateless decoding

    def gas_for(self, tx_len: int, n_msgs: int) -> int:
        """Deterministic gas meter: the same bytes always cost the same gas."""
        lim = self.limits
        return lim.base_gas + lim.gas_per_byte * tx_len + lim.gas_per_msg * n_msgs

    def required_fee(self, gas_limit: int) -> int:
        return math.ceil(gas_limit * self.min_gas_price)

    def decode(self, raw: bytes) -> DecodedTx:
        """Parse TxRaw and everything that needs no state; raises `TxRejected` and nothing else."""
        try:
            return self._decode(raw)
        except (TxRejected, MemoryError):
            raise
        except Exception as exc:  # a parser's unexpected error is still a refusal of these bytes
            raise TxRejected.unexpected("tx parse error", exc, ERR_TX_DECODE) from None

    def _decode(self, raw: bytes) -> DecodedTx:
        if not isinstance(raw, bytes | bytearray):
            raise TxRejected(ERR_TX_DECODE, "tx parse error: tx is not bytes")
        raw = bytes(raw)
        if len(raw) > self.limits.max_tx_bytes:
            raise TxRejected(
                ERR_TX_TOO_LARGE, f"tx too large: {len(raw)} bytes > max {self.limits.max_tx_bytes}"
            )
        if not raw:
            raise TxRejected(ERR_TX_DECODE, "tx parse error: empty tx bytes")
        try:
            tx_raw = TxRaw.FromString(raw)
            body = TxBody.FromString(tx_raw.body_bytes)
            auth = AuthInfo.FromString(tx_raw.auth_info_bytes)
        except (DecodeError, RuntimeWarning, ValueError, RecursionError) as exc:
            why = str(exc)[:200] or "invalid protobuf"
            raise TxRejected(ERR_TX_DECODE, f"tx parse error: {why}") from None
        if body.extension_options or body.non_critical_extension_options:
            raise TxRejected(ERR_UNKNOWN_EXTENSION_OPTIONS, "unknown extension options are not supported")
        if len(body.memo) > self.limits.max_memo_chars:
            raise TxRejected(
                ERR_MEMO_TOO_LARGE, f"memo too large: {len(body.memo)} > {self.limits.max_memo_chars}"
            )
        if not tx_raw.signatures or not auth.signer_infos:
            raise TxRejected(ERR_NO_SIGNATURES, "no signatures supplied")
        if len(tx_raw.signatures) != 1 or len(auth.signer_infos) != 1:
            raise TxRejected(ERR_TOO_MANY_SIGNATURES, "exactly one signer is supported on the devnet")
        if not body.messages:
            raise TxRejected(ERR_INVALID_REQUEST, "tx has no messages")
        if len(body.messages) > self.limits.max_msgs_per_tx:
            raise TxRejected(ERR_INVALID_REQUEST, f"too many messages: {len(body.messages)}")
        info = auth.signer_infos[0]
        if not info.mode_info.HasField("single") or info.mode_info.single.mode != SignMode.SIGN_MODE_DIRECT:
            raise TxRejected(ERR_UNAUTHORIZED, "only SIGN_MODE_DIRECT signatures are accepted")
        pub_key = self._pub_key(info.public_key) if info.HasField("public_key") else None
        msgs = tuple(self._msg(m) for m in body.messages)
        signer = msgs[0].creator
        for msg in msgs:
            if msg.creator != signer:
                raise TxRejected(
                    ErrSignerMismatch.code,
                    f"{ErrSignerMismatch.__name__}: messages have "
                    f"different signers ({signer}, {msg.creator})",
                    ErrSignerMismatch.codespace,
                )
        if len(auth.fee.amount) > 1:
            raise TxRejected(ERR_INVALID_COINS, f"invalid fee: {len(auth.fee.amount)} coins, only {DENOM}")
        fee = 0
        for coin in auth.fee.amount:
            if coin.denom != DENOM:
                raise TxRejected(ERR_INVALID_COINS, f"invalid fee denom {coin.denom[:64]!r}: only {DENOM}")
            try:  # strictly as sdk.Int: ASCII digits, at most 2^256 - 1 (never int() of any string)
                fee = parse_sdk_int(coin.amount)
            except ValueError as exc:
                raise TxRejected(ERR_INVALID_COINS, f"invalid fee: {exc}") from None
        return DecodedTx(
            hash=tx_hash(raw),
            raw=raw,
            body_bytes=tx_raw.body_bytes,
            auth_info_bytes=tx_raw.auth_info_bytes,
            signature=tx_raw.signatures[0],
            msgs=msgs,
            signer=signer,
            pub_key=pub_key,
            sequence=info.sequence,
            gas_limit=auth.fee.gas_limit,
            fee=fee,
            timeout_height=body.timeout_height,
            memo=body.memo,
        )

    @staticmethod
    def _pub_key(any_key: Any) -> bytes:
        if any_key.type_url != SECP256K1_PUBKEY_URL:
            raise TxRejected(ERR_INVALID_PUBKEY, f"unsupported public key type {any_key.type_url!r}")
        try:
            key = Secp256k1PubKey.FromString(any_key.value).key
        except DecodeError:
            raise TxRejected(ERR_INVALID_PUBKEY, "malformed secp256k1 public key") from None
        if len(key) != 33 or key[0] not in (2, 3):
            raise TxRejected(ERR_INVALID_PUBKEY, "secp256k1 public key must be 33 bytes compressed")
        try:
            _load_key(bytes(key))
        except ValueError:
            raise TxRejected(ERR_INVALID_PUBKEY, "public key is not a point on secp256k1") from None
        return bytes(key)

    @staticmethod
    def _msg(any_msg: Any) -> AnyMsg:
        if any_msg.type_url not in KNOWN_TYPE_URLS:
            raise TxRejected(ERR_UNKNOWN_REQUEST, f"unknown message type {any_msg.type_url[:128]!r}")
        try:
            return from_any(any_msg)
        except WireError as exc:
            raise TxRejected(ERR_INVALID_REQUEST, f"invalid {any_msg.type_url}: {exc}") from None

    # ------------------------------------------------------------ ante

    def ante(self, tx: DecodedTx, *, expected_sequence: int | None = None, simulate: bool = False) -> int:
        """Every stateful check, no writes; returns gas used. `expected_sequence` lets the mempool
        accept consecutive txs of one account before they are in a block. Raises `TxRejected` only."""
        try:
            return self._ante(tx, expected_sequence=expected_sequence, simulate=simulate)
        except (TxRejected, MemoryError):
            raise
        except Exception as exc:
            raise TxRejected.unexpected("ante", exc) from None

    def _ante(self, tx: DecodedTx, *, expected_sequence: int | None, simulate: bool) -> int:
        gas_used = self.gas_for(len(tx.raw), len(tx.msgs))
        if not simulate:
            if tx.gas_limit > self.limits.max_tx_gas:
                raise TxRejected(
                    ERR_INVALID_GAS_LIMIT, f"gas limit {tx.gas_limit} above max {self.limits.max_tx_gas}"
                )
            if gas_used > tx.gas_limit:
                raise TxRejected(
                    ERR_OUT_OF_GAS,
                    f"out of gas in location: ante; gasWanted: {tx.gas_limit}, "
                    f"gasUsed: {gas_used}: out of gas",
                    gas_wanted=tx.gas_limit,
                    gas_used=gas_used,
                )
            required = self.required_fee(tx.gas_limit)
            # The minimum gas price is each validator's own setting (as the SDK's min-gas-prices):
            # it admits txs to the mempool and never decides a block's result, which must be the
            # same on every validator.
            if tx.fee < required and not self._delivering:
                raise TxRejected(
                    ERR_INSUFFICIENT_FEE,
                    f"insufficient fees; got: {tx.fee}{DENOM} required: {required}{DENOM}: insufficient fee",
                )
        block_height = self.height if self._delivering else self.height + 1
        if tx.timeout_height and tx.timeout_height < block_height:
            raise TxRejected(
                ERR_TX_TIMEOUT_HEIGHT, f"tx timeout height {tx.timeout_height} < block {block_height}"
            )
        account = self.state.accounts.get(tx.signer)
        if account is None:
            raise TxRejected(ERR_UNKNOWN_ADDRESS, f"account {tx.signer} does not exist: unknown address")
        pub_key = tx.pub_key
        if account.pub_key is not None:
            if pub_key is not None and pub_key.hex() != account.pub_key:
                raise TxRejected(ERR_INVALID_PUBKEY, f"public key does not match account {tx.signer}")
            pub_key = bytes.fromhex(account.pub_key)
        elif pub_key is None:
            raise TxRejected(ERR_INVALID_PUBKEY, f"account {tx.signer} has no public key yet: include it")
        if address_of(pub_key) != tx.signer:
            raise TxRejected(ERR_INVALID_PUBKEY, f"public key does not hash to signer {tx.signer}")
        expected = account.sequence if expected_sequence is None else expected_sequence
        if tx.sequence != expected:
            raise TxRejected(
                ERR_WRONG_SEQUENCE,
                f"account sequence mismatch, expected {expected}, "
                f"got {tx.sequence}: incorrect account sequence",
            )
        if not simulate and tx.hash not in self._sig_verified:
            sign_doc = SignDoc(
                body_bytes=tx.body_bytes,
                auth_info_bytes=tx.auth_info_bytes,
                chain_id=self.chain_id,
                account_number=account.number,
            ).SerializeToString()
            if not verify_signature(pub_key, sign_doc, tx.signature):
                raise TxRejected(
                    ERR_UNAUTHORIZED,
                    f"signature verification failed; please verify account "
                    f"number ({account.number}) and chain-id ({self.chain_id}): unauthorized",
                )
        if account.balance < tx.fee:
            raise TxRejected(
                ERR_INSUFFICIENT_FUNDS,
                f"{account.balance}{DENOM} is smaller than {tx.fee}{DENOM}: insufficient funds",
            )
        return gas_used

    def check_tx(self, raw: bytes, pending_sequences: Mapping[str, int] | None = None) -> DecodedTx:
        """Mempool admission (CheckTx): decode plus ante against the committed state; a signer
        with txs already in the mempool must continue from `pending_sequences[signer]`."""
        tx = self.decode(raw)
        expected = pending_sequences.get(tx.signer) if pending_sequences else None
        self.ante(tx, expected_sequence=expected)
        if len(self._sig_verified) >= MAX_SIG_CACHE:  # txs that never reached a block: start over
            self._sig_verified.clear()
        self._sig_verified.add(tx.hash)
        return tx

    def forget(self, tx_hash_hex: str) -> None:
        """Drop the signature-cache entry of a tx that left the mempool without a block."""
        self._sig_verified.discard(tx_hash_hex)

    def simulate(self, raw: bytes) -> tuple[int, list[dict[str, Any]]]:
        """Gas estimate as the SDK's simulate: ante without signature/fee checks, msgs on a copy."""
        tx = self.decode(raw)
        gas = self.ante(tx, simulate=True)
        scratch = copy.deepcopy(self.state)
        ctx = TxContext(height=self.height + 1, time_ns=self.last_time_ns, tx_hash=tx.hash, signer=tx.signer)
        events: list[dict[str, Any]] = []
        try:
            for msg in tx.msgs:
                events += [event_to_json(e) for e in module.process_msg(scratch, msg, ctx)]
        except ChainError as exc:
            raise TxRejected(exc.code, exc.log, exc.codespace) from None
        except MemoryError:
            raise
        except Exception as exc:  # a handler bug: the simulation fails as the delivery would
            err = ErrInternal(_fault_detail(msg, exc))
            raise TxRejected(err.code, err.log, err.codespace) from None
        return gas, events

    # ------------------------------------------------------------ delivery

    def deliver_tx(self, raw: bytes, index: int, time_ns: int) -> TxResult:
        height = self.height
        result = TxResult(
            hash=tx_hash(raw),
            height=height,
            index=index,
            code=0,
            codespace="",
            log="",
            gas_wanted=0,
            gas_used=0,
        )
        try:
            tx = self.decode(raw)
            result.gas_wanted = tx.gas_limit
            result.gas_used = self.ante(tx)
        except TxRejected as exc:
            result.code, result.codespace, result.log = exc.code, exc.codespace, exc.log
            return result
        finally:
            self._sig_verified.discard(result.hash)
        account = self.state.accounts[tx.signer]
        if account.pub_key is None:
            account.pub_key = tx.pub_key.hex() if tx.pub_key else None
        account.sequence += 1
        if tx.fee:
            transfer(self.state, tx.signer, MODULE_ACCOUNT, tx.fee)
        result.events.append(
            {
                "type": "tx",
                "attributes": {
                    "signer": tx.signer,
                    "fee": f"{tx.fee}{DENOM}",
                    "acc_seq": f"{tx.signer}/{tx.sequence}",
                },
            }
        )
        ctx = TxContext(height=height, time_ns=time_ns, tx_hash=result.hash, signer=tx.signer)
        if index in self._faulted:  # replayed after its handler failed: the ante's writes only
            err = ErrInternal(self._faulted[index])
            result.code, result.codespace, result.log = err.code, err.codespace, err.log
            return result
        snapshot = copy.deepcopy(self.state) if len(tx.msgs) > 1 else None
        msg_events: list[dict[str, Any]] = []
        try:
            for msg in tx.msgs:
                msg_events += [event_to_json(e) for e in module.process_msg(self.state, msg, ctx)]
        except ChainError as exc:
            if snapshot is not None:
                self._restore(snapshot)
            result.code, result.codespace, result.log = exc.code, exc.codespace, exc.log
            return result
        except MemoryError:
            raise
        except Exception as exc:  # a handler bug, maybe after some writes: replay without it
            raise _HandlerFault(index, _fault_detail(msg, exc)) from exc
        result.events += msg_events
        return result

    def _restore(self, snapshot: ChainState) -> None:
        """Put back the pre-msgs state while keeping the ante's writes (fee, sequence) applied."""
        self.state.__dict__.update(snapshot.__dict__)

    def _rewind(self, before: ChainState | None) -> None:
        """Back to the state this block started from (the committed one), in place: what holds a
        reference to `self.state` keeps seeing the app's state."""
        fresh = self._committed() if self._committed is not None else copy.deepcopy(before)
        assert fresh is not None
        self.state.__dict__.clear()
        self.state.__dict__.update(fresh.__dict__)

    def deliver_block(
        self,
        txs: list[bytes],
        time_ns: int,
        *,
        block_hash: str | None = None,
        extra_header: dict[str, Any] | None = None,
    ) -> BlockResult:
        """begin_block, every tx in order, end_block, then the header committing to it all.

        The embedded node derives the block hash from the header; under CometBFT the hash (and the
        time) come from the consensus engine's header and are passed in (`block_hash`), and
        `extra_header` records engine facts (proposer, absent validators) next to ours.
        """
        time_ns = max(time_ns, self.last_time_ns + 1)
        height = self.height + 1
        ctx = BlockContext(height=height, time_ns=time_ns, prev_block_hash=self.last_block_hash)
        before = copy.deepcopy(self.state) if self._committed is None else None
        self._faulted = {}
        while True:
            events = [event_to_json(e) for e in (module.begin_block(self.state, ctx) or [])]
            self._delivering = True
            try:
                results = [self.deliver_tx(raw, i, time_ns) for i, raw in enumerate(txs)]
                break
            except _HandlerFault as fault:  # undo everything, then deliver again without its messages
                self._faulted[fault.index] = fault.detail
                self._rewind(before)
            finally:
                self._delivering = False
        self._faulted = {}
        events += [event_to_json(e) for e in module.end_block(self.state, ctx)]
        header = {
            "chain_id": self.chain_id,
            "height": height,
            "time": rfc3339(time_ns),
            "time_ns": time_ns,
            "prev_block_hash": self.last_block_hash,
            "txs_root": merkle_root([bytes.fromhex(r.hash) for r in results]).hex() if results else ZERO_HASH,
            "results_hash": hashlib.sha256(canonical([r.to_json() for r in results] + events)).hexdigest(),
            "app_hash": app_hash(self.state).hex(),
            **(extra_header or {}),
        }
        block_hash = block_hash or hashlib.sha256(canonical(header)).hexdigest()
        self.last_block_hash, self.last_time_ns = block_hash, time_ns
        return BlockResult(header=header, hash=block_hash, txs=list(txs), results=results, events=events)
