"""Single flight: work named by what it produces runs once at a time within a process.

Two threads of one node that need the same object (the training loop and a step's tail both
asking for G_n; a verifier's jobs sharing an opened state) must not fetch it twice — at 30B a
global model is 240 GB — nor write the same part file. The first caller runs the work; callers
that arrive while it runs wait for it and share its result. Once it is over the key is free
again, so a failure never poisons a later attempt.

A failure is shared only with waiters it speaks for. Callers name the sources their work would
use (a fetch's holders); a waiter whose flight failed and that has a source the flight did not
try runs again — leading its own flight if none is running — because its own sources may well
succeed. Otherwise one caller listing only a peer serving garbage would fail every thread of the
node that asked for the same object with an honest holder (issue 36).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass
class _Call(Generic[T]):
    sources: frozenset[Hashable]
    done: threading.Event = field(default_factory=threading.Event)
    value: T | None = None
    error: BaseException | None = None
    waiters: int = 0


class SingleFlight:
    """`do(key, fn, sources)` → (fn's result, whether it was shared with a call already running).

    `on_wait(key)` is called each time a caller starts waiting on a running flight: tests order
    their threads on it instead of sleeping."""

    def __init__(self, on_wait: Callable[[Hashable], None] | None = None) -> None:
        self._lock = threading.Lock()
        self._calls: dict[Hashable, _Call[object]] = {}
        self._on_wait = on_wait

    def do(self, key: Hashable, fn: Callable[[], T], sources: Iterable[Hashable] = ()) -> tuple[T, bool]:
        """Run `fn` for `key`, or share the result of the call already running. A shared failure
        is raised only if that call had every one of `sources` (no sources: always shared);
        otherwise this caller tries again."""
        mine = frozenset(sources)
        while True:
            with self._lock:
                call = self._calls.get(key)
                if call is None:
                    call = self._calls[key] = _Call(mine)
                    break
                call.waiters += 1
            if self._on_wait is not None:
                self._on_wait(key)
            call.done.wait()
            if call.error is None:
                return call.value, True  # type: ignore[return-value]
            if mine <= call.sources:
                raise call.error
        try:
            call.value = fn()
        except BaseException as e:
            call.error = e
            raise
        finally:
            with self._lock:
                del self._calls[key]
            call.done.set()
        return call.value, False

    def running(self, key: Hashable) -> bool:
        with self._lock:
            return key in self._calls


FLIGHTS = SingleFlight()
"""The process's one registry: stores on the same root share it (keys name the root)."""

__all__ = ["FLIGHTS", "SingleFlight"]
