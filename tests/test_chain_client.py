"""The client API over the in-process chain: same App, real signatures, test-controlled blocks."""

from __future__ import annotations

import threading

import httpx
import pytest

from chain.client import (
    ERR_TX_IN_CACHE,
    RESUBMIT_SECONDS,
    ChainTimeout,
    HttpChainClient,
    TxFailed,
    TxResult,
    sign_tx,
)
from chain.inprocess import InProcessChain
from chain.node import DEV_BALANCE
from chain.params import MODULE_ACCOUNT
from protocol.keys import test_wallet
from protocol.messages import Coin, MsgSend


def _send(sender: int, to: int, amount: int) -> MsgSend:
    return MsgSend(
        from_address=str(test_wallet(sender).address()),
        to_address=str(test_wallet(to).address()),
        amount=[Coin(amount=amount)],
    )


def test_broadcast_moves_tokens_and_pays_fee_to_module_account() -> None:
    chain = InProcessChain()
    a, b = str(test_wallet(1).address()), str(test_wallet(2).address())
    result = chain.broadcast(test_wallet(1), [_send(1, 2, 1000)])
    assert result.ok and result.height == 1 == chain.height()
    fee = chain.balance(MODULE_ACCOUNT)
    assert fee > 0
    assert chain.balance(b) == DEV_BALANCE + 1000
    assert chain.balance(a) == DEV_BALANCE - 1000 - fee
    assert chain.state.accounts[a].sequence == 1
    assert chain.state.accounts[a].pub_key == test_wallet(1).public_key().public_key_bytes.hex()


def test_failed_msg_raises_with_code_and_keeps_fee_and_sequence() -> None:
    chain = InProcessChain()
    with pytest.raises(TxFailed) as info:
        chain.broadcast(test_wallet(1), [_send(1, 2, DEV_BALANCE + 1)])
    assert (info.value.codespace, info.value.code) == ("diloco", 5)
    assert info.value.height == 1
    a = chain.state.accounts[str(test_wallet(1).address())]
    assert a.sequence == 1 and a.balance < DEV_BALANCE
    assert chain.broadcast(test_wallet(1), [_send(1, 2, 1)]).ok


def test_multi_msg_tx_is_atomic() -> None:
    chain = InProcessChain()
    b_before = chain.balance(str(test_wallet(2).address()))
    with pytest.raises(TxFailed):
        chain.broadcast(test_wallet(1), [_send(1, 2, 500), _send(1, 3, DEV_BALANCE * 2)])
    assert chain.balance(str(test_wallet(2).address())) == b_before  # first msg rolled back
    assert chain.broadcast(test_wallet(1), [_send(1, 2, 500), _send(1, 3, 7)]).ok
    assert chain.balance(str(test_wallet(2).address())) == b_before + 500


def test_msg_signed_for_someone_else_is_refused_at_broadcast() -> None:
    chain = InProcessChain()
    with pytest.raises(TxFailed) as info:
        chain.broadcast(test_wallet(1), [_send(2, 1, 5)])
    assert info.value.code == 8  # the signing key does not hash to the msg's creator
    assert chain.height() == 0


def test_sequence_mismatch_is_recovered_by_refetching() -> None:
    chain = InProcessChain()
    w = test_wallet(1)
    assert chain.broadcast(w, [_send(1, 2, 1)]).ok
    # someone else (another process with the same key) uses sequence 1 behind the client's back
    number = chain.state.accounts[str(w.address())].number
    raw = sign_tx(
        w,
        [_send(1, 2, 2)],
        chain_id=chain.chain_id,
        account_number=number,
        sequence=1,
        gas_limit=200_000,
        fee=200_000,
    )
    assert chain.submit_raw(raw)[1] == 0
    chain.produce_block()
    assert chain.broadcast(w, [_send(1, 2, 3)]).ok  # cached sequence 1 is stale: refetched, re-signed


def test_concurrent_broadcasts_from_one_wallet_all_land() -> None:
    chain = InProcessChain(auto=False)
    w = test_wallet(7)
    results, errors = [], []

    def send(i: int) -> None:
        try:
            results.append(chain.broadcast(w, [_send(7, 8, i + 1)], timeout=20))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=send, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        chain.produce_block()
        for t in threads:
            t.join(0.01)
    assert not errors and len(results) == 6
    assert chain.state.accounts[str(w.address())].sequence == 6
    assert chain.balance(str(test_wallet(8).address())) == DEV_BALANCE + sum(range(1, 7))


def test_wait_for_block_is_event_driven_and_times_out_without_blocks() -> None:
    chain = InProcessChain(auto=False)
    with pytest.raises(ChainTimeout):
        chain.wait_for_block(0, timeout=0.05)
    got = []
    waiter = threading.Thread(target=lambda: got.append(chain.wait_for_block(0, timeout=10)))
    waiter.start()
    produced = chain.produce_block()
    waiter.join(10)
    assert got and got[0].height == 1 and got[0].hash == produced.hash


def test_auto_chain_produces_blocks_on_demand_and_follow_walks_them() -> None:
    chain = InProcessChain()
    nxt = chain.follow(0)
    heights = [nxt().height for _ in range(3)]
    assert heights == [1, 2, 3]
    assert chain.advance(2).height == 5
    assert chain.blocks[1].prev_block_hash == chain.blocks[0].hash


def test_queries_by_name() -> None:
    chain = InProcessChain()
    assert chain.params()["denom"] == "ngonka"
    with pytest.raises(KeyError):
        chain.query("no_such_query")


def test_same_blocks_give_same_app_hash() -> None:
    """The same tx bytes (ECDSA signatures differ per signing, and block hashes enter the state's
    randomness ring, so "the same blocks" means the same bytes) give the same app hashes."""
    a, b = InProcessChain(auto=False), InProcessChain(auto=False)
    a.broadcast(test_wallet(3), [_send(3, 4, 9)], wait=False)
    (raw,) = [tx.raw for tx in a._mempool.values()]
    assert b.submit_raw(raw)[1] == 0
    for chain in (a, b):
        chain.advance(2)
    assert [x.hash for x in a.blocks] == [x.hash for x in b.blocks]
    assert [x.app_hash for x in a.blocks] == [x.app_hash for x in b.blocks]


class _RestartingNode(HttpChainClient):
    """A client whose node is down for the first wait, then back with an empty mempool: the tx is
    found only once it was submitted again."""

    def __init__(self) -> None:
        super().__init__("http://127.0.0.1:9")
        self.waits: list[float] = []
        self.submits = 0

    def wait_for_tx(self, tx_hash: str, timeout: float = 30.0) -> TxResult:
        self.waits.append(timeout)
        if len(self.waits) == 1:
            raise httpx.ConnectError("connection refused")  # down through the client's own retries
        if self.submits == 0:
            raise ChainTimeout("not in a block")  # back, but the tx was lost with the mempool
        return TxResult(hash=tx_hash, height=7, code=0, codespace="", log="", gas_wanted=1, gas_used=1)

    def _submit(self, tx_bytes: bytes) -> tuple[str, int, str, str]:
        self.submits += 1
        return "h", ERR_TX_IN_CACHE, "sdk", ""


def test_a_tx_lost_in_a_chain_restart_is_resubmitted_within_a_second() -> None:
    client = _RestartingNode()
    try:
        result = client._wait_resubmitting(b"tx", "h", timeout=30.0)
    finally:
        client.close()
    assert result.height == 7 and client.submits >= 1
    assert max(client.waits) <= RESUBMIT_SECONDS == 1.0  # every slice ends in a resubmission

    class Broken(_RestartingNode):
        def wait_for_tx(self, tx_hash: str, timeout: float = 30.0) -> TxResult:
            raise ValueError("not a transport failure")

    broken = Broken()
    with pytest.raises(ValueError, match="not a transport failure"):
        broken._wait_resubmitting(b"tx", "h", timeout=30.0)
    broken.close()
