"""Dishonest verifiers: the ways a verifier can fail the chain.

- lazy: accepts everything without fetching or replaying (saves all the work; caught when an
  honest majority rejects a bad contribution it accepted);
- malicious: runs the checks but rejects honest work (caught when the majority accepts);
- offline: never answers (its assignments escalate; it earns nothing);
- collude: accepts its partner hosts' contributions unchecked, honest about everyone else (its
  accept is contradicted by the dispute an honest verifier or auditor opens — with windows, when
  that dispute is about the Δ (every check checks it) or about its own window, or it sits on the
  panel: slashed at the fraud rate, and the partner with it; the accept of a window nobody
  disputed is never found out, and helps its partner only where that window is the fake);
- class_squatter: declares a replay class it does not have, to be drawn for the hosts of that
  class in bitwise mode (specs §6.1). Its own checks make it abstain on them (it cannot replay them
  bit for bit), so it earns nothing there; the escalation draws the class's honest verifiers.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from protocol.messages import EnvFingerprint, Reason
from verifier.behaviour import VerifierBehaviour
from verifier.job import Job, Judgement
from verifier.verify import evidence_hash


class LazyVerifier(VerifierBehaviour):
    """Accepts everything without fetching or replaying anything."""

    name = "lazy"

    def decide(self, job: Job, check: Callable[[], Judgement]) -> Judgement | None:
        return Judgement(Reason.ACCEPT, "", evidence_hash(job, Reason.ACCEPT, [], ""))


class MaliciousVerifier(VerifierBehaviour):
    """Rejects whatever an honest check would accept, with a plausible-looking reason."""

    name = "malicious"

    def __init__(self, reason: str = "REPLAY_MISMATCH") -> None:
        try:
            self.reason = Reason[reason]
        except KeyError:
            raise ValueError(f"unknown reason {reason!r}; one of {[r.name for r in Reason]}") from None
        if self.reason is Reason.ACCEPT:
            raise ValueError("a malicious verifier must reject")

    def decide(self, job: Job, check: Callable[[], Judgement]) -> Judgement | None:
        honest = check()
        if not honest.accept:
            return honest
        detail = "segment 0: replay differs (fabricated)"
        return Judgement(self.reason, detail, evidence_hash(job, self.reason, honest.replayed_leaves, detail))


class OfflineVerifier(VerifierBehaviour):
    """Never fetches, never answers: its assignments escalate."""

    name = "offline"

    def online(self) -> bool:
        return False

    def decide(self, job: Job, check: Callable[[], Judgement]) -> Judgement | None:
        return None


ADDRESS = re.compile(r"^gonka1[02-9ac-hj-np-z]{38,58}$")


class ColludingVerifier(VerifierBehaviour):
    """Accepts its partner hosts' contributions without checking; honest about everyone else.

    `partner` names them: one address, or several joined by "+" (the devnet's parameter form
    splits on commas). Whenever it is drawn for a partner (first, as an auditor, or on a dispute
    panel) it accepts, so an honest reject anywhere turns its accept into a contradicted one.
    """

    name = "collude"

    def __init__(self, partner: str = "") -> None:
        self.partners = frozenset(p for p in str(partner).split("+") if p)
        if not self.partners:
            raise ValueError("collude needs partner=<host address>[+<host address>…]")
        bad = sorted(p for p in self.partners if not ADDRESS.match(p))
        if bad:
            raise ValueError(f"partner {bad[0]!r} is not a gonka1… address")

    def decide(self, job: Job, check: Callable[[], Judgement]) -> Judgement | None:
        if job.host in self.partners:
            return Judgement(Reason.ACCEPT, "", evidence_hash(job, Reason.ACCEPT, [], ""))
        return check()


class ClassSquatter(VerifierBehaviour):
    """Joins declaring `replay_class` (default: the class of a CPU machine like the devnet's,
    with `threads` threads) instead of its own; otherwise honest."""

    name = "class_squatter"

    def __init__(self, replay_class: str = "", threads: int = 7) -> None:
        if replay_class and not re.fullmatch(r"[0-9a-f]{64}", replay_class):
            raise ValueError("replay_class must be 64 lower-case hex characters")
        self.claim, self.threads = replay_class, threads

    def declared_class(self, env: EnvFingerprint) -> str:
        if self.claim:
            return self.claim
        facts = env.model_dump(exclude={"replay_class"})
        return EnvFingerprint(**{**facts, "threads": self.threads}).replay_class


VERIFIERS: dict[str, type[VerifierBehaviour]] = {
    "honest": VerifierBehaviour,
    "lazy": LazyVerifier,
    "malicious": MaliciousVerifier,
    "offline": OfflineVerifier,
    "collude": ColludingVerifier,
    "class_squatter": ClassSquatter,
}
