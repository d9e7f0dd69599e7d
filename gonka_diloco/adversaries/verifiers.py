"""Dishonest verifiers: the ways a verifier can fail the chain.

- lazy: accepts everything without fetching or replaying (saves all the work; caught when an
  honest majority rejects a bad contribution it accepted);
- malicious: runs the checks but rejects honest work (caught when the majority accepts);
- offline: never answers (its assignments escalate; it earns nothing);
- collude: accepts its partner hosts' contributions unchecked, honest about everyone else (its
  accept is contradicted by the dispute an honest verifier or auditor opens: slashed at the fraud
  rate, and the partner with it).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from protocol.messages import Reason
from verifier.behaviour import VerifierBehaviour
from verifier.verify import Job, Outcome, evidence_hash


class LazyVerifier(VerifierBehaviour):
    """Accepts everything without fetching or replaying anything."""

    name = "lazy"

    def decide(self, job: Job, check: Callable[[], Outcome]) -> Outcome | None:
        return Outcome(Reason.ACCEPT, "", evidence_hash(job, Reason.ACCEPT, [], ""))


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

    def decide(self, job: Job, check: Callable[[], Outcome]) -> Outcome | None:
        honest = check()
        if not honest.accept:
            return honest
        detail = "segment 0: replay differs (fabricated)"
        return Outcome(self.reason, detail, evidence_hash(job, self.reason, honest.replayed_leaves, detail))


class OfflineVerifier(VerifierBehaviour):
    """Never fetches, never answers: its assignments escalate."""

    name = "offline"

    def online(self) -> bool:
        return False

    def decide(self, job: Job, check: Callable[[], Outcome]) -> Outcome | None:
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

    def decide(self, job: Job, check: Callable[[], Outcome]) -> Outcome | None:
        if job.host in self.partners:
            return Outcome(Reason.ACCEPT, "", evidence_hash(job, Reason.ACCEPT, [], ""))
        return check()


VERIFIERS: dict[str, type[VerifierBehaviour]] = {
    "honest": VerifierBehaviour,
    "lazy": LazyVerifier,
    "malicious": MaliciousVerifier,
    "offline": OfflineVerifier,
    "collude": ColludingVerifier,
}
