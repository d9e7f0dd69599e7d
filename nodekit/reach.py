"""Start-up of both nodes: wait (bounded) for the chain to answer, then for the run to exist.

A node started before its chain (a devnet coming up, a validator restarting) or before its run
(the operator starts the nodes, then sends `run create`) should wait, say so once with the URL it
is waiting on, and either go on or fail with one line naming that URL, never a traceback nor a
retry loop that never says where it is looking. Hosts and verifiers call `reach` once, before
anything else touches the chain, so both wait the same way.
"""

from __future__ import annotations

import contextlib
import errno
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from chain.client import ChainClient, ChainClientError, EndpointUnavailable, HttpChainClient

Log = Callable[..., None]
"""`log(event, **fields)`: the node's own logger."""

DEFAULT_CHAIN_WAIT = 60.0
"""Seconds a node waits for an unreachable chain before it gives up: long enough for a chain
process that is still importing on a loaded machine, short enough that a wrong URL is a clear
error within a minute."""


class Unreachable(ChainClientError):
    """The chain did not answer within the start-up wait; the message names its URL."""


class NoSuchRun(ChainClientError):
    """The run does not exist on the chain (and the node was not asked to wait for it)."""


@dataclass(frozen=True)
class Reach:
    """How a node waits at start-up: `chain_wait` seconds for the chain, and for the run
    either not at all (`wait_for_run=False`: a missing run is an error) or until it appears."""

    chain_wait: float = DEFAULT_CHAIN_WAIT
    wait_for_run: bool = False


def chain_url(chain: Any) -> str:
    """What a message should name: the client's endpoint(s), or its kind for an in-process one."""
    urls = getattr(chain, "urls", None)
    return ",".join(urls) if urls else type(chain).__name__


def transient(e: BaseException) -> bool:
    """A failure to reach the chain (refused, reset, DNS, timeout, 5xx), as opposed to an answer.
    cosmpy's requests errors are OSErrors."""
    return isinstance(e, httpx.TransportError | OSError | EndpointUnavailable)


class _Probe(HttpChainClient):
    """One try per endpoint (the node's own client retries for ≈ 7 s before it raises): the wait
    below does the retrying, so it can log and give up on its own schedule."""

    ROUNDS = 1


def probe_height(chain: ChainClient) -> int:
    """The chain's height, asked once."""
    if not isinstance(chain, HttpChainClient):
        return chain.height()
    probe = _Probe(chain.urls, timeout=5.0)
    try:
        return probe.height()
    finally:
        probe.close()


def _why(e: BaseException) -> str:
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {text}"[:200]


def wait_for_chain(
    chain: ChainClient, *, timeout: float, log: Log, stop: threading.Event, interval: float = 2.0
) -> int:
    """The chain's height once it answers; `Unreachable` after `timeout` seconds without one.
    Logs `waiting_for_chain` (with the URL) once when the first try fails; `stop` raises
    `nodekit.chainview.Stopped`."""
    from nodekit.chainview import Stopped

    deadline = time.monotonic() + timeout
    url, said = chain_url(chain), False
    while True:
        try:
            return probe_height(chain)
        except Exception as e:
            if not transient(e):
                raise
            error = e
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise Unreachable(
                f"cannot reach the chain at {url} (chain_url) within {timeout:g} s: {_why(error)}"
            ) from None
        if not said:
            log("waiting_for_chain", url=url, timeout_s=timeout, error=_why(error))
            said = True
        if stop.wait(min(interval, remaining)):
            raise Stopped


def run_exists(chain: ChainClient, run_id: int) -> bool:
    return any(int(r["run_id"]) == run_id for r in chain.query("runs")["runs"])


def wait_for_run(
    chain: ChainClient, run_id: int, *, wait: bool, log: Log, stop: threading.Event, poll: float = 10.0
) -> None:
    """Return once run `run_id` exists; without `wait`, a missing run is `NoSuchRun` at once.
    With `wait`, logs `waiting_for_run` once and re-reads the run list after every block."""
    from chain.client import ChainTimeout
    from nodekit.chainview import Stopped

    if run_exists(chain, run_id):
        return
    url = chain_url(chain)
    if not wait:
        raise NoSuchRun(
            f"run {run_id} (run_id) does not exist on the chain at {url}: create it first "
            "(`gonka-diloco run create`), or start the node with --wait to wait for it"
        )
    log("waiting_for_run", run_id=run_id, url=url)
    height = chain.height()
    while not run_exists(chain, run_id):
        if stop.is_set():
            raise Stopped
        with contextlib.suppress(ChainTimeout):
            height = chain.wait_for_block(height, timeout=poll).height


def reach(chain: ChainClient, run_id: int, how: Reach, *, log: Log, stop: threading.Event) -> None:
    """Both nodes' first step: the chain answers, then the run exists (or the node waited for it)."""
    wait_for_chain(chain, timeout=how.chain_wait, log=log, stop=stop)
    wait_for_run(chain, run_id, wait=how.wait_for_run, log=log, stop=stop)


# ---------------------------------------------------------------- one line for the command line


def listen_error(e: OSError, listen: str, config: Path) -> str | None:
    """The line for a `listen` address this machine cannot bind (taken, not its own, privileged)."""
    if e.errno not in (errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES):
        return None
    return f"{config}: listen = {listen!r}: cannot listen there ({e.strerror})"


def chain_error(e: BaseException, url: str, config: Path) -> str | None:
    """The line for a chain that cannot be reached, at start-up or gone mid-run (None: not that)."""
    if isinstance(e, Unreachable | NoSuchRun):
        return f"{config}: {e}"
    if transient(e):
        return f"{config}: the chain at {url} (chain_url) stopped answering: {_why(e)}"
    return None
