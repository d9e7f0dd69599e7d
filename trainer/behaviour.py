"""How a host behaves at the protocol's decision points: honest here, adversarial in subclasses.

The node calls seven hooks at fixed points of every outer step and does everything else itself
(phases, deadlines, serving, fetching, aggregation), so an adversary overrides exactly the
decision it cheats on and nothing else. `OuterContext` gives a hook what any of the adversaries in
`gonka_diloco/adversaries/hosts.py` needs: the run config, the data, G_n, the host's model and
carried optimizer, the state store, a blob fetcher (to copy another host's Δ) and the chain.

Hook order in one outer step:
  make_contribution(ctx) -> commit_messages(c, ctx) -> [challenge] -> should_reveal(c, ctx)
  -> [verification] -> finalized(c, accepted, ctx)
  -> per result round, while this host is in the round's accepted set and has not voted:
     result_vote(model_hash, ctx), and if that is None and some Δ could not be fetched,
     report_unavailable(hosts, ctx)
  with serve_blob(kind, hash, data) on every GET while the step's blobs are published.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from chain.client import ChainClient
from nodekit.blobs import BlobClient
from nodekit.globalmodel import GlobalModel
from nodekit.objects import Kind, ObjectRef
from nodekit.statestore import StateStore
from nodekit.store import BytesSink
from protocol.codecs import delta_hash, encode, payload_len
from protocol.config import RunConfig
from protocol.merkle import merkle_root
from protocol.messages import MsgCommitPseudoGradient
from replay.data import Corpus
from replay.step import LossFn, env_fingerprint, optimizer_hash
from trainer.commit import CommitJob, TrainedStep, pseudo_gradient, run_committed
from trainer.ddp import Team
from trainer.errorfeedback import CarriedEF


class BehaviourError(ValueError):
    """A behaviour was configured with parameters it does not know or cannot use."""


@dataclass(frozen=True)
class AcceptedDelta:
    """One accepted contribution of an earlier outer step, as the chain lists it."""

    host: str
    delta_hash: str
    tokens: int
    endpoint: str | None


@dataclass
class OuterContext:
    """Everything a hook may use for outer step `outer_step` of run `run_id`.

    `model` and `optimizer` are the host's own: the optimizer already carries the state the
    chain expects this step to start from (the last accepted one, or fresh). `optimizer` is
    None in hooks called after a restart, when the node did not train in this process. `team` is
    the host's other torchrun ranks (None: one process); `train()` trains with them.
    """

    cfg: RunConfig
    run_id: int
    address: str
    outer_step: int
    global_model: GlobalModel
    model: nn.Module
    optimizer: torch.optim.Optimizer | None
    loss_fn: LossFn
    data: Corpus
    store: StateStore
    blobs: BlobClient
    chain: ChainClient
    previous_accepted: Sequence[AcceptedDelta] = ()
    peers: Sequence[str] = ()  # blob endpoints of the run's other hosts
    extra: dict[str, Any] = field(default_factory=dict)
    team: Team | None = None
    start_params: Mapping[str, Tensor] | None = None
    """The params this step trains from when they are not G_n's: an eager run's start (specs
    §2.2.1, `nodekit.eager`), computed on read. None: G_n (`global_model.params`)."""
    ef: CarriedEF | None = None
    """Codec sparse: the error-feedback accumulator the chain names for this step's start and where
    e_next goes (specs §4.1); `train()` encodes with it. None for the other codecs."""

    @property
    def inner_optimizer(self) -> torch.optim.Optimizer:
        """`optimizer`, where the hook trains (`make_contribution`); elsewhere it is None."""
        if self.optimizer is None:
            raise BehaviourError("this hook has no optimizer: only make_contribution trains")
        return self.optimizer

    @property
    def start(self) -> Mapping[str, Tensor]:
        """The params the chain's rule says this step starts from, and Δ is measured against."""
        return self.global_model.params if self.start_params is None else self.start_params

    def job(self, start: Mapping[str, Tensor] | None = None) -> CommitJob:
        """This step's training job in this process: the run's data, this host, the model's loss,
        from `start` (default: the chain's rule, `self.start`) against G_n, into the host's store."""
        return CommitJob(
            self.cfg, self.data, self.address, self.outer_step, loss_fn=self.loss_fn,
            start_params=self.start if start is None else start, base_model_hash=self.global_model.hash,
            store=self.store, ef=self.ef,
        )  # fmt: skip

    def train(
        self, *, host: str | None = None, data: Corpus | None = None, keep_delta: bool = True
    ) -> TrainedStep:
        """The honest committed loop from this step's start (G_n, or an eager run's start);
        `host`/`data` let a wrong-data adversary lie.

        With a team every rank trains a slice of each batch; a substituted corpus cannot be sent
        to the other ranks, so that one trains in this process alone. `keep_delta=False`: the
        contribution carries only the Δ payload, not the fp32 Δ (4 B/param the honest host never
        needs).
        """
        if self.optimizer is None:
            raise BehaviourError("train() is only available in make_contribution")
        if self.team is not None and self.team.shard_state and data is not None:
            raise BehaviourError("a sharded team trains the run's corpus only (rank 0 has 1/W of the state)")
        if self.team is not None and self.ef is not None:
            raise BehaviourError("codec sparse with a torchrun team is not supported yet (error feedback)")
        job = self.job()
        if host is not None:
            job = dataclasses.replace(job, host=host)
        if self.team is not None and data is None:
            return self.team.train(job, self.model, self.optimizer, keep_delta=keep_delta)
        if data is not None:
            job = dataclasses.replace(job, data=data)
        return run_committed(job, self.model, self.optimizer, keep_delta=keep_delta)

    def assemble(
        self, leaves: Sequence[str], final_state: Mapping[str, Tensor], losses: Sequence[float]
    ) -> TrainedStep:
        """A contribution from a hand-made trajectory: leaves already saved in `store`, and the
        final training state whose params define Δ (the lazy adversary fakes boundaries this way)."""
        params = {k.removeprefix("param/"): v for k, v in final_state.items() if k.startswith("param/")}
        g = self.start
        delta = {n: (g[n] - params[n]).to(torch.float32) for n in g}
        payload = encode(delta, self.cfg.codec, self.cfg.codec_block_size, self.cfg.codec_topk or None)
        return TrainedStep(
            outer_step=self.outer_step,
            base_model_hash=self.global_model.hash,
            leaves=list(leaves),
            trajectory_root=merkle_root([bytes.fromhex(h) for h in leaves]).hex(),
            delta=delta,
            payload=payload,
            delta_hash=delta_hash(payload, self.cfg.state_chunk_bytes),
            codec=self.cfg.codec,
            final_optimizer_hash=optimizer_hash(final_state, self.cfg.state_chunk_bytes),
            tokens=self.cfg.tokens_per_outer_step,
            env=env_fingerprint(self.cfg.threads),
            mean_loss=sum(losses) / len(losses) if losses else float("nan"),
            losses=list(losses),
        )

    def with_delta(self, contribution: TrainedStep, delta: Mapping[str, Tensor]) -> TrainedStep:
        """The same trajectory committed with another Δ (noise, zero, scaled, sign-flipped)."""
        payload = encode(delta, self.cfg.codec, self.cfg.codec_block_size, self.cfg.codec_topk or None)
        return self.with_payload(contribution, payload, dict(delta))

    def with_payload(
        self, contribution: TrainedStep, payload: bytes, delta: dict[str, Tensor] | None = None
    ) -> TrainedStep:
        """The same trajectory committed with an already-encoded payload (a copied or broken Δ)."""
        kept = delta if delta is not None else {}
        h = delta_hash(payload, self.cfg.state_chunk_bytes)
        return dataclasses.replace(contribution, payload=payload, delta_hash=h, delta=kept)

    def honest_delta(self) -> dict[str, Tensor]:
        """Δ of the model as it stands now against this step's start (G_n, or the eager start)."""
        return pseudo_gradient(self.start, self.model)

    def fetch_delta(self, entry: AcceptedDelta, max_payload_bytes: int | None = None) -> bytes:
        """Download another host's accepted Δ payload (as any node may), every chunk verified
        against its hash; its exact length comes from the run's layout and codec."""
        cfg = self.cfg
        layout = self.global_model.layout
        length = payload_len(cfg.codec, cfg.codec_block_size, layout, cfg.codec_topk or None)
        if max_payload_bytes is not None and length > max_payload_bytes:
            raise ValueError(f"a Δ of this run is {length} bytes > {max_payload_bytes}")
        ref = ObjectRef(Kind.DELTA, entry.delta_hash, length, cfg.state_chunk_bytes)
        sink = BytesSink(length)
        endpoints = [e for e in [entry.endpoint, *self.peers] if e]
        self.blobs.fetch(ref, sink, endpoints)
        return bytes(sink.buf)


class HostBehaviour:
    """The honest host. Subclasses override hooks; `params` come from host.toml's
    `behaviour_params` and unknown ones are refused (a typo must not silently mean honest)."""

    name = "honest"
    allowed_params: frozenset[str] = frozenset()
    keeps_delta = False
    """Whether `make_contribution`'s contribution carries the fp32 Δ (`TrainedStep.delta`) for a
    later hook (an equivocator halves it in `commit_messages`); the honest host needs only the payload."""
    trains_ahead = True
    """Overlapped runs: train the next step as soon as the chain has fixed its start, before it
    opens (`HostNode._train_ahead`). Adversaries do not: their hooks may read what only an open
    step has (e.g. the previous step's accepted set)."""

    def __init__(self, **params: Any) -> None:
        unknown = set(params) - self.allowed_params
        if unknown:
            raise BehaviourError(f"behaviour {self.name!r} does not take {sorted(unknown)}")
        self.params = params

    def make_contribution(self, ctx: OuterContext) -> TrainedStep:
        """Train H inner steps from G_n with the carried optimizer and commit to the trajectory."""
        return ctx.train(keep_delta=self.keeps_delta)

    def commit_messages(self, contribution: TrainedStep, ctx: OuterContext) -> list[MsgCommitPseudoGradient]:
        """What to broadcast before the commit deadline (an equivocator returns two)."""
        return [contribution.to_msg(ctx.address, ctx.run_id)]

    def should_reveal(self, contribution: TrainedStep, ctx: OuterContext) -> bool:
        """Whether to open the sampled segments (a no-reveal adversary says no)."""
        return True

    def serve_blob(self, kind: str, blob_hash: str, data: bytes) -> bytes | None:
        """The bytes to answer a GET with, or None to refuse (malformed-blob adversaries tamper)."""
        return data

    def serve_bytes_per_s(self, kind: str, blob_hash: str) -> float | None:
        """A pace to serve an object at, or None for as fast as the link goes (a trickler paces
        its own Δ to stall whoever waits for it)."""
        return None

    def finalized(self, contribution: TrainedStep | None, accepted: bool, ctx: OuterContext) -> None:
        """The step's verification is over: `accepted` says whether this host's contribution (None if
        it made none) is in the result set. A withholder stops serving its Δ from here on."""

    def result_vote(self, model_hash: str | None, ctx: OuterContext) -> str | None:
        """The G_{n+1} hash to vote for in this result round: `model_hash` is what the node computed
        over the round's accepted set (None: some Δ could not be fetched). None = no vote."""
        return model_hash

    def result_loss(self, val_loss_ppm: int, ctx: OuterContext) -> int:
        """The validation loss to send with the vote (10⁻⁶ nats; 0 = none): the node's own
        evaluation of the model it votes for. Informational on chain; a report takes the median."""
        return val_loss_ppm

    def report_unavailable(self, hosts: Sequence[str], ctx: OuterContext) -> list[str]:
        """The hosts to name in `MsgReportUnavailable`: the node passes the accepted Δs it could not
        fetch from anyone (with retries, every holder) by the middle of the round. [] = no report."""
        return list(hosts)
