"""The adversary library: dishonest hosts and verifiers, by name, for tests, the devnet and benches.

`resolve_host("lazy", {"fraction": 0.5})` gives a `HostAdversary` (a `trainer.behaviour.HostBehaviour`);
`resolve_verifier("malicious", {})` a `verifier.behaviour.VerifierBehaviour`. Unknown names or
parameters are a `UnknownBehaviour` error naming what exists, never a crash deep in a node.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

from gonka_diloco.adversaries.hosts import HOSTS, HostAdversary, describe
from gonka_diloco.adversaries.verifiers import VERIFIERS
from trainer.behaviour import HostBehaviour
from verifier.behaviour import VerifierBehaviour


class UnknownBehaviour(ValueError):
    """A behaviour name that is not in the library, or parameters it does not take."""


Table = Mapping[str, Callable[..., Any]]


def _make(kind: str, table: Table, name: str, params: Mapping[str, Any] | None) -> Any:
    factory = table.get(name)
    if factory is None:
        raise UnknownBehaviour(f"unknown {kind} behaviour {name!r}; known: {', '.join(sorted(table))}")
    try:
        return factory(**dict(params or {}))
    except TypeError as e:
        sig = inspect.signature(factory)
        raise UnknownBehaviour(f"{kind} behaviour {name!r} takes {sig}, got {dict(params or {})}: {e}") from e
    except ValueError as e:
        raise UnknownBehaviour(f"{kind} behaviour {name!r}: {e}") from e


def resolve_host(name: str, params: Mapping[str, Any] | None = None) -> HostBehaviour:
    return _make("host", HOSTS, name, params)


def resolve_verifier(name: str, params: Mapping[str, Any] | None = None) -> VerifierBehaviour:
    return _make("verifier", VERIFIERS, name, params)


def _params(factory: Callable[..., Any]) -> str:
    ps = [
        f"{p.name}={p.default!r}"
        for p in inspect.signature(factory).parameters.values()
        if p.kind is not p.VAR_KEYWORD and p.kind is not p.VAR_POSITIONAL
    ]
    return f"({', '.join(ps)})" if ps else ""


def listing() -> str:
    """One line per behaviour with its parameters: the text `--help` shows."""
    lines = ["host behaviours:"]
    for table, title in ((HOSTS, None), (VERIFIERS, "verifier behaviours:")):
        if title:
            lines.append(title)
        for name, cls in table.items():
            lines.append(f"  {name}{_params(cls)}: {describe(cls)}")
    return "\n".join(lines)


__all__ = [
    "HOSTS", "VERIFIERS", "HostAdversary", "UnknownBehaviour", "listing", "resolve_host", "resolve_verifier",
]
