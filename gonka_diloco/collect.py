"""Build a report `Snapshot` from what a chain and its nodes say over HTTP.

Everything comes from public interfaces — the module's JSON queries, the block stream and each
node's `/status` — so `gonka-diloco report <chain URL>` can describe any run, not only one this
process started. Node names are optional: a devnet passes its own (host-0, verifier-1, …); a
bare chain URL gets short addresses.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from gonka_diloco.report import (
    UNKNOWN,
    ChainStats,
    ContributionRow,
    NodeRow,
    Snapshot,
    StepRow,
    ValidatorRow,
)

MAX_STATUS_BYTES = 1 << 20
MAX_DELTA_BYTES = 64 << 20
MAX_SCAN_BLOCKS = 20_000
"""A report scans every block for txs, slashes and rewards; beyond this it gives up on the counts."""

REASONS = {
    0: "ACCEPT",
    1: "BAD_PROOF",
    2: "WRONG_START",
    3: "REPLAY_MISMATCH",
    4: "DELTA_MISMATCH",
    5: "MISSING_DATA",
    6: "MALFORMED_BLOB",
    7: "BAD_TOKENS",
    8: "BAD_ENVIRONMENT",
}


class Chain(Protocol):
    """The part of `chain.client.ChainClient` a report needs (kept narrow for test stand-ins)."""

    def query(self, name: str, **params: Any) -> Any: ...

    def height(self) -> int: ...


@dataclass
class BlockTally:
    """Counts over the block stream: the only place txs and verifier slashes are visible."""

    scanned_to: int = 0
    txs: int = 0
    verifier_slashed: int = 0
    host_slashed: int = 0
    rewards: int = 0
    finalized: dict[tuple[int, str], tuple[int, int]] = field(
        default_factory=dict
    )  # (step, host) -> reward, slash
    missed: dict[str, int] = field(default_factory=dict)  # validator address -> blocks it did not sign

    def add_block(
        self,
        run_id: int,
        height: int,
        tx_count: int,
        events: list[tuple[str, Mapping[str, str]]],
        missed: Sequence[str] = (),
    ) -> None:
        self.scanned_to = max(self.scanned_to, height)
        self.txs += tx_count
        for address in missed:
            self.missed[address] = self.missed.get(address, 0) + 1
        for kind, attrs in events:
            if attrs.get("run_id") != str(run_id):
                continue
            if kind == "slash_verifier":
                self.verifier_slashed += int(attrs.get("amount", 0))
            elif kind in ("contribution_finalized", "reward", "withheld"):
                # slashes at finalization; rewards once the result is adopted; withholding after it
                key = (int(attrs["outer_step"]), attrs["host"])
                reward, slashed = self.finalized.get(key, (0, 0))
                amount = int(attrs.get("slashed" if kind == "contribution_finalized" else "amount", 0))
                if kind == "reward":
                    reward += amount
                    self.rewards += amount
                else:
                    slashed += amount
                    self.host_slashed += amount
                self.finalized[key] = (reward, slashed)


def scan_blocks(client: Any, run_id: int, tally: BlockTally, up_to: int) -> BlockTally:
    """Extend `tally` with blocks (tally.scanned_to, up_to]; the client needs `block(height)`."""
    if up_to - tally.scanned_to > MAX_SCAN_BLOCKS:
        return tally
    for height in range(tally.scanned_to + 1, up_to + 1):
        block = client.block(height)
        events = [(e.type, e.attributes) for e in block.all_events()]
        missed = block.header.get("missed_validators") or []  # CometBFT: who did not sign h - 1
        tally.add_block(run_id, height, len(block.txs), events, [str(a) for a in missed])
    return tally


def short(address: str) -> str:
    return f"{address[:10]}…{address[-4:]}" if len(address) > 16 else address


def bounded_get(url: str, limit: int, timeout: float) -> bytes | None:
    """GET a body of at most `limit` bytes, streamed; None on any failure (a report never dies of a
    node that is down, slow, or answers with something huge)."""
    try:
        with httpx.stream("GET", url, timeout=timeout) as r:
            if r.status_code != 200:
                return None
            body = bytearray()
            for chunk in r.iter_raw():
                body += chunk
                if len(body) > limit:
                    return None
            return bytes(body)
    except httpx.HTTPError:
        return None


def fetch_status(url: str, timeout: float = 2.0) -> dict[str, Any] | None:
    """A node's `/status` as a dict, or None if it does not answer with one."""
    raw = bounded_get(url.rstrip("/") + "/status", MAX_STATUS_BYTES, timeout)
    try:
        body = json.loads(raw) if raw is not None else None
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def delta_bytes(endpoint: str | None, delta_hash: str, timeout: float = 5.0) -> int | None:
    """Size on the wire of the revealed Δ blob as its host serves it; None when it is not served."""
    if not endpoint:
        return None
    blob = bounded_get(f"{endpoint.rstrip('/')}/blobs/delta/{delta_hash}", MAX_DELTA_BYTES, timeout)
    return None if blob is None else len(blob)


def losses(status: Mapping[str, Any]) -> tuple[dict[int, float], float | None]:
    """(global val loss per outer step, last local loss) from a node's `/status`, tolerant of shape."""
    val: dict[int, float] = {}
    raw = status.get("val_loss")
    if isinstance(raw, Mapping):
        for k, v in raw.items():
            try:
                val[int(k)] = float(v)
            except (TypeError, ValueError):
                continue
    local = status.get("loss", status.get("local_loss"))
    return val, float(local) if isinstance(local, int | float) else None


def collect(
    client: Chain,
    run_id: int,
    nodes: list[NodeRow] | None = None,
    *,
    tally: BlockTally | None = None,
    measure_deltas: bool = False,
) -> Snapshot:
    """Query the chain for run `run_id` and merge in what is known about the nodes."""
    run = client.query("run", run_id=run_id)
    participants = client.query("participants", run_id=run_id)["participants"]
    rows = {n.address or n.name: n for n in (nodes or [])}  # the chain node has no address
    for p in participants:
        if p["address"] not in rows:
            rows[p["address"]] = NodeRow(
                name=short(p["address"]),
                role=p["role"],
                address=p["address"],
                url=p.get("endpoint", ""),
                behaviour=UNKNOWN,
            )
    for p in participants:
        row = rows[p["address"]]
        rows[p["address"]] = row.model_copy(update={"joined_height": p.get("joined_height")})
    name = {a: n.name for a, n in rows.items()}

    def nm(address: str) -> str:
        return name.get(address, short(address))

    endpoints = {p["address"]: p.get("endpoint") for p in participants}
    finalized = tally.finalized if tally else {}
    steps: list[StepRow] = []
    contributions: list[ContributionRow] = []
    for index in range(int(run["current_step"]) + 1):
        s = client.query("outer_step", run_id=run_id, step=index)
        steps.append(
            StepRow(
                index=index,
                phase=s["phase"],
                accepted=[nm(a) for a in s["accepted"]],
                base_model_hash=s["base_model_hash"],
                result_hash=s.get("result_hash"),
                result_votes={nm(a): h for a, h in (s.get("result_votes") or {}).items()},
                open_height=s.get("open_height"),
                train_start=s.get("train_start"),
                commit_deadline=s.get("commit_deadline"),
                done_height=s.get("done_height"),
            )
        )
        commits = client.query("commitments", run_id=run_id, step=index)["commitments"]
        if not commits:
            continue
        challenges = {
            c["host"]: c for c in client.query("challenges", run_id=run_id, step=index)["challenges"]
        }
        verdicts: dict[str, list[str]] = {}
        for v in client.query("verdicts", run_id=run_id, step=index)["verdicts"]:
            verdicts.setdefault(v["host"], []).append(
                f"{nm(v['verifier'])}: {REASONS.get(v['reason'], v['reason'])}"
            )
        for c in commits:
            host = c["host"]
            reward, slashed = finalized.get((index, host), (0, 0))
            outcome = (s.get("outcomes") or {}).get(host) or "pending"
            contributions.append(
                ContributionRow(
                    host=nm(host),
                    address=host,
                    outer_step=index,
                    outcome=outcome,
                    reasons=verdicts.get(host, []),
                    verifiers=[nm(v) for v in challenges.get(host, {}).get("verifiers", [])],
                    delta_bytes=delta_bytes(endpoints.get(host), c["delta_hash"]) if measure_deltas else None,
                    tokens=int(c["tokens"]),
                    reward=reward,
                    slashed=slashed,
                )
            )
    stats = ChainStats(height=client.height())
    if tally is not None and tally.scanned_to:
        stats = ChainStats(
            height=stats.height,
            txs=tally.txs,
            host_slashed=tally.host_slashed,
            verifier_slashed=tally.verifier_slashed,
            rewards=tally.rewards,
        )
    return Snapshot(
        run_id=run_id,
        chain_url=",".join(getattr(client, "urls", None) or [str(getattr(client, "url", ""))]),
        run_status=run["status"],
        config=run.get("config", {}),
        current_step=int(run["current_step"]),
        steps=steps,
        contributions=contributions,
        nodes=list(rows.values()),
        chain=stats,
    )


def update_from_status(node: NodeRow, status: Mapping[str, Any]) -> NodeRow:
    """Fold one `/status` answer into a node row (keeps every local loss seen so far)."""
    val, local = losses(status)
    local_loss = dict(node.local_loss)
    step = status.get("outer_step")
    if local is not None and isinstance(step, int):
        local_loss[step] = local
    phase = status.get("phase") or status.get("state") or node.state
    return node.model_copy(
        update={
            "val_loss": {**node.val_loss, **val},
            "local_loss": local_loss,
            "state": str(phase),
            "address": node.address or str(status.get("address", "")),
        }
    )


def _get_json(url: str, timeout: float = 3.0) -> dict[str, Any] | None:
    raw = bounded_get(url, MAX_STATUS_BYTES * 8, timeout)
    try:
        body = json.loads(raw) if raw is not None else None
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def validator_rows(
    validators: Sequence[tuple[str, str, str]], tally: BlockTally, restarts: Mapping[str, int]
) -> list[ValidatorRow]:
    """Each validator (name, REST URL, consensus address): its height and app hash there, checked
    against what the others committed at the same height. CometBFT itself checks every earlier app
    hash (a block's header carries the previous one), so a validator that disagrees at its latest
    height is where it left the network; one whose engine stopped says why in its status."""
    api = "/inference/diloco/v1"
    statuses = {name: _get_json(f"{url}{api}/status") for name, url, _ in validators}
    rows = []
    for name, url, address in validators:
        status = statuses[name]
        row = ValidatorRow(
            name=name, address=address, url=url, missed_blocks=tally.missed.get(address, 0),
            restarts=restarts.get(name, 0),
        )  # fmt: skip
        if status is None:
            rows.append(row.model_copy(update={"state": "down"}))
            continue
        height, own = int(status.get("height") or 0), str(status.get("app_hash") or "")
        votes = Counter([own])
        for other, other_url, _ in validators:
            if other != name:
                block = _get_json(f"{other_url}{api}/blocks/{height}")
                if block is not None:
                    votes[str(block["header"]["app_hash"])] += 1
        network, count = votes.most_common(1)[0]
        halted = status.get("halted")
        if own != network and count > 1:
            state = "diverged"
        elif halted:
            state = "diverged" if "diverged" in str(halted) else "halted"
        else:
            state = "ok"
        rows.append(
            row.model_copy(
                update={
                    "height": height,
                    "app_hash": own,
                    "network_app_hash": network,
                    "state": state,
                    "detail": str(halted or "")[:300],
                }
            )
        )
    return rows
