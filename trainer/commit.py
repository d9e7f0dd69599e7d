"""The committed inner loop: H steps of `train_segment`, a trajectory leaf every k steps, then Δ.

Boundary work (hash the full training state, save it) runs on a worker thread from a snapshot, so
the training thread only pays for one memory copy per boundary. Everything a host later commits
and reveals is in the returned `Contribution`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from protocol.codecs import delta_hash, encode
from protocol.config import Codec, RunConfig
from protocol.merkle import merkle_root, pair_proof
from protocol.messages import EnvFingerprint, MsgCommitPseudoGradient, SegmentOpening
from trainer.data import Corpus
from trainer.model import lm_loss
from trainer.step import (
    LossFn,
    SliceExchange,
    env_fingerprint,
    optimizer_hash,
    snapshot_to_host,
    train_segment,
    training_hash,
    training_state,
)
from trainer.store import StateStore


@dataclass(frozen=True)
class Contribution:
    """One host's outer step: what it commits now and what it can open later."""

    outer_step: int
    base_model_hash: str
    leaves: list[str]
    trajectory_root: str
    delta: dict[str, Tensor] = field(repr=False)
    payload: bytes = field(repr=False)
    delta_hash: str
    codec: Codec
    final_optimizer_hash: str
    tokens: int
    env: EnvFingerprint
    mean_loss: float
    losses: list[float] = field(repr=False)

    @property
    def leaf_count(self) -> int:
        return len(self.leaves)

    def to_msg(self, creator: str, run_id: int) -> MsgCommitPseudoGradient:
        return MsgCommitPseudoGradient(
            creator=creator,
            run_id=run_id,
            outer_step=self.outer_step,
            base_model_hash=self.base_model_hash,
            trajectory_root=self.trajectory_root,
            leaf_count=self.leaf_count,
            delta_hash=self.delta_hash,
            final_optimizer_hash=self.final_optimizer_hash,
            codec=self.codec,
            tokens=self.tokens,
            env=self.env,
        )


def param_tensors(model: nn.Module) -> dict[str, Tensor]:
    """Parameters by name, as copies: the naming Δ and the global model use."""
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def pseudo_gradient(global_params: Mapping[str, Tensor], model: nn.Module) -> dict[str, Tensor]:
    """Δ = θ_global − θ_local (float32), name for name."""
    return {n: (global_params[n] - p.detach().to(global_params[n].device)).to(torch.float32)
            for n, p in model.named_parameters()}  # fmt: skip


def _boundary(store: StateStore | None, outer_step: int, snapshot: dict[str, Tensor]) -> str:
    h = training_hash(snapshot)
    if store is not None:
        store.put_hashed(snapshot, outer_step, h)
    return h


def run_committed(
    model: nn.Module,
    opt: torch.optim.Optimizer,
    cfg: RunConfig,
    data: Corpus,
    host: str,
    outer_step: int,
    global_params: Mapping[str, Tensor],
    base_model_hash: str,
    store: StateStore | None = None,
    *,
    micro_batches: int = 1,
    loss_fn: LossFn = lm_loss,
    exchange: SliceExchange | None = None,
) -> Contribution:
    """Train one outer step from the global params with the host's carried optimizer state."""
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(global_params[n])
    k = cfg.segment_len
    losses: list[float] = []
    futures: list[Future[str]] = []
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="boundary") as pool:
        for seg in range(cfg.n_segments + 1):
            snap = snapshot_to_host(training_state(model, opt), opt)  # waited for on the worker
            futures.append(pool.submit(_boundary, store, outer_step, snap))
            if seg < cfg.n_segments:
                losses += train_segment(
                    model, opt, cfg, data, host, outer_step, seg * k, k, micro_batches,
                    loss_fn=loss_fn, exchange=exchange,
                )  # fmt: skip
        leaves = [f.result() for f in futures]
    final = training_state(model, opt)
    delta = pseudo_gradient(global_params, model)
    payload = encode(delta, cfg.codec, cfg.codec_block_size)
    return Contribution(
        outer_step=outer_step,
        base_model_hash=base_model_hash,
        leaves=leaves,
        trajectory_root=merkle_root([bytes.fromhex(h) for h in leaves]).hex(),
        delta=delta,
        payload=payload,
        delta_hash=delta_hash(payload),
        codec=cfg.codec,
        final_optimizer_hash=optimizer_hash(final),
        tokens=cfg.tokens_per_outer_step,
        env=env_fingerprint(micro_batches=micro_batches),
        mean_loss=sum(losses) / len(losses),
        losses=losses,
    )


def openings(contribution: Contribution, segments: Sequence[int]) -> list[SegmentOpening]:
    """Both ends of each sampled segment with one pair proof against the trajectory root."""
    raw = [bytes.fromhex(h) for h in contribution.leaves]
    out = []
    for s in segments:
        if not 0 <= s < len(raw) - 1:
            raise ValueError(f"segment {s} outside 0..{len(raw) - 2}")
        proof = [p.hex() for p in pair_proof(raw, s)]
        out.append(
            SegmentOpening(
                segment=s, start_leaf=contribution.leaves[s], end_leaf=contribution.leaves[s + 1], proof=proof
            )
        )
    return out
