"""The verifier's behaviour hooks; the honest base class. Adversaries subclass it.

The node calls `decide` once per assignment with a thunk that runs the real checks, so a lazy
verifier can skip the work entirely and a malicious one can overturn the result — exactly the
two ways a verifier can cheat the chain — and `online` before every chain interaction.
"""

from __future__ import annotations

from collections.abc import Callable

from protocol.messages import EnvFingerprint
from verifier.job import Job, Judgement


class VerifierBehaviour:
    """Honest: always online, always runs every check and reports what it found."""

    name = "honest"

    def online(self) -> bool:
        """False: the node neither fetches nor submits (its verdicts go missing)."""
        return True

    def declared_class(self, env: EnvFingerprint) -> str:
        """The replay class the node declares when it joins (specs §6.1): its own."""
        return env.replay_class

    def decide(self, job: Job, check: Callable[[], Judgement]) -> Judgement | None:
        """The verdict to submit, or None to submit nothing."""
        return check()
