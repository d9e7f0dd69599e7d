"""The host's last phase, aggregate: follow step n's result rounds to the end. In every round whose
accepted set holds this host it fetches each Δ of the set, computes G_{n+1} over it (the one way
`nodekit.nextmodel` computes it), evaluates it and votes; what cannot be fetched in time is
reported unavailable. Then it adopts what the chain adopted.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from chain.client import TxFailed
from nodekit.blobs import BlobError
from nodekit.board import NodePhase
from nodekit.chainview import Outcome, Phase, ResultRound, StepInfo
from nodekit.globalmodel import GlobalModel
from nodekit.memory import release
from protocol.messages import MsgReportUnavailable, MsgSubmitOuterResult
from replay.data import eval_loss
from trainer.behaviour import OuterContext
from trainer.commit import TrainedStep

if TYPE_CHECKING:
    from trainer.node import HostNode

VAL_BATCHES = 4
"""Validation batches a host evaluates each candidate and adopted G on."""


@dataclass
class _Result:
    """What this host knows of one step's result rounds: the set it last computed G_{n+1} over,
    that model, and the Δs it could not fetch (or that do not decode) for the current set."""

    hosts: tuple[str, ...] | None = None
    model: GlobalModel | None = None
    missing: list[str] = field(default_factory=list)
    unusable: set[str] = field(default_factory=set)
    val_loss_ppm: int = 0  # our validation loss of `model`, sent with the vote (specs §2.7)


class AggregatePhase:
    """Aggregate for one host (`phase(n, contribution)`)."""

    def __init__(self, host: HostNode) -> None:
        self.h = host
        self.candidate_losses: dict[str, float] = {}
        """The validation loss of the last candidate evaluated for a vote (reused on adoption)."""

    def phase(self, n: int, mine: TrainedStep | None) -> None:
        """Follow step n's result rounds to its end. In every round whose accepted set holds this
        host: fetch each Δ of the set from every holder, compute G_{n+1} over it and vote; what
        cannot be fetched by the middle of the round (retried every block) is reported
        unavailable, and a later vote withdraws the report. Then adopt what the chain adopted: the
        majority's G_{n+1}, or G_n when the step closed unchanged."""
        # overlapped runs: the Δs apply to the previous step's result, known once that is adopted.
        # Polled every block, not from the verify deadline read earlier: with early close (§2.3.1)
        # the deadlines move up after they were read, and the step may finalize long before.
        info = self.h.view.wait_step(
            n, lambda i: i.finalized_height is not None and i.apply_to_hash is not None
        )
        if not self.h.overlapped:
            self.h.rt.set(phase=NodePhase.AGGREGATING)
        outcome = info.outcomes.get(self.h.address)
        ok = outcome in (Outcome.ACCEPTED, Outcome.WITHHELD)  # verified; dropped later or not
        if mine is not None:
            self.h.count("accepted" if ok else "rejected")
            (self.h.metrics.accepted if ok else self.h.metrics.rejected).inc()
            self.h.log("outcome", outer_step=n, outcome=outcome)
        try:  # G_n: the step's base, or in an overlapped run the previous step's result (§2.2.1)
            gm = self.h.models.get(info.apply_to_hash or info.base_model_hash)
        except (BlobError, ValueError, OSError) as e:  # G_n itself unavailable: take the chain's G_{n+1}
            self.h.log("outer_step_unavailable", outer_step=n, error=f"{type(e).__name__}: {e}")
            gm = None
        ctx = self.h.context(n, gm, None) if gm is not None else None
        if ctx is not None:
            self.h.behaviour.finalized(mine, ok, ctx)
        result = _Result()
        sent: set[tuple[str, int]] = set()  # (vote | report, round) already broadcast by this process
        while info.phase is Phase.AWAITING_RESULT and gm is not None and ctx is not None:
            rr = self.h.view.result_round(n)
            if rr.result_round == info.result_round and self.h.address in rr.hosts:
                self.result_round(n, gm, rr, info, result, ctx, sent)
            info = self.h.view.wait_step(n, lambda i: True, info.height + 1)
        done = self.h.view.wait_step(n, lambda i: i.phase is Phase.DONE)
        self.follow_result(n, done, gm, result)
        self.h.retention.prune(n)

    def result_round(
        self, n: int, gm: GlobalModel, rr: ResultRound, info: StepInfo, result: _Result,
        ctx: OuterContext, sent: set[tuple[str, int]],
    ) -> None:  # fmt: skip
        """One block of one result round (called again every block until the step is done)."""
        key = tuple(rr.hosts)
        if result.hosts != key:
            fetched = self.h.models.fetch_deltas(n, rr.accepted)
            result.missing = sorted({*fetched, *(result.unusable & set(key))})
            if not result.missing:
                new = self.h.models.compute(n, gm, rr.accepted, result.unusable)
                if new is not None:
                    self.keep_candidate(result, key, new)
                    self.h.log(
                        "outer_step_computed", outer_step=n, round=rr.result_round, model_hash=new.hash
                    )
        if self.h.address in info.result_votes or ("vote", rr.result_round) in sent:
            return
        computed = result.model.hash if result.model is not None and result.hosts == key else None
        vote = self.h.behaviour.result_vote(computed, ctx)
        if vote is not None:
            sent.add(("vote", rr.result_round))
            loss = result.val_loss_ppm if vote == computed else 0
            msg = MsgSubmitOuterResult(
                creator=self.h.address,
                run_id=self.h.config.run_id,
                outer_step=n,
                model_hash=vote,
                val_loss_ppm=self.h.behaviour.result_loss(loss, ctx),
            )
            self.send(n, "result", msg, round=rr.result_round, model_hash=vote)
            return
        blocks = self.h.cfg.phases.result_blocks
        deadline = rr.result_deadline if rr.result_deadline is not None else info.height
        report_from = deadline - blocks + blocks // 2  # half the round is grace for a holder's outage
        if not result.missing or info.height < report_from or self.h.address in info.unavailable:
            return
        if ("report", rr.result_round) in sent:
            return
        hosts = self.h.behaviour.report_unavailable(result.missing, ctx)
        if hosts:
            sent.add(("report", rr.result_round))
            report = MsgReportUnavailable(
                creator=self.h.address, run_id=self.h.config.run_id, outer_step=n, hosts=hosts
            )
            self.send(n, "report_unavailable", report, round=rr.result_round, hosts=hosts)

    def send(self, n: int, what: str, msg: Any, **fields: Any) -> None:
        try:
            self.h.rt.broadcast([msg])
        except TxFailed as e:
            self.h.log(f"{what}_refused", outer_step=n, error=e.log)
            return
        self.h.log(what, outer_step=n, **fields)

    def keep_candidate(self, result: _Result, hosts: tuple[str, ...], new: GlobalModel) -> None:
        """Our G_{n+1} over a round's set: on disk and served at once (a peer that could not compute
        it fetches it by hash once it is adopted); the previous round's candidate leaves memory."""
        if result.model is not None and result.model.hash != new.hash:
            self.h.models.forget(result.model.hash)
        result.hosts, result.model = hosts, new
        self.h.models.keep(new)
        result.val_loss_ppm = self.candidate_loss_ppm(new)

    def candidate_loss_ppm(self, gm: GlobalModel) -> int:
        """The validation loss of a candidate G_{n+1}, as the vote carries it (10⁻⁶ nats, 0 if not
        finite): what a report reads after the nodes exited. Evaluated like `_adopt` does (the
        replica in an overlapped run); `_adopt` reuses it for the model the chain adopts."""
        beside = self.h.overlapped
        with self.h.replica_lock if beside else contextlib.nullcontext():
            model = self.h.replica_model() if beside else self.h.model
            gm.load_into(model)
            loss = eval_loss(
                model, self.h.corpus.val, VAL_BATCHES, self.h.cfg.seed,
                batch_size=self.h.cfg.batch_size, seq_len=self.h.cfg.seq_len, loss_fn=self.h.loss_fn,
            )  # fmt: skip
        self.candidate_losses = {gm.hash: loss}
        return round(loss * 1e6) if math.isfinite(loss) and 0 < loss < 1e9 else 0

    def follow_result(self, n: int, done: StepInfo, gm: GlobalModel | None, result: _Result) -> None:
        """Adopt what the chain adopted: our own G_{n+1} if it is the one, G_n if the step closed
        unchanged, else computed over the final set or fetched by its hash from the holders."""
        target = done.result_hash or done.apply_to_hash or done.base_model_hash
        voted = done.result_votes.get(self.h.address)
        if voted is not None and voted != target:
            self.h.log("result_differs", outer_step=n, chain=target, mine=voted)
        if result.model is not None and result.model.hash == target:
            new = result.model
        elif gm is not None and target == gm.hash:
            new = gm  # no majority in any round: G_{n+1} = G_n
            self.h.log("outer_step_unchanged", outer_step=n, model_hash=target, dropped=done.dropped)
        else:
            fresh = None
            if gm is not None:
                rr = self.h.view.result_round(n)
                if not self.h.models.fetch_deltas(n, rr.accepted):
                    fresh = self.h.models.compute(n, gm, rr.accepted)
            new = fresh if fresh is not None and fresh.hash == target else self.h.models.get(target)
        self.adopt(n, new)

    def adopt(self, n: int, gm: GlobalModel) -> None:
        beside = self.h.overlapped  # the training model is busy with the next step: evaluate on the replica
        with self.h.replica_lock if beside else contextlib.nullcontext():
            model = self.h.replica_model() if beside else self.h.model
            gm.load_into(model)
            stored = gm.stored
            gm = self.h.models.keep(gm, read_from_disk=True)  # read from disk when used from here on
            if not stored:
                release()  # G_{n+1}'s 8 B/param go now
            known = self.candidate_losses.get(gm.hash)  # evaluated for the vote
            loss = (
                known
                if known is not None
                else eval_loss(
                    model,
                    self.h.corpus.val,
                    VAL_BATCHES,
                    self.h.cfg.seed,
                    batch_size=self.h.cfg.batch_size,
                    seq_len=self.h.cfg.seq_len,
                    loss_fn=self.h.loss_fn,
                )
            )
        with self.h.lock:
            self.h.state.setdefault("val_loss", {})[str(n)] = loss
            self.h.save_state()
        self.h.metrics.val_loss.set(loss)
        self.h.rt.board.set(val_loss=dict(self.h.state["val_loss"]))
        self.h.log("outer_step_applied", outer_step=n, model_hash=gm.hash, val_loss=round(loss, 4))
