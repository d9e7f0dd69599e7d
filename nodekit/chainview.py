"""A typed view of the chain state a node follows: phases and outcomes as enums, records as
dataclasses, chain errors matched by their stable code (never by log text).

Both nodes follow a run only through this view, so a renamed query field breaks here, once, and
not in two node loops. Unknown fields in an answer are ignored (the chain may add some).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from chain.client import ChainClient, ChainTimeout, TxFailed
from chain.errors import ChainError, ErrDuplicateCommit
from chain.params import CODESPACE, Outcome, Phase
from protocol.config import RunConfig
from protocol.messages import Role
from protocol.prf import window

__all__ = [
    "ChainView", "Checks", "ErrDuplicateCommit", "Outcome", "Phase", "ResultRound", "StartState", "StepInfo",
    "Stopped", "checked_segments", "is_chain_error",
]  # fmt: skip


@dataclass(frozen=True)
class Checks:
    """What one verifier checks of a windowed contribution (specs §2.3, §2.5.3)."""

    segments: list[int]
    """Its slot's window, or, for one without a slot (a dispute panel member), every disputed one."""
    panel: bool
    """A dispute panel member, or a slot holder's revote in a dispute: it checks Δ first."""


def checked_segments(challenge: Mapping[str, Any], verifier: str, n: int, w: int) -> Checks:
    """From a windowed contribution's challenge (the `challenges` query's item)."""
    slot = (challenge.get("slots") or {}).get(verifier)
    revote = verifier in (challenge.get("revotes_owed") or [])  # a dispute: like the panel
    mine = slot is not None and not revote
    starts = [challenge["windows"][slot]] if mine else list(challenge.get("disputed") or [])
    return Checks(sorted({s for start in starts for s in window(start, n, w)}), panel=not mine)


class Stopped(Exception):
    """`stop()` was called: leave the loop at the next wait."""


def _outcome(value: str | None) -> Outcome | str | None:
    try:
        return None if value is None else Outcome(value)
    except ValueError:  # an outcome this node does not know yet: keep the chain's word
        return value


D = TypeVar("D")


def _typed(cls: type[D], data: dict[str, Any], **override: Any) -> D:
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    return cls(**{k: v for k, v in data.items() if k in names}, **override)


@dataclass(frozen=True)
class StepInfo:
    """One outer step: phase, deadlines, the model commits build on, and the outcome so far."""

    outer_step: int
    phase: Phase
    height: int
    train_start: int
    commit_deadline: int
    reveal_deadline: int
    reveal_closes: int
    """The last height a reveal is taken: the deadline and its grace (a late reveal is still judged)."""
    verify_deadline: int
    round_deadline: int
    base_model_hash: str
    challenge_seed: str | None
    finalized_height: int | None
    result_hash: str | None
    done_height: int | None = None
    accepted: list[str] = field(default_factory=list)
    outcomes: dict[str, Outcome | str | None] = field(default_factory=dict)
    result_votes: dict[str, str] = field(default_factory=dict)
    result_round: int = 0
    result_deadline: int | None = None
    dropped: list[str] = field(default_factory=list)
    unavailable: dict[str, list[str]] = field(default_factory=dict)
    """Reporter -> the hosts whose Δ it reported it could not fetch, in this result round."""
    apply_to_hash: str | None = None
    """The G the step's accepted Δs are applied to: its base (sequential runs), the previous step's
    result in an overlapped run (None until that is adopted; specs §2.2.1)."""

    @classmethod
    def of(cls, data: dict[str, Any]) -> StepInfo:
        outcomes = {h: _outcome(o) for h, o in data.get("outcomes", {}).items()}
        rest = {k: v for k, v in data.items() if k not in ("phase", "outcomes")}
        return _typed(cls, rest, phase=Phase(data["phase"]), outcomes=outcomes)


@dataclass(frozen=True)
class RunInfo:
    run_id: int
    status: str
    current_step: int
    global_model_hash: str
    config: dict[str, Any] = field(default_factory=dict)
    overlap: str = "none"
    steps_in_flight: list[int] = field(default_factory=list)

    @property
    def active(self) -> bool:
        return self.status == "active"

    @property
    def overlapped(self) -> bool:
        """Step n+1 trains while step n is verified and aggregated (specs §2.2.1): `eager`, the
        only overlapped schedule."""
        return self.eager

    @property
    def eager(self) -> bool:
        """Overlapped, a host's own previous Δ standing in for the aggregate (specs §2.2.1)."""
        return self.overlap == "eager"


@dataclass(frozen=True)
class StartState:
    """What a host's start state of one outer step is made of (the chain's `start_state`)."""

    base_model_hash: str
    parent_delta_hash: str | None = None
    """Eager runs: the host's own step n − 1 Δ, applied to the base by the outer step; else None."""
    parent_codec: str | None = None
    parent_outer_step: int | None = None
    optimizer_hash: str | None = None
    """None: a fresh optimizer."""
    ef_hash: str | None = None
    """Codec sparse: the error-feedback accumulator carried in (None: zeros; specs §4.1)."""


@dataclass(frozen=True)
class Participant:
    address: str
    role: str
    stake: int
    endpoint: str
    joined_height: int = 0
    leaving: bool = False


@dataclass(frozen=True)
class Accepted:
    """One accepted contribution: what aggregation needs (its Δ hash, tokens, author endpoint)."""

    host: str
    delta_hash: str
    tokens: int
    endpoint: str | None = None


@dataclass(frozen=True)
class ResultRound:
    """One result round of a finalized step, read in one query: the set a vote must aggregate."""

    base_model_hash: str
    result_round: int
    result_deadline: int | None
    accepted: list[Accepted]
    dropped: list[str]

    @property
    def hosts(self) -> list[str]:
        return [a.host for a in self.accepted]


def is_chain_error(e: TxFailed, err: type[ChainError]) -> bool:
    """Whether a refused tx failed on this rule: by codespace and code, never by log text."""
    return e.codespace == CODESPACE and e.code == err.code


class ChainView:
    """Typed queries of one run, and waits that end at `stop`."""

    def __init__(
        self, chain: ChainClient, run_id: int, stop: threading.Event | None = None, poll_timeout: float = 10.0
    ) -> None:
        self.chain, self.run_id = chain, run_id
        self.stop = stop or threading.Event()
        self.poll_timeout = poll_timeout

    def q(self, name: str, **params: Any) -> Any:
        return self.chain.query(name, run_id=self.run_id, **params)

    def run(self) -> RunInfo:
        return _typed(RunInfo, self.chain.run(self.run_id))

    def step(self, n: int) -> StepInfo:
        return StepInfo.of(self.q("outer_step", step=n))

    def commitment(self, host: str, n: int) -> dict[str, Any] | None:
        return self.q("commitment", host=host, step=n)

    def segments(self, host: str, n: int) -> list[int] | None:
        ch = self.q("challenges", step=n)["challenges"]
        return next((list(x["segments"]) for x in ch if x["host"] == host), None)

    def revotes_owed(self, n: int, verifier: str) -> set[str]:
        """Hosts of step n in whose windowed dispute `verifier` owes its revote (specs §2.5.3)."""
        ch = self.q("challenges", step=n)["challenges"]
        return {x["host"] for x in ch if verifier in (x.get("revotes_owed") or [])}

    def windows(self, host: str, n: int) -> list[int]:
        """Sampling windows: the start segment of each of the host's checker slots (empty without)."""
        ch = self.q("challenges", step=n)["challenges"]
        return next((list(x.get("windows") or []) for x in ch if x["host"] == host), [])

    def checks(self, host: str, n: int, verifier: str, cfg: RunConfig) -> Checks | None:
        """The segments `verifier` replays of `host`'s step-n contribution (sampling windows, specs
        §2.3, §2.5.3): its slot's window, or as a dispute panel member the disputed windows; None
        when every checker replays every opened segment (sampling segments)."""
        ch = self.q("challenges", step=n)["challenges"]
        item = next((x for x in ch if x["host"] == host), None)
        if item is None or not item.get("windows"):
            return None
        return checked_segments(item, verifier, cfg.n_segments, cfg.window_len)

    def reveal(self, host: str, n: int) -> dict[str, Any] | None:
        return next((r for r in self.q("reveals", step=n)["reveals"] if r["host"] == host), None)

    def accepted(self, n: int) -> tuple[str, list[Accepted]]:
        """(G_n's hash, the accepted contributions in sorted host order)."""
        acc = self.q("accepted", step=n)
        return acc["base_model_hash"], [_typed(Accepted, a) for a in acc["accepted"]]

    def holders(self, n: int, exclude: str | None = None) -> dict[str, list[str]]:
        """Per committed host of step n, the endpoints that may serve its objects, likeliest first:
        the author, the verifiers that checked it (in the order they were drawn: they keep what
        they fetched or derived), then every other participant (hosts, then verifiers: they keep
        the Δs they fetched). `exclude` (the asking node) is left out. One query of each kind."""
        parts = self.participants()
        endpoint = {p.address: p.endpoint for p in parts if p.endpoint and p.address != exclude}
        everyone = [p.address for p in parts if p.role == Role.HOST.value] + [
            p.address for p in parts if p.role == Role.VERIFIER.value
        ]
        out: dict[str, list[str]] = {}
        for c in self.q("challenges", step=n)["challenges"]:
            rounds: dict[str, int] = c.get("verifier_rounds") or {}
            checked = sorted(rounds, key=lambda a: (rounds[a], a))
            order = [c["host"], *checked, *everyone]
            out[c["host"]] = list(dict.fromkeys(endpoint[a] for a in order if a in endpoint))
        return out

    def result_round(self, n: int) -> ResultRound:
        """The current result round of step n (its accepted set shrinks when a round drops Δs)."""
        acc = self.q("accepted", step=n)
        return ResultRound(
            acc["base_model_hash"], int(acc.get("result_round") or 0), acc.get("result_deadline"),
            [_typed(Accepted, a) for a in acc["accepted"]], list(acc.get("dropped") or []),
        )  # fmt: skip

    def participants(self) -> list[Participant]:
        return [_typed(Participant, p) for p in self.q("participants")["participants"]]

    def participant(self, address: str) -> Participant | None:
        return next((p for p in self.participants() if p.address == address), None)

    def endpoints(self, role: Role | None = None, exclude: str | None = None) -> list[str]:
        """Blob endpoints of the run's participants (of one role), as the chain records them."""
        return [
            p.endpoint
            for p in self.participants()
            if (role is None or p.role == role.value) and p.address != exclude and p.endpoint
        ]

    def prev_optimizer_hash(self, host: str, n: int | None = None) -> str | None:
        """The optimizer state the host's start of outer step n carries (None: fresh)."""
        if n is None:
            return self.q("prev_optimizer_hash", host=host)
        return self.q("prev_optimizer_hash", host=host, step=n)

    def start_ef_hash(self, host: str, n: int | None = None) -> str | None:
        """The error-feedback accumulator the host's start of outer step n carries (None: zeros)."""
        if n is None:
            return self.q("start_ef_hash", host=host)
        return self.q("start_ef_hash", host=host, step=n)

    def start_state(self, host: str, n: int) -> StartState:
        """The base, eager parent and optimizer of the host's start of outer step n (§2.2.1)."""
        return _typed(StartState, self.q("start_state", host=host, step=n))

    def next_start_state(self, host: str) -> tuple[int, StartState] | None:
        """The step after the newest and the host's start of it, once fixed before it opens (§2.2.1)."""
        got = self.q("next_start_state", host=host)
        if got is None:
            return None
        n = int(got.pop("outer_step"))
        return n, _typed(StartState, got)

    def assignments(self, verifier: str, n: int) -> list[str]:
        return list(self.q("assignments", verifier=verifier, step=n)["hosts"])

    # ---- waiting

    def check_stop(self) -> None:
        if self.stop.is_set():
            raise Stopped

    def next_block(self, h: int) -> int:
        self.check_stop()
        try:
            return self.chain.wait_for_block(h, timeout=self.poll_timeout).height
        except ChainTimeout:
            return self.chain.height()

    def wait_height(self, target: int) -> int:
        """Block until the chain is at `target` or beyond, one long-poll per block."""
        h = self.chain.height()
        while h < target:
            h = self.next_block(h)
        self.check_stop()
        return h

    def wait_run(self, done: Callable[[RunInfo], bool]) -> RunInfo:
        """Re-read the run after every block until `done` holds."""
        h = self.chain.height()
        while True:
            info = self.run()
            if done(info):
                return info
            h = self.wait_height(h + 1)

    def wait_step(self, n: int, done: Callable[[StepInfo], bool], from_height: int = 0) -> StepInfo:
        """Re-read outer step n after every block until `done` holds."""
        h = self.wait_height(from_height)
        while True:
            info = self.step(n)
            if done(info):
                return info
            h = self.wait_height(max(h, info.height) + 1)
