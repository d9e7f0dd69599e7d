"""Amounts on the wire: decimal strings, parsed strictly as Cosmos' `sdk.Int` bounds them.

A tx carries its fee and a bank send's coins as decimal strings. `int()` and `str.isdigit()`
accept what no Cosmos chain does: other scripts' digits (Arabic-Indic digits pass `isdigit`, and
`int()` reads them), signs, spaces and underscores ("1_000"), and strings long enough for `int()`
to raise (over 4300 digits). Every amount string the chain reads goes through `parse_sdk_int`, so
the same bytes give the same number, or the same refusal, on every validator.
"""

from __future__ import annotations

MAX_AMOUNT = (1 << 256) - 1
"""The largest amount: `sdk.Int` holds at most 256 bits."""
MAX_AMOUNT_DIGITS = len(str(MAX_AMOUNT))
"""78: the digits of 2^256 − 1, the longest amount string accepted."""


def parse_sdk_int(text: str) -> int:
    """1 to 78 ASCII digits, at most 2^256 − 1 (leading zeros allowed, as `sdk.Int`'s parser does);
    `ValueError` naming the text otherwise."""
    if not isinstance(text, str):
        raise ValueError(f"amount must be a decimal string, not {type(text).__name__}")
    if not 0 < len(text) <= MAX_AMOUNT_DIGITS or not all("0" <= c <= "9" for c in text):
        raise ValueError(f"amount {text[:40]!r} is not 1 to {MAX_AMOUNT_DIGITS} ASCII digits")
    value = int(text)
    if value > MAX_AMOUNT:
        raise ValueError(f"amount {text[:20]}… exceeds 2^256 - 1")
    return value
