"""The module's constants in one table, and the tunable module params carried by genesis.

Everything a validity rule or a phase computation compares against is named here, so a reader of
`chain.module` never meets a bare number.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_serializer

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
"""A draw happens 2 blocks after the event it follows: the challenge at commit_deadline + 2 (the
block commit_deadline + 1 is the first whose hash no committer could know), the audit at the close
of the verdict rounds + 2."""

REVEAL_GRACE_SHARE = 2
"""Lateness is not fraud (DESIGN §7): a reveal is still taken for the first 1/REVEAL_GRACE_SHARE of
the verify window after the reveal deadline (`reveal_closes`), so a host slowed by a loaded machine
or a jittery link is verified, not slashed as `missing_reveal`; the other half is its verifiers'
(and escalation rounds follow when they need more)."""

SEED_BLOCKS = 3
"""A challenge or audit seed hashes the last SEED_BLOCKS block hashes (`recent_block_hashes`):
once consecutive blocks have different proposers, none of them controls more than one input."""

ZERO_HASH = "0" * 64
"""The previous block hash of the first block."""

BLOCK_SECONDS = 1.0
"""The embedded node's default block interval (`chain start --block-interval`), and so the default
wherever blocks are turned into seconds or back (`run create --block-seconds`, `plan`)."""


class Phase(StrEnum):
    """Phases of one outer step, in the order they happen (str-valued: they go into JSON as is)."""

    PENDING = "PENDING"  # opened, waiting for its training start (join window or PoC window)
    TRAIN = "TRAIN"  # commits accepted until commit_deadline inclusive
    CHALLENGE = "CHALLENGE"  # the block after the deadline, whose hash seeds the challenge
    REVEAL = "REVEAL"  # reveals accepted until reveal_deadline inclusive; verdicts too
    VERIFY = "VERIFY"  # verdicts until verify_deadline inclusive; late reveals until reveal_closes
    ESCALATION = "ESCALATION"  # verdicts from escalated verifiers until the round deadline
    AUDIT = "AUDIT"  # accepted contributions drawn for audit at audit_height; auditors' verdicts
    CONFIRM = "CONFIRM"  # disputed contributions: every bonded verifier's stake decides
    AWAITING_RESULT = "AWAITING_RESULT"  # accepted hosts report the next global model hash
    DONE = "DONE"

    @property
    def finalized(self) -> bool:
        """Every contribution's outcome is decided (no more verdicts are taken)."""
        return self in (Phase.AWAITING_RESULT, Phase.DONE)


class Outcome(StrEnum):
    """How a contribution was finalized."""

    ACCEPTED = "accepted"
    REJECTED = "rejected"
    MISSING_REVEAL = "missing_reveal"  # a reject: slashed like one
    EQUIVOCATED = "equivocated"  # a reject: slashed like one
    UNVERIFIED = "unverified"  # no verdict decided it: excluded, nobody slashed
    WITHHELD = "withheld"  # accepted, then reported unavailable by a majority: dropped and slashed
    PARENT_NOT_ACCEPTED = "parent_not_accepted"  # eager: its start used a Δ that did not enter; not slashed


SLASHED_OUTCOMES = (Outcome.REJECTED, Outcome.MISSING_REVEAL, Outcome.EQUIVOCATED, Outcome.WITHHELD)


class Review(StrEnum):
    """Where an undecided contribution stands after the initial verdict rounds."""

    PROVISIONAL = "provisional"  # its verifiers accepted: awaits the audit lottery
    AUDIT = "audit"  # drawn for audit: auditors assigned
    CONFIRM = "confirm"  # disputed (some verifier rejected): every bonded verifier's stake decides


class RunStatus(StrEnum):
    ACTIVE = "active"
    FINISHED = "finished"  # max_outer_steps reached


BONDING_DELAY_BLOCKS = SEED_BLOCKS + 1
"""Default (and least) `bonding_delay_blocks`: stake bonded at height j is drawn from height
j + SEED_BLOCKS + 1 on, so it was fixed before the first block whose hash seeds that draw existed
(specs §2.3): nobody, a seed block's proposer included, bonds knowing the seed."""

MAX_MODEL_PARAMS = 100_000_000_000
"""Default `max_model_params`: 10^11, twice the mission's largest model (50B). A bound on what a run
may ask every node to allocate, not a target: genesis may raise it."""

MAX_MODEL_TENSORS = 1 << 16
"""Default `max_model_tensors` (Llama-3.1-405B has 1,138): each tensor is an object on every node
and an entry in every state's header, so a model of a billion 1-element layers is refused too."""


class ModuleParams(BaseModel):
    """Chain-wide limits set at genesis (run-specific numbers live in each run's `RunConfig`).

    Fields added after the first genesis are left out of the dump (and so of the state's `params`,
    its app hash and the genesis JSON) while they hold their default: existing chains keep their
    hashes bit for bit."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_participants_per_run: int = Field(10_000, ge=1)
    max_active_runs: int = Field(16, ge=1)
    max_model_params: int = Field(
        MAX_MODEL_PARAMS, ge=1, description="most parameters a run's model may have (MsgCreateRun)"
    )
    max_model_tensors: int = Field(
        MAX_MODEL_TENSORS, ge=1, description="most parameter tensors a run's model may have (MsgCreateRun)"
    )
    bonding_delay_blocks: int = Field(
        BONDING_DELAY_BLOCKS,
        ge=BONDING_DELAY_BLOCKS,
        description="blocks after MsgJoinRun before a verifier's stake enters draws (specs §2.3)",
    )

    @model_serializer(mode="wrap")
    def _omit_defaults(self, handler: Any) -> dict[str, Any]:
        data = handler(self)
        for name in _LATER_PARAMS:
            if data.get(name) == type(self).model_fields[name].default:
                data.pop(name, None)
        return data


_LATER_PARAMS = ("max_model_params", "max_model_tensors", "bonding_delay_blocks")
