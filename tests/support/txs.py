"""Signed txs for the tx-path tests: a dev genesis with funded test wallets, an honest MsgSend from
one of them (`send_tx`) and issue 23's poison tx (`poison_fee_tx`), for the in-process fuzzer and
the real validators alike; and the app tests' eight-wallet genesis (`APP_GENESIS`) with a MsgSend
signed against an `App`'s state, every ante-checked field settable (`app_send_tx`)."""

from __future__ import annotations

from cosmpy.protos.cosmos.tx.v1beta1.tx_pb2 import AuthInfo, TxRaw

from chain.app import App
from chain.client import sign_tx
from chain.genesis import genesis_state
from chain.node import dev_genesis
from protocol.keys import test_wallet
from protocol.messages import Coin, MsgSend

GENESIS = dev_genesis(6)
CHAIN_ID = GENESIS.chain_id
WALLETS = [test_wallet(i) for i in range(6)]
ADDRESSES = [str(w.address()) for w in WALLETS]
NUMBERS = {a: genesis_state(GENESIS).accounts[a].number for a in ADDRESSES}

APP_GENESIS = dev_genesis(8)
"""Eight funded wallets for the app tests: shared so the store tests open on the genesis they sign for."""


def poison_fee_tx(digits: str = "\u00b2\u2070\u2070\u2070\u2070\u2070") -> bytes:
    """Issue 23's tx: a MsgSend whose fee amount is "²⁰⁰⁰⁰⁰", superscript digits: `str.isdigit()`
    accepts them and `int()` raises ValueError (Arabic-Indic digits, which `int()` reads, were the
    other half: a second implementation refusing them would fork)."""
    raw = send_tx(1, 0)
    tx = TxRaw.FromString(raw)
    auth = AuthInfo.FromString(tx.auth_info_bytes)
    auth.fee.amount[0].amount = digits
    tx.auth_info_bytes = auth.SerializeToString()
    return tx.SerializeToString()


def send_tx(sender: int, seq: int, amount: int = 5) -> bytes:
    """A valid signed MsgSend from wallet `sender` to wallet 2: the honest tx next to the poisons,
    and the well-formed bytes the fuzzers mangle."""
    w = WALLETS[sender]
    msg = MsgSend(from_address=ADDRESSES[sender], to_address=ADDRESSES[2], amount=[Coin(amount=amount)])
    return sign_tx(w, [msg], chain_id=CHAIN_ID, account_number=NUMBERS[ADDRESSES[sender]], sequence=seq,
                   gas_limit=400_000, fee=400_000)  # fmt: skip


def app_send_tx(
    app: App,
    sender: int = 1,
    seq: int = 0,
    *,
    gas: int = 200_000,
    fee: int = 200_000,
    memo: str = "",
    amount: int = 5,
) -> bytes:
    """A signed MsgSend from wallet `sender` to wallet 2, numbered from `app`'s state: shared by the
    ante-handler tests (each field settable to trip one check) and the store tests (a busy block)."""
    w = test_wallet(sender)
    number = app.state.accounts[str(w.address())].number
    msg = MsgSend(
        from_address=str(w.address()), to_address=str(test_wallet(2).address()), amount=[Coin(amount=amount)]
    )
    return sign_tx(
        w,
        [msg],
        chain_id=app.chain_id,
        account_number=number,
        sequence=seq,
        gas_limit=gas,
        fee=fee,
        memo=memo,
    )
