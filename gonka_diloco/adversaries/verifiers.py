"""Dishonest verifiers: the three ways a verifier can fail the chain.

- lazy: accepts everything without fetching or replaying (saves all the work; caught when an
  honest majority rejects a bad contribution it accepted);
- malicious: runs the checks but rejects honest work (caught when the majority accepts);
- offline: never answers (its assignments escalate; it earns nothing).
"""

from __future__ import annotations

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


VERIFIERS: dict[str, type[VerifierBehaviour]] = {
    "honest": VerifierBehaviour,
    "lazy": LazyVerifier,
    "malicious": MaliciousVerifier,
    "offline": OfflineVerifier,
}
