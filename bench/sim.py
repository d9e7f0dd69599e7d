"""In-process DiLoCo simulation for the benchmarks: M hosts, one global model, no chain, no HTTP.

It runs the real protocol code paths a node runs: `trainer.commit.run_committed` per host (PRF
batches, trajectory leaves, encoded Δ), `verifier.verify.verify` on every contribution (replay of
the sampled segments, Δ check), `protocol.codecs` blob round trips, and
`protocol.outer.outer_update` over the accepted decoded Δs. What it leaves out is transport and
consensus, which do not change the numbers measured here (losses and bytes).

Runs are described by JSON-able dicts and executed in child processes (`python -m bench.sim`),
two at a time on two cores, each pinned to one thread: results cross the process boundary as
JSON, never pickle.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from protocol.codecs import decode, delta_hash, encode, from_blob, to_blob
from protocol.config import (
    Codec,
    InnerOptim,
    ModelSpec,
    Moments,
    OuterOptim,
    OuterRule,
    RunConfig,
    SparseMean,
)
from protocol.errorfeedback import EFConfig, ef_hash, ef_step, verify_ef_step
from protocol.merkle import merkle_root
from protocol.outer import (
    SparseAccumulator,
    apply_rule,
    eager_start,
    global_model_hash,
    outer_update,
    weighted_mean,
)
from protocol.prf import sample_segments
from replay.data import Corpus, batch, eval_loss, open_dataset
from replay.model import lm_loss
from replay.spec import build_model
from replay.step import (
    State,
    configure_determinism,
    lr_at,
    make_optimizer,
    training_hash,
    training_state,
)
from trainer.commit import CommitJob, TrainedStep, openings, param_tensors, run_committed

Params = dict[str, Tensor]
RESULTS_DIR = Path(__file__).parent / "results"

# A model that trains visibly within minutes on 2 CPU cores (≈135k parameters).
BENCH_MODEL: dict[str, int | float | bool] = {"n_layer": 2, "n_head": 2, "n_embd": 64, "block_size": 64}


@dataclass(frozen=True)
class Setup:
    """One experiment's shape. Total inner-step compute = hosts × inner_steps × outer_steps batches."""

    hosts: int = 4
    inner_steps: int = 50  # H
    outer_steps: int = 10  # T
    segment_len: int = 5  # k
    sampled_segments: int = 2  # s
    batch_size: int = 8
    seq_len: int = 64
    codec: str = "int8"
    seed: int = 0
    warm_start: int = 0  # data-parallel steps from the init first: DiLoCo starts from a checkpoint
    eval_batches: int = 16
    model: tuple[tuple[str, Any], ...] = tuple(BENCH_MODEL.items())
    factory: str = "trainer.model:small_gpt"
    dataset: str = ""  # a prepared dataset (folder or URL); '' = Shakespeare's byte-token manifest
    inner_lr: float = 4e-4
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    warmup_steps: int = 0
    cosine: bool = False  # decay the inner lr to 10% over the run (T·H steps per host), as the paper
    init_params: str = ""  # start from these saved parameters (a warm start computed once)
    codec_chunk: int = 4096  # codec "sparse": the chunk C (other codecs keep block size 256)
    codec_topk: int = 0  # codec "sparse": entries kept per chunk (0 = C/64)
    ef_decay: float = 1.0  # codec "sparse": β of the error-feedback accumulator
    outer_rule: str = "nesterov"  # or "average" (SparseLoCo: θ − lr·mean, no momentum)
    sparse_mean: str = "hosts"  # codec "sparse": or "contributors" (SparseLoCo's per-coordinate mean)
    ef_reset: bool = False  # codec "sparse", research: every step from e = 0 (no error feedback carried)
    moments: str = "fp32"  # or "int8": block-wise 8-bit AdamW moments (InnerOptim.moments, specs §6.2.1)

    def spec(self) -> ModelSpec:
        return ModelSpec(factory=self.factory, config=dict(self.model))

    def inner(self) -> InnerOptim:
        decay = self.outer_steps * self.inner_steps if self.cosine else 0
        return InnerOptim(lr=self.inner_lr, warmup_steps=self.warmup_steps, decay_steps=decay,
                          min_lr_fraction=0.1 if self.cosine else 0.0,
                          moments=Moments(self.moments))  # fmt: skip

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Setup:
        d = dict(d)
        if "model" in d:
            d["model"] = tuple((k, v) for k, v in d["model"])
        return cls(**d)

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["model"] = [list(kv) for kv in self.model]
        return d


def host_names(n: int) -> list[str]:
    """Stable pseudo-addresses; the PRF and the outer step's sort order only need distinct strings."""
    return [f"gonka1bench{i:03d}" for i in range(n)]


@dataclass
class Env:
    setup: Setup
    cfg: RunConfig
    corpus: Corpus
    hosts: list[str]


def make_env(setup: Setup) -> Env:
    """The run config and the corpus, read through the token-shard path the nodes use."""
    corpus = open_dataset(setup.dataset)
    sparse: dict[str, Any] = {}
    if setup.codec == Codec.SPARSE:
        sparse = {"codec_block_size": setup.codec_chunk, "codec_topk": setup.codec_topk,
                  "codec_ef_decay": setup.ef_decay}  # fmt: skip
    cfg = RunConfig(
        model=setup.spec(), dataset_manifest_hash=corpus.manifest_hash, initial_model_hash="0" * 64,
        seed=setup.seed, inner_steps=setup.inner_steps, segment_len=setup.segment_len,
        sampled_segments=setup.sampled_segments, batch_size=setup.batch_size, seq_len=setup.seq_len,
        data_shards=max(8, setup.hosts), codec=Codec(setup.codec), threads=1, inner=setup.inner(),
        outer=OuterOptim(lr=setup.outer_lr, momentum=setup.outer_momentum, rule=OuterRule(setup.outer_rule),
                         sparse_mean=SparseMean(setup.sparse_mean)),
        **sparse,
    )  # fmt: skip
    return Env(setup, cfg, corpus, host_names(setup.hosts))


def n_params(params: Mapping[str, Tensor]) -> int:
    return sum(t.numel() for t in params.values())


def ring_allreduce_bytes(hosts: int, params: int, steps: int) -> float:
    """Bytes each worker sends in a ring all-reduce of fp32 gradients, `steps` times."""
    return 2 * (hosts - 1) / hosts * 4 * params * steps


def evaluate(env: Env, model: nn.Module, params: Mapping[str, Tensor] | None = None) -> float:
    """Validation loss on the same PRF-chosen windows for every contender."""
    if params is not None:
        with torch.no_grad():
            for n, p in model.named_parameters():
                p.copy_(params[n])
    return eval_loss(model, env.corpus.val, env.setup.eval_batches, seed=1234, batch_size=16, seq_len=64)


def roundtrip(delta: Mapping[str, Tensor], codec: Codec, block: int) -> tuple[Params, int]:
    """What every node does with a Δ: encode → blob (the bytes on the wire) → decode."""
    payload = encode(delta, codec, block)
    blob = to_blob(payload)
    layout = {n: tuple(t.shape) for n, t in delta.items()}
    return decode(from_blob(blob, layout, max_payload_bytes=len(payload)), layout), len(blob)


# ---------------------------------------------------------------- hosts and verification


class MemStore:
    """In-memory stand-in for `nodekit.statestore.StateStore` that also serves as a verifier BlobSource.

    Disk I/O is what `bench.host_overhead` measures; here it would only slow the runs down.
    """

    checkpoint_every = 1  # every boundary kept (the host setting m of `StateStore`)

    def __init__(self) -> None:
        self.states: dict[str, State] = {}
        self.blobs: dict[str, bytes] = {}
        self.efs: dict[str, Params] = {}  # codec sparse: carried accumulators by their hash
        self.pending: list[Any] = []  # the last boundary's background write (`StateStore.pending`)

    def flush(self) -> None:
        while self.pending:
            self.pending.pop().result()

    def put_hashed(self, state: Mapping[str, Tensor], outer_step: int, h: str, digests: Any = None) -> None:
        """A copy: on CPU a boundary snapshot may be the live tensors, which training moves on."""
        self.states[h] = {k: v.clone() for k, v in state.items()}

    def stage_hashed(
        self, state: Mapping[str, Tensor], outer_step: int, h: str, digests: Any
    ) -> Callable[[], None]:
        """`StateStore.stage_hashed`: the copy now (the snapshot is released after it), nothing later."""
        self.put_hashed(state, outer_step, h, digests)
        return lambda: None

    def state(self, leaf_hash: str) -> State:
        return {k: v.clone() for k, v in self.states[leaf_hash].items()}

    def delta(self, delta_hash: str) -> bytes:
        return self.blobs[delta_hash]

    def error_feedback(self, h: str) -> Params:
        return self.efs[h]

    def clear(self) -> None:
        self.states.clear()
        self.blobs.clear()
        self.efs.clear()


@dataclass
class Host:
    """A host's own model and carried AdamW state (DiLoCo keeps inner moments across outer steps)."""

    name: str
    model: nn.Module
    opt: torch.optim.Optimizer
    prev_optimizer_hash: str | None = None
    ef: Params | None = None
    """Sparse codec: the error-feedback accumulator the chain names (of its last accepted Δ; None = 0)."""

    @classmethod
    def new(cls, env: Env, name: str) -> Host:
        model = build_model(env.setup.spec())
        return cls(name, model, make_optimizer(model, env.cfg.inner))

    def corrected(self, env: Env, n: int, start: Params, g: Params, tau: int) -> Any:
        """Research (`run_diloco(correct_at=…)`): train from `start`, move by g − start at inner step
        `tau`, train on; Δ = g − θ_H. Uncommitted: only Δ, tokens and the loss matter here."""
        from types import SimpleNamespace

        from replay.step import TrainJob, train_segment

        with torch.no_grad():
            for k, p in self.model.named_parameters():
                p.copy_(start[k])
        job = TrainJob(env.cfg, env.corpus, self.name, n)
        train_segment(job, self.model, self.opt, 0, tau)
        with torch.no_grad():
            for k, p in self.model.named_parameters():
                p.add_(g[k] - start[k])
        train_segment(job, self.model, self.opt, tau, env.cfg.inner_steps - tau)
        delta = {k: (g[k] - p.detach()).float() for k, p in self.model.named_parameters()}
        return SimpleNamespace(delta=delta, tokens=env.cfg.tokens_per_outer_step, final_optimizer_hash=None)

    def contribute(self, env: Env, n: int, g: Params, g_hash: str, store: MemStore | None) -> TrainedStep:
        job = CommitJob(
            env.cfg, env.corpus, self.name, n, start_params=g, base_model_hash=g_hash,
            store=store,  # type: ignore[arg-type]
        )  # fmt: skip
        return run_committed(job, self.model, self.opt)


def forge(
    env: Env, c: TrainedStep, bad: Mapping[str, Tensor], g: Params, store: MemStore, host: Host
) -> TrainedStep:
    """A consistent liar: the last leaf claims θ_H = G − Δ_bad, so root, Δ hash and Δ all agree.

    Only the replay of the (always sampled) last segment can expose it. The honest end state is
    the host's live one (bitwise mode persists no θ_H: the replay reproduces it).
    """
    final = training_state(host.model, host.opt, copy=True)
    for n, t in bad.items():
        final[f"param/{n}"] = g[n] - t
    leaf = training_hash(final)
    store.put_hashed(final, c.outer_step, leaf)
    leaves = [*c.leaves[:-1], leaf]
    delta = {n: g[n] - final[f"param/{n}"] for n in g}
    payload = encode(delta, env.cfg.codec, env.cfg.codec_block_size)
    return dataclasses.replace(
        c, leaves=leaves, trajectory_root=merkle_root([bytes.fromhex(h) for h in leaves]).hex(),
        delta=delta, payload=payload, delta_hash=delta_hash(payload),
    )  # fmt: skip


def verify_contribution(
    env: Env,
    c: TrainedStep,
    host: str,
    prev_opt: str | None,
    g: Params,
    store: MemStore,
    verifier: nn.Module,
    on_final: Callable[[Mapping[str, Tensor]], None] | None = None,
    start_ef: str | None = None,
) -> tuple[bool, str, int]:
    """Challenge from a per-step pseudo block hash, then the verifier node's own `verify`.

    Returns (accepted, reason name, replayed inner steps). `on_final` gets the verifier's own
    replayed θ_H (`ReplayContext.on_derived`: all checks passed, bit for bit the host's).
    """
    from verifier.job import Job, OpeningData, ReplayContext
    from verifier.verify import verify

    block = hashlib.sha256(f"bench:{env.cfg.seed}:{c.outer_step}".encode()).hexdigest()
    sampled = sample_segments(block, host, env.cfg.n_segments, env.cfg.sampled_segments)
    store.blobs[c.delta_hash] = to_blob(c.payload)
    ops = tuple(
        OpeningData(o.segment, o.start_leaf, o.end_leaf, tuple(o.proof)) for o in openings(c, sampled)
    )
    job = Job(
        run_id=1, outer_step=c.outer_step, host=host, cfg=env.cfg, trajectory_root=c.trajectory_root,
        leaf_count=c.leaf_count, delta_hash=c.delta_hash, final_optimizer_hash=c.final_optimizer_hash,
        tokens=c.tokens, env=c.env, sampled=tuple(sampled), openings=ops, prev_optimizer_hash=prev_opt,
        final_ef_hash=c.final_ef_hash or None, start_ef_hash=start_ef,
    )  # fmt: skip
    derived = None
    if on_final is not None:

        def derived(state: Mapping[str, Tensor], payload: bytes) -> None:
            on_final({k[len("param/") :]: v.clone() for k, v in state.items() if k.startswith("param/")})

    out = verify(job, store, ReplayContext(verifier, lm_loss, env.corpus, g, on_derived=derived))
    return out.accept, out.reason.name, out.replay_steps


# ---------------------------------------------------------------- the DiLoCo run


def run_diloco(
    setup: Setup,
    *,
    aggregator: str = "protocol",
    attack: str | None = None,
    adversaries: int = 0,
    verify: bool = False,
    exclude_adversaries: bool = False,
    save_params: str | None = None,
    eager: bool = False,
    eager_scale: float | None = None,
    eager_rebase: bool = False,
    stand_in: str = "own",
    endpoint: bool = False,
    correct_at: float | None = None,
    ef_attack: str | None = None,
) -> dict[str, Any]:
    """T outer steps of M hosts; the last `adversaries` hosts (sorted order) lie with `attack`.

    Codec "sparse" (specs §4.1): every host sends C(β·e + Δ) and carries e − C(…) (`protocol.
    errorfeedback.ef_step`); a verifier rebuilds both from its replayed θ_H and the host's carried e
    and compares the hashes (DELTA_MISMATCH otherwise); accepted payloads are summed sparse into
    the mean (`SparseAccumulator`). `ef_attack` names a forger of `gonka_diloco.adversaries.
    sparse.EF_FORGERS` that the adversaries use for their payload and carried e instead.

    `eager`: the overlapped schedule (`Overlap.EAGER`, specs §2.2.1): step n builds on G_{n−1}
    and its accepted Δs update the latest G_n; a host whose step n − 1 contribution is a parent
    starts step n from Nesterov(G_{n−1}, its own decoded Δ_{n−1}) — its own Δ standing in for the
    aggregate not yet known (Kale et al. 2025) — else from G_{n−1}, with its latest optimizer state
    (the one committed with that Δ); its step n contribution enters only if the step n − 1 one was
    accepted (the parent rule). (The one-step-delayed schedule without the stand-in was removed,
    issue 22: bench/RESULTS.md §1d.)
    Research variants of eager (unverified: they change what a host trains, not what nodes check):
    `stand_in="mean"` starts every host from G_{n−1} moved by the last known mean Δ (the one that
    made G_{n−1}) instead of its own Δ; `endpoint` adds G_latest − start to each Δ before the mean
    (Δ measured from the G it is applied to); `correct_at` c: at inner step c·H the host moves its
    params by G_latest − start and trains on, so the step n − 1 result is applied mid-step.

    aggregator "protocol": `outer_update` over the Δs that enter (all, or the verified ones).
    Other names: a robust rule from `bench.aggregators` over all decoded Δs, then Nesterov.
    `exclude_adversaries`: the honest-only reference (adversaries neither train nor submit).
    """
    from bench.aggregators import AGGREGATORS, ATTACKS

    env = make_env(setup)
    cfg = env.cfg
    init = initial_model(env)
    g = param_tensors(init)
    mom = {n: torch.zeros_like(t) for n, t in g.items()}
    bad_hosts = set(env.hosts[len(env.hosts) - adversaries :]) if adversaries else set()
    active = [h for h in env.hosts if not (exclude_adversaries and h in bad_hosts)]
    hosts = {h: Host.new(env, h) for h in active}
    verifier = build_model(setup.spec()) if verify else None
    rng = torch.Generator().manual_seed(setup.seed + 7)
    curve = [{"outer_step": 0, "inner_steps": 0, "val_loss": evaluate(env, init, g), "bytes_per_host": 0}]
    sent = 0.0
    verdicts: dict[str, int] = {}
    t_train = t_verify = 0.0
    replay_steps = 0
    store = MemStore() if (verify or attack) else None  # boundary states only when someone reads them
    # G_{n−1}, G_n (eager) or G_n alone (the oldest is the base), each with the mean Δ that made it
    history: deque[tuple[Params, Params, Params | None]] = deque([(g, mom, None)], maxlen=2 if eager else 1)
    sparse = cfg.codec is Codec.SPARSE
    ef_cfg = EFConfig.of(cfg) if sparse else None
    layout = {k: tuple(t.shape) for k, t in g.items()}
    if sparse and (eager or aggregator != "protocol" or endpoint or attack):
        raise ValueError("the sparse codec runs the sequential protocol aggregator only")
    forger = None
    if ef_attack:
        from gonka_diloco.adversaries.sparse import EF_FORGERS

        forger = EF_FORGERS[ef_attack]
    prev_starts: dict[str, tuple[Params, str]] = {}  # eager_rebase: what each host last trained from
    parents: dict[str, tuple[Params, bool, bool]] = {}
    own: dict[str, tuple[Params, bool, bool]] = {}  # eager: each host's last Δ, entered?, eligible?
    for n in range(setup.outer_steps):
        base, base_mom, base_mean = history[0]
        g_hash = global_model_hash(base, base_mom)
        starts = {h: (base, g_hash) for h in active}
        if eager:
            lr, mu = cfg.outer.lr, cfg.outer.momentum
            parents = {h: o for h, o in own.items() if o[2]}  # the chain's parent rule (§2.2.1)
            for h, (d, _, _) in parents.items():
                if eager_rebase and h in prev_starts:  # own endpoint against the base: G_{n−1} − θ_H
                    d = {k: d[k] + (base[k] - prev_starts[h][0][k]) for k in d}
                if stand_in == "mean" and base_mean is not None:  # research: one shared stand-in
                    e = outer_update(base, base_mom, [("mean", 1, base_mean)], lr, mu)[0]
                elif eager_scale is None:  # the protocol's start (α = eager_scale(lr, μ)), what nodes do
                    e = eager_start(base, base_mom, d, lr, mu)
                else:  # another α, for the benchmark's comparison
                    scaled = {k: torch.mul(t, eager_scale) for k, t in d.items()}
                    e = outer_update(base, base_mom, [(h, 1, scaled)], lr, mu)[0]
                starts[h] = (e, global_model_hash(e, base_mom))
        t0 = time.perf_counter()
        prev_starts = starts
        if correct_at is not None:  # research: at inner step τ the host moves by G_latest − start
            tau = int(correct_at * setup.inner_steps)
            contribs = {h: hosts[h].corrected(env, n, starts[h][0], g, tau) for h in active}
        else:
            contribs = {h: hosts[h].contribute(env, n, starts[h][0], starts[h][1], store) for h in active}
        if store is not None:
            store.flush()  # the last boundaries are written in the background: wait before reading them
        t_train += time.perf_counter() - t0
        if attack is not None and bad_hosts:
            honest = [contribs[h].delta for h in active if h not in bad_hosts]
            for h in sorted(bad_hosts & set(active)):
                bad = ATTACKS[attack](contribs[h].delta, honest, len(bad_hosts), rng)
                assert store is not None
                contribs[h] = forge(env, contribs[h], bad, starts[h][0], store, hosts[h])
        sparse_out: dict[str, tuple[bytes, Params, str, str]] = {}  # payload, e_next, their hashes
        for h in active if sparse else ():
            assert ef_cfg is not None
            make = forger if forger is not None and h in bad_hosts else ef_step
            payload, e_next = make(hosts[h].ef, contribs[h].delta, ef_cfg)
            sparse_out[h] = (payload, e_next, delta_hash(payload, cfg.state_chunk_bytes),
                             ef_hash(e_next, cfg.state_chunk_bytes))  # fmt: skip
        entering = list(active)
        if verify:
            assert verifier is not None and store is not None
            t0 = time.perf_counter()
            entering = []
            for h in active:
                replayed: list[Mapping[str, Tensor]] = []
                c, start_ef = contribs[h], None
                if sparse:  # what the host commits: C(β·e + Δ) and the hash of e_next (specs §4.1)
                    payload, _, dh, eh = sparse_out[h]
                    c = dataclasses.replace(c, payload=payload, delta_hash=dh, final_ef_hash=eh)
                    if hosts[h].ef is not None:
                        start_ef = ef_hash(hosts[h].ef, cfg.state_chunk_bytes)
                        store.efs[start_ef] = hosts[h].ef
                ok, reason, steps = verify_contribution(
                    env, c, h, hosts[h].prev_optimizer_hash, starts[h][0], store, verifier,
                    replayed.append if sparse else None, start_ef,
                )  # fmt: skip
                if ok and eager and h in parents and not parents[h][1]:
                    ok, reason = False, "PARENT_NOT_ACCEPTED"
                if ok and sparse:  # from the verifier's own θ_H, bit for bit the host's
                    assert ef_cfg is not None and replayed
                    final, start = replayed[0], starts[h][0]
                    mine = ((k, start[k] - final[k]) for k in sorted(start, key=str.encode))
                    check = verify_ef_step(hosts[h].ef, mine, layout, ef_cfg, delta_hash=sparse_out[h][2],
                                           ef_hash_committed=sparse_out[h][3],
                                           chunk_bytes=cfg.state_chunk_bytes)  # fmt: skip
                    if not check.ok:
                        ok, reason = False, "DELTA_MISMATCH"
                replay_steps += steps
                key = f"{'adversary' if h in bad_hosts else 'honest'}:{reason}"
                verdicts[key] = verdicts.get(key, 0) + 1
                if ok:
                    entering.append(h)
            t_verify += time.perf_counter() - t0
        for h in active:
            hosts[h].prev_optimizer_hash = contribs[h].final_optimizer_hash
        if eager:
            entering = [h for h in entering if h not in parents or parents[h][1]]
        for h in entering if sparse and not setup.ef_reset else ():  # the chain names e_next of an accepted Δ
            hosts[h].ef = sparse_out[h][1]
        decoded: dict[str, Params] = {}
        sizes = [len(sparse_out[h][0]) for h in entering] if sparse else []
        for h in () if sparse else active if eager else entering:
            decoded[h], size = roundtrip(contribs[h].delta, cfg.codec, cfg.codec_block_size)
            if h in entering:
                sizes.append(size)
        if eager:  # eligible as the next parent: no parent of its own, or one that entered
            own = {h: (decoded[h], h in entering, h not in parents or parents[h][1]) for h in active}
        sent += sum(sizes) / max(1, len(sizes))
        rule = cfg.outer.rule
        if sparse:
            mean = None
            if entering:
                acc = SparseAccumulator(layout, {h: contribs[h].tokens for h in entering},
                                        chunk=cfg.codec_block_size, topk=cfg.sparse_topk,
                                        mean=cfg.outer.sparse_mean)  # fmt: skip
                for h in sorted(entering):
                    acc.add(h, sparse_out[h][0])
                g, mom = acc.finish(g, mom, cfg.outer.lr, cfg.outer.momentum, rule)
        elif aggregator == "protocol":
            accepted = [(h, contribs[h].tokens, decoded[h]) for h in entering]
            if endpoint:  # research: each Δ measured from G (the endpoint), not from the host's start
                accepted = [(h, w, {k: d[k] + (g[k] - starts[h][0][k]) for k in d}) for h, w, d in accepted]
            mean = weighted_mean(accepted, g) if accepted else None  # outer_update's own mean, once
            if mean is not None:
                g, mom = apply_rule(rule, g, mom, mean, cfg.outer.lr, cfg.outer.momentum)
        else:
            agg = AGGREGATORS[aggregator]([decoded[h] for h in sorted(decoded)], len(bad_hosts))
            mean = agg
            g, mom = outer_update(g, mom, [("aggregate", 1, agg)], cfg.outer.lr, cfg.outer.momentum)
        history.append((g, mom, mean))
        if store is not None:
            store.clear()
        curve.append({
            "outer_step": n + 1, "inner_steps": (n + 1) * setup.inner_steps,
            "val_loss": evaluate(env, init, g), "bytes_per_host": sent,
        })  # fmt: skip
    unsent: dict[str, float] = {}
    if sparse:  # issue 37's diagnostic: what the accumulators still hold at the end, never sent
        unsent = unsent_tail(env, init, g, [hosts[h].ef for h in active], cfg.outer.lr)
    if save_params:
        from safetensors.torch import save_file

        save_file(g, save_params)
    total_inner = setup.outer_steps * setup.inner_steps * len(active)
    return {
        **unsent,
        "final_val_loss": curve[-1]["val_loss"],
        "curve": curve,
        "params": n_params(g),
        "bytes_per_host": sent,
        "final_global_hash": global_model_hash(g, mom),
        "verdicts": verdicts,
        "train_s": t_train,
        "verify_s": t_verify,
        "replay_fraction": replay_steps / total_inner if verify else 0.0,
        "verify_time_fraction": t_verify / t_train if verify else 0.0,
    }


def unsent_tail(
    env: Env, init: nn.Module, g: Params, efs: Sequence[Params | None], lr: float
) -> dict[str, float]:
    """Research (issue 37): how much of a sparse run's missing progress its hosts' error-feedback
    accumulators still hold at the end, sent by nobody yet: the loss of θ_T − lr·mean(e) (one final
    dense flush of every accumulator) beside θ_T's, and ‖mean e‖. No node does this."""
    held = [e for e in efs if e is not None]
    if not held:
        return {}
    flushed = {n: t - lr * sum(e[n] for e in held) / len(held) for n, t in g.items()}
    norm = sum(float(sum(e[n] for e in held).double().square().sum()) for n in g) ** 0.5 / len(held)
    return {"final_val_loss_flushed": evaluate(env, init, flushed), "unsent_mean_norm": norm}


# ---------------------------------------------------------------- synchronous data-parallel baseline

PRETRAIN_OUTER_STEP = 1_000_000  # PRF batches of the warm start come from an outer step no run reaches


def dp_step(
    env: Env, model: nn.Module, opt: torch.optim.Optimizer, inner: InnerOptim, n: int, i: int, t: int
) -> None:
    """One synchronous step over every host's batch (n, i): the all-reduced gradient, clipped, AdamW."""
    xs, ys = zip(*(batch(env.cfg, env.corpus, h, n, i) for h in env.hosts), strict=True)
    for grp in opt.param_groups:
        grp["lr"] = lr_at(inner, t)
    opt.zero_grad(set_to_none=True)
    lm_loss(model(torch.cat(xs)), torch.cat(ys)).backward()
    torch.nn.utils.clip_grad_norm_(list(model.parameters()), env.cfg.inner.grad_clip)
    opt.step()


def initial_model(env: Env) -> nn.Module:
    """The seeded init, optionally warm-started by `warm_start` data-parallel steps (not counted),
    or loaded from `init_params` (such a warm start, computed once for every contender)."""
    model = build_model(env.setup.spec())
    if env.setup.init_params:
        from safetensors.torch import load_file

        saved = load_file(env.setup.init_params)
        with torch.no_grad():
            for n, p in model.named_parameters():
                p.copy_(saved[n])
    elif env.setup.warm_start:
        warm = InnerOptim(lr=4e-4)  # the pre-training is the same whatever the contender's own lr
        opt = make_optimizer(model, warm)
        for t in range(env.setup.warm_start):
            dp_step(env, model, opt, warm, PRETRAIN_OUTER_STEP, t, t)
    return model


def pretrain(setup: Setup, *, save_params: str) -> dict[str, Any]:
    """The warm start alone (`warm_start` data-parallel steps), saved for the contenders to load."""
    from safetensors.torch import save_file

    env = make_env(setup)
    model = initial_model(env)
    save_file(param_tensors(model), save_params)
    return {"final_val_loss": evaluate(env, model), "curve": [], "params": n_params(param_tensors(model))}


def run_data_parallel(setup: Setup, *, lr_scale: float = 1.0, evals_per_outer: int = 5) -> dict[str, Any]:
    """M workers, gradients averaged every step, on exactly the batches the DiLoCo hosts see.

    Averaging M equal-size per-worker mean losses equals the mean loss of the concatenated batch,
    so one backward over M·B samples gives the all-reduced gradient without threads. `lr_scale`
    lets the baseline use a larger inner lr for its M× larger batch (a fairer DP).
    """
    env = make_env(setup)
    inner = env.cfg.inner.model_copy(update={"lr": env.cfg.inner.lr * lr_scale})
    cfg = env.cfg.model_copy(update={"inner": inner})
    model = initial_model(env)
    evaluator = build_model(setup.spec())
    opt = make_optimizer(model, cfg.inner)
    p = n_params(param_tensors(model))
    H, M = setup.inner_steps, setup.hosts
    every = max(1, H // evals_per_outer)
    l0 = evaluate(env, evaluator, param_tensors(model))
    curve = [{"inner_steps": 0, "val_loss": l0, "bytes_per_host": 0}]
    t0 = time.perf_counter()
    for t in range(setup.outer_steps * H):
        n, i = divmod(t, H)
        dp_step(env, model, opt, cfg.inner, n, i, t)
        if (t + 1) % every == 0:
            curve.append({
                "inner_steps": t + 1, "val_loss": evaluate(env, evaluator, param_tensors(model)),
                "bytes_per_host": ring_allreduce_bytes(M, p, t + 1),
            })  # fmt: skip
    return {
        "final_val_loss": curve[-1]["val_loss"],
        "curve": curve,
        "params": p,
        "bytes_per_host": ring_allreduce_bytes(M, p, setup.outer_steps * H),
        "inner_lr": cfg.inner.lr,
        "train_s": time.perf_counter() - t0,
    }


# ---------------------------------------------------------------- child-process runner

RUNNERS: dict[str, Callable[..., dict[str, Any]]] = {
    "diloco": run_diloco,
    "data_parallel": run_data_parallel,
    "pretrain": pretrain,
}


def run_job(job: Mapping[str, Any]) -> dict[str, Any]:
    """Execute one job dict {"kind", "setup", **kwargs} in this process (1 thread, deterministic)."""
    configure_determinism(1)
    kind = job["kind"]
    kwargs = {k: v for k, v in job.items() if k not in ("kind", "setup", "label")}
    if kind == "torchft":
        from bench.torchft_diloco import run_torchft

        fn: Callable[..., dict[str, Any]] = run_torchft
    else:
        fn = RUNNERS[kind]
    t0 = time.perf_counter()
    out = fn(Setup.from_json(job["setup"]), **kwargs)
    out["wall_s"] = time.perf_counter() - t0
    return out


def _child(jobs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Run a chunk of jobs in one child process (one torch import per chunk)."""
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "jobs.json", Path(tmp) / "out.json"
        src.write_text(json.dumps(list(jobs)))
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
        proc = subprocess.run(
            [sys.executable, "-m", "bench.sim", str(src), str(dst)],
            cwd=Path(__file__).resolve().parent.parent, env=env, capture_output=True, text=True,
        )  # fmt: skip
        if proc.returncode != 0 or not dst.exists():
            tail = (proc.stderr or proc.stdout)[-2000:]
            return [{"error": f"exit {proc.returncode}: {tail}"} for _ in jobs]
        return json.loads(dst.read_text())


def run_jobs(jobs: Sequence[Mapping[str, Any]], workers: int = 2, per_child: int = 3) -> list[dict[str, Any]]:
    """Run jobs in child processes, `workers` at a time, `per_child` jobs each; results in job order."""
    chunks = [jobs[i : i + per_child] for i in range(0, len(jobs), per_child)]

    def one(chunk: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        outs = []
        for job, out in zip(chunk, _child(chunk), strict=True):
            status = "error" if "error" in out else f"{out['final_val_loss']:.4f} in {out['wall_s']:.0f}s"
            print(f"  {job.get('label', job['kind'])}: {status}", flush=True)
            outs.append({"label": job.get("label", job["kind"]), "job": dict(job), **out})
        return outs

    with ThreadPoolExecutor(max_workers=workers) as pool:
        return [r for rs in pool.map(one, chunks) for r in rs]


def write_result(name: str, result: Mapping[str, Any]) -> Path:
    """`<name>.json`; a full run also keeps `<name>.full.json`, which later quick runs leave alone."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    text = json.dumps(result, indent=2, sort_keys=True) + "\n"
    path = RESULTS_DIR / f"{name}.json"
    path.write_text(text)
    if not result.get("quick"):
        (RESULTS_DIR / f"{name}.full.json").write_text(text)
    return path


def _run_chunk(jobs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One job's failure is reported in its slot, not fatal to the others in the chunk."""
    outs = []
    for job in jobs:
        try:
            outs.append(run_job(job))
        except Exception as e:  # reported in the results table, the benchmark goes on
            import traceback

            outs.append({"error": f"{type(e).__name__}: {e}\n{traceback.format_exc()[-1500:]}"})
    return outs


if __name__ == "__main__":
    job_path, out_path = sys.argv[1], sys.argv[2]
    Path(out_path).write_text(json.dumps(_run_chunk(json.loads(Path(job_path).read_text()))))
