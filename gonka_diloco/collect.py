"""Build a report `Snapshot` from what a chain and its nodes say over HTTP.

Everything comes from public interfaces — the module's JSON queries, the block stream and each
node's `/status` — so `gonka-diloco report <chain URL>` can describe any run, not only one this
process started, also after its nodes exited: the validation loss is read from the result votes
on chain (`val_loss_ppm`), sit-outs from the participants and commitments, and counts from the
blocks of the run's own span. Node names are optional: a devnet passes its own (host-0,
verifier-1, …); a bare chain URL gets short addresses.
"""

from __future__ import annotations

import json
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from chain.params import Phase
from gonka_diloco.report import (
    UNKNOWN,
    ChainStats,
    ContributionRow,
    NodeRow,
    SitOut,
    Snapshot,
    StepRow,
    ValidatorRow,
)
from protocol.messages import Reason, Role

MAX_STATUS_BYTES = 1 << 20
MAX_DELTA_BYTES = 64 << 20
MAX_SCAN_BLOCKS = 20_000
"""A report scans every block of the run's span for txs, slashes and rewards; a span longer than
this is not scanned (the report says so) rather than read block by block for minutes."""

def reason_name(code: Any) -> str:
    """A verdict's reason code as its `protocol.messages.Reason` name (an unknown code as is)."""
    try:
        return Reason(code).name
    except ValueError:
        return str(code)


class Chain(Protocol):
    """The part of `chain.client.ChainClient` a report needs (kept narrow for test stand-ins)."""

    def query(self, name: str, **params: Any) -> Any: ...

    def height(self) -> int: ...


@dataclass
class BlockTally:
    """Counts over the block stream: the only place txs and verifier slashes are visible."""

    scanned_to: int = 0
    txs: int = 0  # txs that touched the run (an event naming its run_id)
    first_time: float | None = None  # block time of the first block scanned
    last_time: float | None = None
    skipped: int = 0  # blocks a scan left out (a span longer than MAX_SCAN_BLOCKS)
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
        self.txs += tx_count  # the caller counts the run's txs only
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


def scan_blocks(
    client: Any, run_id: int, tally: BlockTally, up_to: int, from_height: int | None = None
) -> BlockTally:
    """Extend `tally` with blocks (tally.scanned_to, up_to] — from `from_height` (the run's creation)
    on a fresh tally; counts only the txs that touched run `run_id`. The client needs `block(h)`."""
    if from_height is not None and tally.scanned_to < from_height - 1:
        tally.scanned_to = from_height - 1
    if up_to - tally.scanned_to > MAX_SCAN_BLOCKS:
        tally.skipped = up_to - tally.scanned_to
        return tally
    run = str(run_id)
    for height in range(tally.scanned_to + 1, up_to + 1):
        block = client.block(height)
        events = [(e.type, e.attributes) for e in block.all_events()]
        missed = block.header.get("missed_validators") or []  # CometBFT: who did not sign h - 1
        txs = sum(any(e.attributes.get("run_id") == run for e in tx.events) for tx in block.txs)
        tally.add_block(run_id, height, txs, events, [str(a) for a in missed])
        if tally.first_time is None:
            tally.first_time = block.time
        tally.last_time = block.time
    return tally


def vote_losses(
    votes: Mapping[str, str], losses: Mapping[str, Any], adopted: str | None
) -> tuple[dict[str, float], float | None, list[str]]:
    """The validation losses (nats) the votes for the adopted model carried, their median, and the
    voters whose value is not what most of them say: honest hosts evaluate the same model on the
    same windows and, on one replay class, agree exactly, so a lone liar stands out (specs §2.7)."""
    carried = {
        voter: int(ppm) / 1e6
        for voter, ppm in losses.items()
        if adopted is not None and votes.get(voter) == adopted and isinstance(ppm, int) and ppm > 0
    }
    if not carried:
        return {}, None, []
    counts = Counter(carried.values()).most_common()
    agreed = counts[0][0] if len(counts) == 1 or counts[0][1] > counts[1][1] else None
    dissent = sorted(v for v, loss in carried.items() if agreed is None or loss != agreed)
    return carried, float(statistics.median(carried.values())), dissent


def sit_outs(participants: Sequence[Mapping[str, Any]], steps: Sequence[Mapping[str, Any]]) -> list[SitOut]:
    """Hosts bonded for an outer step (joined by its commit deadline) that committed nothing in it,
    for every step whose commit window has closed. Hosts that since left the run are no longer
    participants and are not listed."""
    out = []
    for s in steps:
        if s["phase"] in (Phase.PENDING, Phase.TRAIN):
            continue
        committed = set(s.get("committed") or [])
        for p in participants:
            joined = p.get("joined_height")
            if p["role"] != Role.HOST or p["address"] in committed or joined is None:
                continue
            deadline = s.get("commit_deadline")
            if deadline is not None and joined <= int(deadline):
                out.append(SitOut(host=p["address"], address=p["address"], outer_step=int(s["outer_step"]),
                                  joined_height=joined))  # fmt: skip
    return out


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
    down: set[str] = set()  # endpoints that do not answer at all (nodes that exited): not asked again

    def sized(endpoint: str | None, h: str) -> int | None:
        if not endpoint or endpoint in down:
            return None
        size = delta_bytes(endpoint, h)
        if size is None and fetch_status(endpoint) is None:
            down.add(endpoint)
        return size

    steps: list[StepRow] = []
    raw_steps: list[dict[str, Any]] = []
    contributions: list[ContributionRow] = []
    notes: list[str] = []
    for index in range(int(run["current_step"]) + 1):
        s = client.query("outer_step", run_id=run_id, step=index)
        raw_steps.append(s)
        votes = s.get("result_votes") or {}
        carried, median, dissent = vote_losses(votes, s.get("result_losses") or {}, s.get("result_hash"))
        previous = steps[-1] if steps else None
        model = s.get("result_hash") or s.get("base_model_hash")  # closed with no Δ: G_{n+1} = G_n
        if median is None and previous is not None and s["phase"] == "DONE" and model == (
            previous.result_hash or previous.base_model_hash
        ):
            median = previous.val_loss  # closed unchanged: the same model, the same loss
        if dissent:
            said = ", ".join(f"{nm(v)} {carried[v]:.4f}" for v in dissent)
            notes.append(
                f"outer step {index}: voters for the adopted model disagree on its validation loss "
                f"({said}; the table shows the median {median:.4f})"
            )
        steps.append(
            StepRow(
                index=index,
                phase=s["phase"],
                accepted=[nm(a) for a in s["accepted"]],
                base_model_hash=s["base_model_hash"],
                result_hash=s.get("result_hash"),
                result_votes={nm(a): h for a, h in votes.items()},
                loss_votes={nm(a): loss for a, loss in carried.items()},
                val_loss=median,
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
                f"{nm(v['verifier'])}: {reason_name(v['reason'])}"
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
                    delta_bytes=sized(endpoints.get(host), c["delta_hash"]) if measure_deltas else None,
                    tokens=int(c["tokens"]),
                    reward=reward,
                    slashed=slashed,
                )
            )
    height = client.height()
    created = run.get("created_height")
    done = [int(s["done_height"]) for s in raw_steps if s.get("done_height") is not None]
    last = max(done) if run["status"] == "finished" and done else height
    stats = ChainStats(height=height, first_height=created, last_height=last if created is not None else None)
    if tally is not None and tally.scanned_to and not tally.skipped:
        seconds = (
            tally.last_time - tally.first_time
            if tally.first_time is not None and tally.last_time is not None
            else None
        )
        stats = stats.model_copy(update={
            "txs": tally.txs, "host_slashed": tally.host_slashed, "verifier_slashed": tally.verifier_slashed,
            "rewards": tally.rewards, "seconds": seconds,
        })  # fmt: skip
    elif tally is not None and tally.skipped:
        notes.append(
            f"txs, slashes and rewards not counted: the run spans {tally.skipped} blocks, more than the "
            f"{MAX_SCAN_BLOCKS} a report scans"
        )
    outs = [o.model_copy(update={"host": nm(o.address)}) for o in sit_outs(participants, raw_steps)]
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
        sit_outs=outs,
        notes=notes,
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
            "traffic": status.get("traffic") or node.traffic,
            "replayed_steps": int(status.get("replayed_steps") or node.replayed_steps),
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
