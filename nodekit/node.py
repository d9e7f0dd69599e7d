"""What a host node and a verifier node both do with the chain: join a run, find hosts, log.

Both nodes follow the same run the same way; keeping these pieces in one place keeps their rules
(one role per address, endpoints from the chain's participant list) from drifting apart.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from cosmpy.aerial.wallet import LocalWallet

from chain.client import ChainClient, TxFailed
from nodekit.chainview import Stopped
from protocol.messages import MsgJoinRun, Role

__all__ = ["NodeError", "Stopped", "host_endpoints", "join_run", "json_line", "participant"]


class NodeError(RuntimeError):
    """The node cannot go on (wrong run or role, mismatched thread count or dataset, lost state)."""


def json_line(event: dict[str, Any]) -> None:
    """The default log sink: one JSON object per line on stdout (what the devnet reads)."""
    sys.stdout.write(json.dumps(event, default=str) + "\n")
    sys.stdout.flush()


def participant(chain: ChainClient, run_id: int, address: str) -> dict[str, Any] | None:
    parts = chain.query("participants", run_id=run_id)["participants"]
    return next((p for p in parts if p["address"] == address), None)


def join_run(
    chain: ChainClient,
    wallet: LocalWallet,
    run_id: int,
    role: Role,
    endpoint: str,
    stake: int,
    replay_class: str = "",
) -> dict[str, Any] | None:
    """Bond and join unless already in: returns the existing participant record, or None if it
    joined now. A verifier declares its `replay_class` (what bitwise draws prefer, specs §6.1)."""
    address = str(wallet.address())
    me = participant(chain, run_id, address)
    if me is not None:
        if me["role"] != role.value:
            raise NodeError(f"{address} is a {me['role']} in run {run_id}")
        return me
    msg = MsgJoinRun(
        creator=address, run_id=run_id, role=role, endpoint=endpoint, stake=stake, replay_class=replay_class
    )
    try:
        chain.broadcast(wallet, [msg])
    except TxFailed as e:
        raise NodeError(f"joining run {run_id} was refused: {e.log}") from e
    return None


def host_endpoints(chain: ChainClient, run_id: int, exclude: str | None = None) -> list[str]:
    """Blob endpoints of the run's hosts (other than `exclude`), as the chain records them."""
    parts = chain.query("participants", run_id=run_id)["participants"]
    return [p["endpoint"] for p in parts if p["role"] == Role.HOST.value and p["address"] != exclude]
