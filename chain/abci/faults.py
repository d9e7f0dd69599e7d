"""Test-only altered state machines: what a validator running modified software looks like.

`GONKA_DILOCO_TEST_FAULT=<name>` in a validator's environment swaps its `App` for one with one rule
changed. Its app hash then differs from the honest validators' at the first block the rule
touches; CometBFT refuses the next block's header (wrong AppHash) and stops that node, and the
validator's REST answers 503 instead of serving its state. Never set outside tests.
"""

from __future__ import annotations

import os

from chain.app import App, TxRejected, TxResult
from chain.params import MODULE_ACCOUNT
from chain.state import balance_of, transfer

FAULT_ENV = "GONKA_DILOCO_TEST_FAULT"


class FreeFeesApp(App):
    """Refunds the fee of every successful tx: the ante's fee rule altered, everything else honest."""

    def deliver_tx(self, raw: bytes, index: int, time_ns: int) -> TxResult:
        result = super().deliver_tx(raw, index, time_ns)
        if result.code == 0:
            try:
                tx = self.decode(raw)
            except TxRejected:
                return result
            if tx.fee and balance_of(self.state, MODULE_ACCOUNT) >= tx.fee:
                transfer(self.state, MODULE_ACCOUNT, tx.signer, tx.fee)
        return result


FAULTS: dict[str, type[App]] = {"free-fees": FreeFeesApp}


def app_class(name: str | None = None) -> type[App]:
    """The App to run: the honest one unless a known fault is named (here or in the environment)."""
    name = name if name is not None else os.environ.get(FAULT_ENV, "")
    if not name:
        return App
    if name not in FAULTS:
        raise ValueError(f"unknown test fault {name!r}; known: {', '.join(sorted(FAULTS))}")
    return FAULTS[name]
