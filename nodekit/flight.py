"""Single flight: work named by what it produces runs once at a time within a process.

Two threads of one node that need the same object (the training loop and a step's tail both
asking for G_n; a verifier's jobs sharing an opened state) must not fetch it twice — at 30B a
global model is 240 GB — nor write the same part file. The first caller runs the work; callers
that arrive while it runs wait for it and share its result, or its exception. Once it is over
the key is free again, so a failure never poisons a later attempt.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass
class _Call(Generic[T]):
    done: threading.Event = field(default_factory=threading.Event)
    value: T | None = None
    error: BaseException | None = None
    waiters: int = 0


class SingleFlight:
    """`do(key, fn)` → (fn's result, whether it was shared with a call already running)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: dict[Hashable, _Call[object]] = {}

    def do(self, key: Hashable, fn: Callable[[], T]) -> tuple[T, bool]:
        with self._lock:
            call = self._calls.get(key)
            leader = call is None
            if call is None:
                call = self._calls[key] = _Call()
            else:
                call.waiters += 1
        if not leader:
            call.done.wait()
            if call.error is not None:
                raise call.error
            return call.value, True  # type: ignore[return-value]
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
