"""Named errors of the `inference.diloco` module: one per validity rule, each with a stable code.

The app turns a `ChainError` into a failed tx result (codespace "diloco", `code`, log), and relies
on the module having raised it before writing anything. Codes are part of the protocol: never
renumber, only append. Code 1 is left for "internal" as in the Cosmos SDK.
"""

from __future__ import annotations

from typing import ClassVar

from chain.params import CODESPACE


class ChainError(Exception):
    """A message broke a validity rule; the state is unchanged."""

    code: ClassVar[int] = 1
    codespace: ClassVar[str] = CODESPACE

    def __init__(self, detail: str = "") -> None:
        super().__init__(detail)
        self.detail = detail

    @property
    def name(self) -> str:
        return type(self).__name__

    @property
    def log(self) -> str:
        return f"{self.name}: {self.detail}" if self.detail else self.name

    def __str__(self) -> str:
        return f"[{self.codespace}:{self.code}] {self.log}"


# --- envelope and bank


class ErrInternal(ChainError):
    """A message handler raised something other than a named error (a bug): the tx fails and its
    messages' writes are undone (chain.app), the same on every validator."""

    code = 1


class ErrSignerMismatch(ChainError):
    """The message's creator is not the tx signer."""

    code = 2


class ErrUnknownMessage(ChainError):
    """The message type is not handled by the module."""

    code = 3


class ErrInvalidAmount(ChainError):
    """A transfer amount is zero or negative."""

    code = 4


class ErrInsufficientFunds(ChainError):
    """The account balance does not cover the amount."""

    code = 5


# --- runs and participants


class ErrUnauthorized(ChainError):
    """Only the genesis authority may create runs."""

    code = 10


class ErrTooManyRuns(ChainError):
    """The number of active runs is at its limit."""

    code = 11


class ErrUnknownRun(ChainError):
    """No run with this id."""

    code = 12


class ErrRunFinished(ChainError):
    """The run reached max_outer_steps."""

    code = 13


class ErrAlreadyJoined(ChainError):
    """The address already joined this run in this role."""

    code = 14


class ErrRoleConflict(ChainError):
    """An address is host or verifier in a run, not both."""

    code = 15


class ErrStakeTooLow(ChainError):
    """The stake is below the role's minimum."""

    code = 16


class ErrRunFull(ChainError):
    """The run has max_participants_per_run participants."""

    code = 17


class ErrNotParticipant(ChainError):
    """The address is not bonded in this run."""

    code = 18


class ErrAlreadyLeaving(ChainError):
    """The participant already asked to leave."""

    code = 19


# --- commit


class ErrWrongOuterStep(ChainError):
    """The message names an outer step that is not current."""

    code = 20


class ErrNotTrainPhase(ChainError):
    """Training of this outer step has not started."""

    code = 21


class ErrLateCommit(ChainError):
    """The commit deadline has passed."""

    code = 22


class ErrNotHost(ChainError):
    """The creator is not an active bonded host of the run."""

    code = 23


class ErrBaseModelMismatch(ChainError):
    """base_model_hash is not the global model hash."""

    code = 24


class ErrCodecMismatch(ChainError):
    """The commit's codec is not the run's codec."""

    code = 25


class ErrLeafCount(ChainError):
    """leaf_count is not H/k + 1."""

    code = 26


class ErrBadTokens(ChainError):
    """tokens is not H * batch_size * seq_len."""

    code = 27


class ErrEnvMismatch(ChainError):
    """The environment's thread count is not the run's."""

    code = 28


class ErrDuplicateCommit(ChainError):
    """The same commitment was already recorded."""

    code = 29


# --- reveal


class ErrNoCommitment(ChainError):
    """The host has no commitment in this outer step."""

    code = 30


class ErrNotRevealPhase(ChainError):
    """The challenge for this outer step is not derived yet."""

    code = 31


class ErrLateReveal(ChainError):
    """The reveal window has closed: the reveal deadline and its grace (`reveal_closes`)."""

    code = 32


class ErrAlreadyRevealed(ChainError):
    """The host already revealed this outer step."""

    code = 33


class ErrWrongOpenings(ChainError):
    """The openings are not exactly the sampled segments in order."""

    code = 34


class ErrBadProof(ChainError):
    """A Merkle pair proof does not verify against the trajectory root."""

    code = 35


# --- verdict


class ErrNotVerdictPhase(ChainError):
    """Verdicts are accepted only during reveal/verify/escalation."""

    code = 40


class ErrLateVerdict(ChainError):
    """The verdict deadline of the current round has passed."""

    code = 41


class ErrNotAssignedVerifier(ChainError):
    """The creator is not assigned to this host."""

    code = 42


class ErrDuplicateVerdict(ChainError):
    """The verifier already judged this contribution."""

    code = 43


class ErrAlreadyDecided(ChainError):
    """This contribution was already finalized."""

    code = 44


# --- outer result


class ErrNotResultPhase(ChainError):
    """The outer step is not awaiting its result."""

    code = 50


class ErrNotAcceptedHost(ChainError):
    """Only accepted hosts of the step report its result."""

    code = 51


class ErrDuplicateOuterResult(ChainError):
    """The host already reported this result."""

    code = 52


class ErrDuplicateReport(ChainError):
    """The host already reported unavailable Δs in this result round."""

    code = 53


class ErrReportAfterVote(ChainError):
    """The host voted for a result in this round: it had every Δ."""

    code = 54


class ErrNotInResultSet(ChainError):
    """A reported host is not in the current result round's accepted set."""

    code = 55


# --- overlapped schedule (specs/protocol.md §2.2.1)


class ErrStepNotInFlight(ChainError):
    """Overlapped run: the named outer step is not open (not yet opened, or already done)."""

    code = 60


class ErrPreviousResultPending(ChainError):
    """Overlapped run: the step's Δs apply to the previous step's result, which is not adopted yet."""

    code = 61


# --- model size (specs/protocol.md §2.4, MsgCreateRun)


class ErrModelTooLarge(ChainError):
    """The run's model has more parameters (or tensors) than the chain's max_model_params (tensors)."""

    code = 70


class ErrBadModelSpec(ChainError):
    """The chain cannot count the run's model: an unknown factory without a declared param_count, or
    a config its factory would refuse, or a seq_len beyond the model's context."""

    code = 71


# --- error feedback (codec sparse, specs §4.1)


class ErrMissingEFHash(ChainError):
    """A sparse run's commit names no `final_ef_hash`: the accumulator it carries on would be
    unbound, so nothing could check that its next payload is C(β·e + Δ)."""

    code = 80


class ErrUnexpectedEFHash(ChainError):
    """A commit of a run whose codec is not sparse names a `final_ef_hash`: such runs carry no
    accumulator, and a field nobody checks must not enter the state."""

    code = 81


ERRORS: dict[int, type[ChainError]] = {cls.code: cls for cls in ChainError.__subclasses__()}
"""Every named error by code (the app and the client map codes back to names with it)."""
assert len(ERRORS) == len(ChainError.__subclasses__()), "error codes must be unique"
