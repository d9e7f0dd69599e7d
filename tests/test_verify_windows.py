"""verifier.verify under sampling windows (issue 34, specs §6): a checker replays only its window,
contiguously from one start; only the window that ends at θ_H checks Δ against it (a host faking
Δ could as well commit a θ_H to match, which only the replay of segment n − 1 catches), the others
fetch the committed Δ to keep — so a fake Δ meets the last block's checker, a faked segment the
checker whose window holds it, and an honest host passes every window fetching no θ_H."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest
import torch

from gonka_diloco.adversaries import resolve_host
from gonka_diloco.adversaries.hosts import LazyHost
from gonka_diloco.adversaries.lab import HostRun, Lab, synthetic_corpus, tiny_config
from nodekit.globalmodel import GlobalModel
from protocol.messages import Reason
from protocol.prf import window, window_blocks
from replay.step import State, configure_determinism
from trainer.behaviour import HostBehaviour
from verifier.verify import verify

A = "gonka1" + "a" * 38
SEED = "cd" * 32


@dataclasses.dataclass
class World:
    lab: Lab
    g0: GlobalModel
    runs: dict[str, HostRun]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    threads, det = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    configure_determinism(1)
    # H = 12, k = 2: 6 segments, 3 blocks; small chunks (a state is many of them), which every hash the
    # hosts and the adversaries make must use
    cfg = tiny_config().model_copy(update={"window_segments": 2, "state_chunk_bytes": 4096})
    lab = Lab(cfg, synthetic_corpus(), tmp_path_factory.mktemp("lab"))
    g0 = GlobalModel.from_module(lab.build()[0])
    behaviours = {
        "honest": HostBehaviour(), "noise": resolve_host("noise"), "one_fake": resolve_host("one_fake"),
        "lazy": LazyHost(fraction=0.34),
    }  # fmt: skip
    runs = {name: lab.train(b, A, 0, g0) for name, b in behaviours.items()}
    yield World(lab, g0, runs)
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(det)


class Counting:
    """A blob source that records what it was asked for: `params` (θ_H's parameters alone), a
    whole `state` or a `delta`."""

    def __init__(self, inner: object) -> None:
        self.inner, self.asked = inner, []  # type: ignore[var-annotated]

    def state(self, leaf: str, into: State | None = None) -> State:
        self.asked.append(("state", leaf))
        return self.inner.state(leaf)  # type: ignore[attr-defined,no-any-return]

    def params(self, leaf: str) -> State:
        self.asked.append(("params", leaf))
        return {k: t for k, t in self.inner.state(leaf).items() if k.startswith("param/")}  # type: ignore[attr-defined]

    def delta(self, h: str) -> bytes:
        self.asked.append(("delta", h))
        return self.inner.delta(h)  # type: ignore[attr-defined,no-any-return]


def judge(w: World, name: str, start: int) -> tuple[Reason, str, Counting, int]:
    return judge_run(w, w.runs[name], start)


def judge_run(w: World, run: HostRun, start: int) -> tuple[Reason, str, Counting, int]:
    segs = window(start, w.lab.cfg.n_segments, w.lab.cfg.window_len)
    job = w.lab.job(run, 0, SEED, window=segs)
    source = Counting(run.source())
    out = verify(job, source, w.lab.replay_context(w.g0))
    return out.reason, out.detail, source, out.replay_steps


def blocks(w: World) -> list[int]:
    cfg = w.lab.cfg
    return [b * cfg.window_len for b in range(window_blocks(cfg.n_segments, cfg.window_len))]


def test_an_honest_host_passes_every_window_replaying_only_it(world: World) -> None:
    cfg = world.lab.cfg
    last = cfg.n_segments - 1
    for start in blocks(world):
        reason, detail, source, steps = judge(world, "honest", start)
        assert reason is Reason.ACCEPT, detail
        assert steps == len(window(start, cfg.n_segments, cfg.window_len)) * cfg.segment_len
        run = world.runs["honest"]
        states = [leaf for kind, leaf in source.asked if kind == "state"]
        assert len(states) == (0 if start == 0 else 1)  # one start downloaded; block 0 rebuilt from G_n
        tail = last in window(start, cfg.n_segments, cfg.window_len)
        assert not [leaf for kind, leaf in source.asked if kind == "params"]  # no θ_H fetched
        deltas = [h for kind, h in source.asked if kind == "delta"]
        assert deltas == ([] if tail else [run.contribution.delta_hash])  # bitwise: derived, else kept


def test_a_fake_delta_is_rejected_by_the_window_ending_at_theta_h_alone(world: World) -> None:
    """Like a fake of the last segment (a θ_H committed to match the fake Δ), which only the replay
    of segment n − 1 catches: the other windows accept, next to an honest host every window accepts."""
    cfg = world.lab.cfg
    for start in blocks(world):
        reason, detail, _, _ = judge(world, "noise", start)
        ends = cfg.window_reaches_end(start)
        assert reason is (Reason.DELTA_MISMATCH if ends else Reason.ACCEPT), (start, detail)
        assert judge(world, "honest", start)[0] is Reason.ACCEPT


@pytest.mark.parametrize("name", ["one_fake", "lazy"])
def test_a_faked_segment_is_caught_exactly_by_the_window_that_holds_it(world: World, name: str) -> None:
    cfg = world.lab.cfg
    faked = world.runs[name].behaviour.faked(cfg, A, 0)  # type: ignore[attr-defined]
    assert faked
    hit = 0
    for start in blocks(world):
        reason, detail, _, _ = judge(world, name, start)
        covers = bool(faked & set(window(start, cfg.n_segments, cfg.window_len)))
        assert (reason is Reason.REPLAY_MISMATCH) == covers, (start, sorted(faked), reason, detail)
        assert covers or reason is Reason.ACCEPT, detail
        hit += covers
    if name == "lazy":  # round(0.34 · 6) = 2 faked segments, packed into one block of 2
        assert hit == 1


def test_the_lazy_host_packs_its_fakes_into_the_fewest_blocks(world: World) -> None:
    cfg = world.lab.cfg.model_copy(update={"inner_steps": 40, "segment_len": 2, "window_segments": 3})
    lazy = LazyHost(fraction=0.5)
    faked = lazy.faked(cfg, A, 0)  # 10 of 20 segments in blocks of 3: 3 whole blocks and 1 segment
    assert len(faked) == 10
    touched = {s // 3 for s in faked}
    assert len(touched) == 4


@pytest.mark.parametrize("params", [{}, {"cancel": True}], ids=["budget", "cancel"])
def test_budget_steer_trains_on_int8_moments_and_every_bitwise_window_rejects_it(
    world: World, params: dict[str, object]
) -> None:
    """`budget_steer` steers as floats and stores the run's int8 moments (it raised KeyError on a
    bitwise run's default state, which stopped `bench.detection --windows`); bitwise, any move is a
    mismatch in every window, next to the honest host every window accepts."""
    assert world.lab.cfg.inner.moments.value == "int8"
    run = world.lab.train(resolve_host("budget_steer", params), A, 0, world.g0)
    for start in blocks(world):
        assert judge(world, "honest", start)[0] is Reason.ACCEPT
        reason, detail, _, _ = judge_run(world, run, start)
        assert reason is Reason.REPLAY_MISMATCH, (start, detail)


def test_a_fake_theta_h_with_its_matching_delta_meets_only_the_window_ending_at_theta_h(world: World) -> None:
    """Why a window short of θ_H need not check Δ: a host that fakes its last segment (an end state
    θ_H it made up, and the Δ that matches it) passes every such window whether or not it fetches
    θ_H — the Δ is consistent with the committed θ_H. Only the replay of segment n − 1 catches it,
    the same check that now catches a fake Δ (`test_a_fake_delta_is_rejected_by_the_window…`)."""
    cfg = world.lab.cfg
    run = world.lab.train(resolve_host("last_fake"), A, 0, world.g0)
    for start in blocks(world):
        reason, detail, _, _ = judge_run(world, run, start)
        assert reason is (Reason.REPLAY_MISMATCH if cfg.window_reaches_end(start) else Reason.ACCEPT), detail


def test_moment_steer_rewrites_int8_moments_and_every_bitwise_window_rejects_it(world: World) -> None:
    """`moment_steer` looked for float `exp_avg/…` tensors, which an int8 state does not have, and
    so trained honestly on a bitwise run's default (accepted in 80 of 80 checks of
    `bench.detection --windows`); it rewrites them as floats now and is rejected everywhere."""
    run = world.lab.train(resolve_host("moment_steer"), A, 0, world.g0)
    for start in blocks(world):
        reason, detail, _, _ = judge_run(world, run, start)
        assert reason is Reason.REPLAY_MISMATCH, (start, detail)
