"""The module's constants in one table, and the tunable module params carried by genesis.

Everything a validity rule or a phase computation compares against is named here, so a reader of
`chain.module` never meets a bare number.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

CODESPACE = "diloco"
"""Cosmos-style codespace of every error the module raises."""

DENOM = "ngonka"
"""The only denomination: 1 GNK = 1e9 ngonka."""

MODULE_ACCOUNT = "gonka1kgratgrguvpp6hf5nxrw9rugpc9dp7gdsdkrjv"
"""sha256("diloco")[:20] in bech32: receives fees and slashed stake."""

REWARD_POOL_ACCOUNT = "gonka13dc4epyknw8w5hcrx8rlpk4hctxn2n72q3sglq"
"""sha256("diloco_rewards")[:20] in bech32: funded at genesis, pays accepted hosts."""

FIRST_RUN_ID = 1
BPS_DENOMINATOR = 10_000
"""Slash fractions are in basis points of the bonded stake."""

CHALLENGE_DELAY = 2
"""The challenge is derived at commit_deadline + 2 from the hash of block commit_deadline + 1."""

ZERO_HASH = "0" * 64
"""The previous block hash of the first block."""


class Phase:
    """Phases of one outer step, in the order they happen (plain strings: they go into JSON)."""

    PENDING = "PENDING"  # opened, waiting for its training start (join window or PoC window)
    TRAIN = "TRAIN"  # commits accepted until commit_deadline inclusive
    CHALLENGE = "CHALLENGE"  # the block after the deadline, whose hash seeds the challenge
    REVEAL = "REVEAL"  # reveals accepted until reveal_deadline inclusive; verdicts too
    VERIFY = "VERIFY"  # verdicts until verify_deadline inclusive
    ESCALATION = "ESCALATION"  # verdicts from escalated verifiers until the round deadline
    AWAITING_RESULT = "AWAITING_RESULT"  # accepted hosts report the next global model hash
    DONE = "DONE"


class Outcome:
    """How a contribution was finalized."""

    ACCEPTED = "accepted"
    REJECTED = "rejected"
    MISSING_REVEAL = "missing_reveal"  # a reject: slashed like one
    EQUIVOCATED = "equivocated"  # a reject: slashed like one
    UNVERIFIED = "unverified"  # no verdict decided it: excluded, nobody slashed


SLASHED_OUTCOMES = (Outcome.REJECTED, Outcome.MISSING_REVEAL, Outcome.EQUIVOCATED)


class RunStatus:
    ACTIVE = "active"
    FINISHED = "finished"  # max_outer_steps reached


class ModuleParams(BaseModel):
    """Chain-wide limits set at genesis (run-specific numbers live in each run's `RunConfig`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_participants_per_run: int = Field(10_000, ge=1)
    max_active_runs: int = Field(16, ge=1)
