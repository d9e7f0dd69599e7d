"""verifier.verify on real contributions of a tiny GPT: the honest host is accepted and every host
adversary is rejected with its own reason, in one setup (two outer steps, two hosts)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from gonka_diloco.adversaries import resolve_host
from gonka_diloco.adversaries.hosts import MALFORMED_KINDS, LazyHost
from gonka_diloco.adversaries.lab import (
    HostRun,
    Lab,
    carried_optimizer,
    next_global,
    synthetic_corpus,
    tiny_config,
)
from nodekit.globalmodel import GlobalModel
from protocol.config import InnerOptim, Moments, ReplayMode, RunConfig, Sampling
from protocol.envclass import ReplayDecision
from protocol.messages import EnvFingerprint, Reason
from replay.step import State, configure_determinism, env_fingerprint, optimizer_state
from trainer.behaviour import HostBehaviour, OuterContext
from trainer.commit import TrainedStep, run_committed
from verifier.job import CannotVerify, Job, MissingData
from verifier.tolerance import TOLERANCE_CHECKS, param_distance, state_distances, tolerance_mismatch
from verifier.verify import (
    check_verifier_env,
    fresh_optimizer_hash,
    fresh_optimizer_state,
    replay_segment,
    verify,
)

A = "gonka1" + "a" * 38
B = "gonka1" + "b" * 38
SEED = "ab" * 32
LAST = 5  # tiny_config: H = 12, k = 2 -> 6 segments
TOLERANT = {
    "replay_mode": ReplayMode.TOLERANCE,
    "tolerance": 1e-3,
    "tolerance_exp_avg": 1e-3,
    "tolerance_exp_avg_sq": 1e-3,
}


@dataclasses.dataclass
class World:
    lab: Lab
    g0: GlobalModel
    g1: GlobalModel
    step0: dict[str, HostRun]
    stale: HostBehaviour  # the same object that already worked honestly at step 0


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    yield from _world(tmp_path_factory, tiny_config())


@pytest.fixture(scope="module")
def fp32_world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """The world with float32 moments, for the tests that judge it in tolerance mode too: its
    thresholds are calibrated on float32 moments, so it refuses the default int8 (specs §6.2.1)."""
    yield from _world(tmp_path_factory, tiny_config(inner=InnerOptim(moments=Moments.FP32)))


def _world(tmp_path_factory: pytest.TempPathFactory, cfg: RunConfig) -> Iterator[World]:
    threads, det = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    configure_determinism(1)
    # segment sampling: every check here names the segments it opens (windows: test_verify_windows)
    cfg = cfg.model_copy(update={"sampling": Sampling.SEGMENTS})
    lab = Lab(cfg, synthetic_corpus(), tmp_path_factory.mktemp("lab"))
    g0 = GlobalModel.from_module(lab.build()[0])
    stale = resolve_host("stale")
    step0 = {A: lab.train(stale, A, 0, g0), B: lab.train(HostBehaviour(), B, 0, g0)}
    yield World(lab, g0, next_global(g0, list(step0.values()), lab.cfg), step0, stale)
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(det)


def step1(w: World, behaviour: HostBehaviour) -> HostRun:
    """Host A's outer step 1, carrying its accepted step-0 optimizer state, as the chain expects."""
    carried, h = carried_optimizer(w.step0[A])
    peers = {B: w.step0[B].contribution.payload}
    return w.lab.train(behaviour, A, 1, w.g1, carried, h, extra={"peer_payloads": peers})


def check(w: World, run: HostRun, sampled: list[int] | None = None, **job_kw: object) -> tuple[Reason, str]:
    job = w.lab.job(run, 1, SEED, sampled=sampled or [0, LAST], **job_kw)  # type: ignore[arg-type]
    out = verify(job, run.source(), w.lab.replay_context(w.g1))
    return out.reason, out.detail


def test_honest_host_is_accepted_at_its_first_and_later_outer_steps(world: World) -> None:
    for addr, run in world.step0.items():
        job = world.lab.job(run, 0, SEED, sampled=[0, LAST])
        assert verify(job, run.source(), world.lab.replay_context(world.g0)).reason is Reason.ACCEPT, addr
    honest = step1(world, HostBehaviour())
    for seed in ("01" * 32, "02" * 32, "03" * 32):  # challenge-chosen segments, no proofs from the chain
        job = world.lab.job(honest, 1, seed, with_proofs=False)
        out = verify(job, honest.source(), world.lab.replay_context(world.g1))
        assert out.reason is Reason.ACCEPT, out.detail
        assert out.replay_steps == world.lab.cfg.sampled_segments * world.lab.cfg.segment_len


@pytest.mark.parametrize(
    "name", ["noise", "zero", "scaled", "sign_flip", "wrong_data", "stale", "copycat", "bad_tokens"]
)
def test_each_host_adversary_is_rejected_with_its_reason(world: World, name: str) -> None:
    adversary = world.stale if name == "stale" else resolve_host(name)
    reason, detail = check(world, step1(world, adversary))
    assert reason.name in adversary.expected, detail  # type: ignore[attr-defined]
    assert reason is not Reason.ACCEPT


def test_lazy_host_is_caught_exactly_when_a_faked_segment_is_sampled(world: World) -> None:
    lazy = LazyHost(fraction=0.5, seed=3)
    run = step1(world, lazy)
    faked = lazy.faked(world.lab.cfg, A, 1)
    real = sorted(set(range(LAST)) - faked)
    assert faked and real
    reason, detail = check(world, run, sampled=[min(faked), LAST])
    assert reason is Reason.REPLAY_MISMATCH and f"segment {min(faked)}" in detail and "distance" in detail
    assert "inf" not in detail  # the claimed end was served: a real distance

    class NoEnds:  # bitwise-mode hosts keep only opened starts: an unserved end is no excuse
        def __init__(self) -> None:
            self.inner = run.source()

        def state(self, leaf: str) -> State:
            if leaf == run.contribution.leaves[min(faked) + 1]:
                raise MissingData("end not kept")
            return self.inner.state(leaf)

        def delta(self, h: str) -> bytes:
            return self.inner.delta(h)

    job = world.lab.job(run, 1, SEED, sampled=[min(faked), LAST])
    out = verify(job, NoEnds(), world.lab.replay_context(world.g1))
    assert out.reason is Reason.REPLAY_MISMATCH and "distance inf" in out.detail, out.detail
    assert check(world, run, sampled=[real[0], LAST])[0] is Reason.ACCEPT  # the known escape


@pytest.mark.parametrize("kind", MALFORMED_KINDS)
def test_malformed_blobs_are_rejected_and_the_verifier_keeps_working(fp32_world: World, kind: str) -> None:
    world = fp32_world  # judged in tolerance mode too: float32 moments
    honest = step1(world, HostBehaviour())
    bad = dataclasses.replace(honest, behaviour=resolve_host("malformed", {"kind": kind}))
    tol_cfg = world.lab.cfg.model_copy(update={"replay_mode": ReplayMode.TOLERANCE, "tolerance": 1e-3})
    tol = dataclasses.replace(world.lab, cfg=tol_cfg)
    carried, h = carried_optimizer(world.step0[A])  # a tolerance-mode host also keeps its claimed ends
    tol_run = tol.train(HostBehaviour(), A, 1, world.g1, carried, h)
    tol_bad = dataclasses.replace(tol_run, behaviour=bad.behaviour)
    job = tol.job(tol_bad, 1, SEED, sampled=[0, LAST])
    out = verify(job, tol_bad.source(), tol.replay_context(world.g1))
    assert out.reason is Reason.MALFORMED_BLOB, out.detail  # tolerance mode downloads the Δ
    reason, detail = check(world, bad)
    if kind == "garbage_state":
        assert reason is Reason.MALFORMED_BLOB, detail
    else:  # bitwise mode derives Δ from its own replay: the bomb is never downloaded, the work is honest
        assert reason is Reason.ACCEPT, detail
    assert check(world, honest)[0] is Reason.ACCEPT  # same verifier context, next job


def test_bitwise_verifier_downloads_only_what_it_cannot_rebuild(world: World) -> None:
    """Segment 0 is rebuilt from G_n and the carried optimizer state, a segment after a replayed
    one starts from that replay, and the Δ is derived: only the other starts are downloaded."""
    honest = step1(world, HostBehaviour())
    got: list[tuple[State, bytes]] = []
    ctx = world.lab.replay_context(world.g1)
    ctx.on_derived = lambda final, payload: got.append((final, payload))

    class Counting:
        def __init__(self) -> None:
            self.inner, self.states, self.optimizers, self.deltas = honest.source(), [], [], []

        def state(self, leaf: str) -> State:
            self.states.append(leaf)
            return self.inner.state(leaf)

        def optimizer(self, h: str) -> State:
            self.optimizers.append(h)
            return optimizer_state(carried_optimizer(world.step0[A])[0])

        def delta(self, h: str) -> bytes:
            self.deltas.append(h)
            return self.inner.delta(h)

    src = Counting()
    job = world.lab.job(honest, 1, SEED, sampled=[0, 1, 3, 4, LAST])
    assert verify(job, src, ctx).reason is Reason.ACCEPT
    c = honest.contribution
    assert src.states == [c.leaves[3]]  # 0 rebuilt, 1 and 4 and 5 follow a replayed segment
    assert src.optimizers == [job.prev_optimizer_hash] and src.deltas == []
    assert len(got) == 1 and got[0][1] == c.payload  # the Δ it derived is the committed one


def test_no_reveal_and_unreachable_host_are_missing_data(world: World) -> None:
    honest = step1(world, HostBehaviour())
    assert check(world, honest, revealed=False)[0] is Reason.MISSING_DATA
    silent = dataclasses.replace(honest, behaviour=resolve_host("no_reveal", {"mode": "serve"}))
    assert check(world, silent)[0] is Reason.MISSING_DATA

    class Unreachable:
        def state(self, leaf_hash: str) -> dict[str, torch.Tensor]:
            raise MissingData("connection refused")

        def delta(self, delta_hash: str) -> bytes:
            raise MissingData("connection refused")

    job = world.lab.job(honest, 1, SEED)
    ctx = world.lab.replay_context(world.g1)
    assert verify(job, Unreachable(), ctx).reason is Reason.MISSING_DATA
    assert verify(job, honest.source(), ctx).reason is Reason.ACCEPT


def test_wrong_start_params_or_optimizer(world: World) -> None:
    # trained from G_1 but with a fresh optimizer although the chain recorded its step-0 state
    fresh_opt = world.lab.train(HostBehaviour(), A, 1, world.g1, None, carried_optimizer(world.step0[A])[1])
    reason, detail = check(world, fresh_opt)
    assert reason is Reason.WRONG_START and "optimizer" in detail
    # trained from the old G_0 with the right optimizer
    carried, h = carried_optimizer(world.step0[A])
    old_base = world.lab.train(HostBehaviour(), A, 1, world.g0, carried, h)
    reason, detail = check(world, old_base)
    assert reason is Reason.WRONG_START and "G_n" in detail
    # without segment 0 opened the start is not visible; the replay still binds the end state
    assert check(world, old_base, sampled=[2, LAST])[0] is Reason.DELTA_MISMATCH


def test_bad_proofs_and_wrong_openings(world: World) -> None:
    honest = step1(world, HostBehaviour())
    job = world.lab.job(honest, 1, SEED, sampled=[0, LAST])
    ctx = world.lab.replay_context(world.g1)
    o, last = job.openings
    bent = dataclasses.replace(o, proof=(o.proof[0][::-1], *o.proof[1:]))  # type: ignore[index]
    cases: dict[str, Job] = {
        "proof": dataclasses.replace(job, openings=(bent, last)),
        "not hex": dataclasses.replace(job, openings=(dataclasses.replace(o, proof=("zz",)), last)),
        "segments": dataclasses.replace(job, openings=job.openings[:1]),
        "leaf_count": dataclasses.replace(job, leaf_count=job.leaf_count + 1),
        "swapped ends": dataclasses.replace(
            job, openings=(dataclasses.replace(o, start_leaf=o.end_leaf, end_leaf=o.start_leaf), last)
        ),
    }
    for what, bad in cases.items():
        assert verify(bad, honest.source(), ctx).reason is Reason.BAD_PROOF, what


def test_environment_checks(fp32_world: World) -> None:
    world = fp32_world  # judged in tolerance mode too: float32 moments
    honest = step1(world, HostBehaviour())
    job = world.lab.job(honest, 1, SEED)
    two = EnvFingerprint(torch_version=job.env.torch_version, threads=2)
    out = verify(dataclasses.replace(job, env=two), honest.source(), world.lab.replay_context(world.g1))
    assert out.reason is Reason.BAD_ENVIRONMENT
    check_verifier_env(job, env_fingerprint(1))
    with pytest.raises(CannotVerify):
        check_verifier_env(job, two)
    tol_cfg = world.lab.cfg.model_copy(update=TOLERANT)
    tol = dataclasses.replace(job, cfg=tol_cfg, env=two)
    check_verifier_env(tol, env_fingerprint(1))  # tolerance mode exists for exactly this case
    # judged by a tolerance check, a host of a tolerance run: it keeps θ_H, which the check fetches
    # (a bitwise host does not; alone this failed MISSING_DATA, passing only after another test had
    # left a tolerance host's θ_H in the same store)
    tol_lab = dataclasses.replace(world.lab, cfg=tol_cfg)
    tol_honest = step1(dataclasses.replace(world, lab=tol_lab), HostBehaviour())
    tol = dataclasses.replace(tol_lab.job(tol_honest, 1, SEED), env=two)
    assert verify(tol, tol_honest.source(), tol_lab.replay_context(world.g1)).reason is Reason.ACCEPT


def test_a_host_claiming_a_class_no_verifier_has_gets_no_verdict_and_fails_tolerance_replay(
    fp32_world: World,
) -> None:
    """`forged_env`: a free rider claiming an imaginary GPU. A verifier of another class abstains in
    bitwise mode (no verdict: the chain finalizes it `unverified`, out of the model, unpaid), while
    the honest host next to it is replayed bitwise and accepted; in tolerance mode it is judged and
    rejected."""
    world = fp32_world  # judged in tolerance mode too: float32 moments
    mine = env_fingerprint(1)
    ctx = world.lab.replay_context(world.g1)
    honest = step1(world, HostBehaviour())
    job = world.lab.job(honest, 1, SEED)
    assert check_verifier_env(job, mine) is ReplayDecision.BITWISE
    assert verify(job, honest.source(), ctx).reason is Reason.ACCEPT
    forger = resolve_host("forged_env")
    forged = step1(world, forger)
    fjob = world.lab.job(forged, 1, SEED)
    assert fjob.env.device == "cuda" and fjob.env.replay_class != mine.replay_class
    with pytest.raises(CannotVerify, match="class"):
        check_verifier_env(fjob, mine)
    tol_cfg = world.lab.cfg.model_copy(update={"replay_mode": ReplayMode.TOLERANCE, "tolerance": 1e-3})
    tol = dataclasses.replace(fjob, cfg=tol_cfg)
    assert check_verifier_env(tol, mine) is ReplayDecision.TOLERANCE
    assert verify(tol, forged.source(), ctx).reason.name in forger.expected  # type: ignore[attr-defined]


class TwoSlices(HostBehaviour):
    """A data-parallel host (2 ranks) as `trainer.ddp` trains: each batch as two summed slices."""

    def make_contribution(self, ctx: OuterContext) -> TrainedStep:
        job = dataclasses.replace(ctx.job(ctx.global_model.params), micro_batches=2)
        c = run_committed(job, ctx.model, ctx.inner_optimizer)
        return dataclasses.replace(c, env=c.env.model_copy(update={"micro_batches": 2}))


def test_data_parallel_hosts_replay_with_their_slice_count(world: World) -> None:
    ddp = step1(world, TwoSlices())
    job = world.lab.job(ddp, 1, SEED, sampled=[0, LAST])
    ctx = world.lab.replay_context(world.g1)
    assert verify(job, ddp.source(), ctx).reason is Reason.ACCEPT
    one = dataclasses.replace(job, env=job.env.model_copy(update={"micro_batches": 1}))
    assert verify(one, ddp.source(), ctx).reason is Reason.REPLAY_MISMATCH  # slices change the rounding
    three = dataclasses.replace(job, env=job.env.model_copy(update={"micro_batches": 3}))
    assert verify(three, ddp.source(), ctx).reason is Reason.BAD_ENVIRONMENT  # 4 does not split in 3


def test_tolerance_mode_accepts_honest_and_rejects_lazy_with_distance(fp32_world: World) -> None:
    world = fp32_world  # judged in tolerance mode too: float32 moments
    cfg = world.lab.cfg.model_copy(update=TOLERANT)
    lab = dataclasses.replace(world.lab, cfg=cfg)
    # hosts of a tolerance run: they keep θ_H, which a tolerance check fetches (a bitwise host does
    # not; this test passed only after another had left a tolerance host's θ_H in the same store)
    tolerant = dataclasses.replace(world, lab=lab)
    honest = step1(tolerant, HostBehaviour())
    ctx = lab.replay_context(world.g1)
    assert verify(lab.job(honest, 1, SEED, sampled=[0, LAST]), honest.source(), ctx).reason is Reason.ACCEPT
    lazy = LazyHost(fraction=0.5, seed=3)
    run = step1(tolerant, lazy)
    seg = min(lazy.faked(cfg, A, 1))
    out = verify(lab.job(run, 1, SEED, sampled=[seg, LAST]), run.source(), ctx)
    assert out.reason is Reason.REPLAY_MISMATCH and f"segment {seg}" in out.detail
    dist = float(out.detail.rsplit("distance ", 1)[1].split()[0])
    assert dist > 100 * cfg.tolerance


def test_tolerance_mode_compares_the_whole_state(fp32_world: World) -> None:
    """A moment-steering host (params exact, moments rewritten at every boundary) passes a
    parameters-only comparison and is rejected by the whole-state one; an honest host that trained
    with 2 threads (every leaf differs from a 1-thread replay) is still accepted by this 1-thread
    verifier; bitwise mode rejects the steering host by hash."""
    world = fp32_world  # judged in tolerance mode too: float32 moments
    cfg = world.lab.cfg.model_copy(update=TOLERANT)
    lab = dataclasses.replace(world.lab, cfg=cfg)
    ctx = lab.replay_context(world.g0)
    steer = lab.train(resolve_host("moment_steer"), B, 0, world.g0)
    out = verify(lab.job(steer, 0, SEED, sampled=[0, LAST]), steer.source(), ctx)
    assert out.reason is Reason.REPLAY_MISMATCH and "exp_avg distance" in out.detail, out.detail
    bitwise = verify(world.lab.job(steer, 0, SEED, sampled=[0, LAST]), steer.source(), ctx)
    assert bitwise.reason is Reason.REPLAY_MISMATCH

    leaves = steer.contribution.leaves
    start, claim = steer.store.get(leaves[0]), steer.store.get(leaves[1])
    job = lab.job(steer, 0, SEED, sampled=[0, LAST])
    replay = replay_segment(job, lab.replay_context(world.g0), start, 0)  # the verifier's own replay
    assert param_distance(replay, claim, start) == 0.0  # what a params-only check saw: nothing
    d = state_distances(replay, claim, start)
    assert d["exp_avg"] > 0.1 and tolerance_mismatch(replay, claim, start, cfg.tolerances, cfg.inner)

    configure_determinism(2)
    try:
        two = lab.train(HostBehaviour(), B, 0, world.g0)
    finally:
        configure_determinism(1)
    one = world.step0[B].contribution
    assert two.contribution.leaves[1:] != one.leaves[1:]  # 2 threads: every later leaf differs
    two_job = dataclasses.replace(lab.job(two, 0, SEED, sampled=[0, LAST]), env=env_fingerprint(2))
    assert verify(two_job, two.source(), ctx).reason is Reason.ACCEPT
    assert verify(world.lab.job(two, 0, SEED, sampled=[0, LAST]), two.source(), ctx).reason is (
        Reason.BAD_ENVIRONMENT  # bitwise mode cannot take a 2-thread host from a 1-thread run
    )


def test_tolerance_mismatch_names_what_differs() -> None:
    inner = tiny_config().inner
    s = {"param/w": torch.zeros(3), "exp_avg/w": torch.zeros(3), "exp_avg_sq/w": torch.zeros(3),
         "step": torch.tensor(0.0)}  # fmt: skip
    c = {"param/w": torch.ones(3), "exp_avg/w": torch.ones(3) * 0.5, "exp_avg_sq/w": torch.ones(3),
         "step": torch.tensor(2.0)}  # fmt: skip  # |m̂|/√v̂ = 0.82 ≤ C(2): a genuine AdamW state
    tol = dict.fromkeys(TOLERANCE_CHECKS, 0.01)
    assert tolerance_mismatch(dict(c), c, s, tol, inner) is None
    assert "step counter" in str(tolerance_mismatch({**c, "step": torch.tensor(3.0)}, c, s, tol, inner))
    sq = {**c, "exp_avg_sq/w": torch.ones(3) * 2}
    assert "exp_avg_sq distance" in str(tolerance_mismatch(sq, c, s, tol, inner))
    gone = {k: v for k, v in c.items() if k != "exp_avg/w"}
    assert "tensors" in str(tolerance_mismatch(gone, c, s, tol, inner))
    forged = {**c, "exp_avg/w": torch.ones(3)}  # |m̂|/√v̂ = 1.64 > C(2) = 1.0004: no AdamW run
    assert "not a genuine AdamW state" in str(tolerance_mismatch(dict(c), forged, s, tol, inner))
    moved = state_distances({**c, "param/w": torch.ones(3) * 1.001}, c, s)
    assert moved["param"] == pytest.approx(1e-3, rel=1e-3) and moved["exp_avg"] == 0.0


@pytest.mark.parametrize("chunk", [256, 4096, 1 << 20])
def test_fresh_optimizer_hash_streams_zeros_equal_to_a_real_fresh_optimizer(chunk: int) -> None:
    """The verifier's fresh start (no optimizer built, no copy; the hash from streamed zeros) is
    bit for bit what a host's `make_optimizer` starts from."""
    from replay.spec import build_model
    from replay.step import make_optimizer, optimizer_hash, training_state

    cfg = tiny_config()
    model = build_model(cfg.model)
    host = training_state(model, make_optimizer(model, cfg.inner), copy=True)
    job = Job(0, 0, A, cfg, "", 0, "", "", 0, env_fingerprint(1), (), (), None)
    mine = fresh_optimizer_state(model, job)
    assert mine.keys() == optimizer_state(host).keys()
    assert all(torch.equal(mine[k], host[k]) and mine[k].dtype == host[k].dtype for k in mine)
    assert fresh_optimizer_hash(model, chunk, cfg.inner.moments) == optimizer_hash(host, chunk)


def test_param_distance() -> None:
    s = {"param/w": torch.zeros(3), "step": torch.tensor(0.0)}
    c = {"param/w": torch.tensor([3.0, 4.0, 0.0]), "step": torch.tensor(1.0)}
    r = {"param/w": torch.tensor([3.0, 4.0, 0.5]), "step": torch.tensor(1.0)}
    assert param_distance(r, c, s) == pytest.approx(0.1)
    assert param_distance(c, c, c) == 0.0
    assert param_distance(r, c, c) == float("inf")


def test_evidence_hash_is_reproducible_and_binds_the_replay(world: World, tmp_path: Path) -> None:
    honest = step1(world, HostBehaviour())
    job = world.lab.job(honest, 1, SEED)
    a = verify(job, honest.source(), world.lab.replay_context(world.g1))
    b = verify(job, honest.source(), world.lab.replay_context(world.g1))
    assert a.evidence_hash == b.evidence_hash and a.replayed_leaves == b.replayed_leaves
    other = verify(dataclasses.replace(job, host=B), honest.source(), world.lab.replay_context(world.g1))
    assert other.evidence_hash != a.evidence_hash  # replayed B's batches: different leaves, different hash
    assert other.reason is Reason.REPLAY_MISMATCH
