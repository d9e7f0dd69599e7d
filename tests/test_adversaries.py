"""The adversary library itself: names resolve, parameters are checked, and each behaviour does
exactly the dishonest thing it claims (the verifier's side is in test_verify/test_verifier_node)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from gonka_diloco.adversaries import (
    HOSTS,
    VERIFIERS,
    UnknownBehaviour,
    listing,
    resolve_host,
    resolve_verifier,
)
from gonka_diloco.adversaries.hosts import MALFORMED_KINDS, LazyHost, malformed_delta_blob
from gonka_diloco.adversaries.lab import Lab, synthetic_corpus, tiny_config
from nodekit.globalmodel import GlobalModel
from protocol import codecs
from protocol.config import Sampling
from protocol.messages import Reason
from replay.step import configure_determinism
from verifier.job import Job, Judgement

A = "gonka1" + "a" * 38


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    """Replays here are bitwise; conftest gives torch's globals back afterwards."""
    configure_determinism(1)


def test_every_behaviour_resolves_and_is_listed_and_registered_for_host_toml() -> None:
    text = listing()
    for name in HOSTS:
        assert resolve_host(name).name == name and f"  {name}" in text
    partner = {"collude": {"partner": A}}
    for name in VERIFIERS:
        assert resolve_verifier(name, partner.get(name)).name == name
    assert resolve_host("lazy", {"fraction": 0.25}).fraction == 0.25  # type: ignore[attr-defined]


def test_bad_names_and_parameters_are_named_errors() -> None:
    with pytest.raises(UnknownBehaviour, match=r"known: .*copycat"):
        resolve_host("copykat")
    with pytest.raises(UnknownBehaviour, match="takes"):
        resolve_host("lazy", {"fractoin": 0.5})
    with pytest.raises(UnknownBehaviour, match="fraction"):
        resolve_host("lazy", {"fraction": 2})
    with pytest.raises(UnknownBehaviour, match="kind"):
        resolve_host("malformed", {"kind": "gzip"})
    with pytest.raises(UnknownBehaviour, match="takes"):
        resolve_host("zero", {"x": 1})
    with pytest.raises(UnknownBehaviour, match="must reject"):
        resolve_verifier("malicious", {"reason": "ACCEPT"})
    with pytest.raises(UnknownBehaviour, match="unknown reason"):
        resolve_verifier("malicious", {"reason": "NOPE"})
    with pytest.raises(UnknownBehaviour, match="needs partner"):
        resolve_verifier("collude")
    with pytest.raises(UnknownBehaviour, match="not a gonka1"):
        resolve_verifier("collude", {"partner": f"{A}+host-3"})


def test_lazy_host_fakes_the_requested_share_never_the_last_segment_under_segment_sampling() -> None:
    cfg = tiny_config(inner_steps=40, segment_len=2, sampling=Sampling.SEGMENTS)  # 20 segments
    for f, m in ((0.0, 0), (0.5, 10), (1.0, 19)):
        faked = LazyHost(fraction=f).faked(cfg, A, 3)
        assert len(faked) == m and cfg.n_segments - 1 not in faked
    assert LazyHost(0.5, seed=1).faked(cfg, A, 3) == LazyHost(0.5, seed=1).faked(cfg, A, 3)
    assert LazyHost(0.5, seed=1).faked(cfg, A, 3) != LazyHost(0.5, seed=1).faked(cfg, A, 4)


def test_lazy_host_packs_its_fakes_into_whole_blocks_under_windows() -> None:
    """Every block is equally likely to be a checker's window: the fewest blocks touched is the
    least likely caught, so whole blocks first (the last one is not special any more)."""
    cfg = tiny_config(inner_steps=40, segment_len=2, window_segments=3)  # 20 segments, blocks of 3
    for f, m, blocks in ((0.0, 0, 0), (0.5, 10, 4), (1.0, 20, 7)):
        faked = LazyHost(fraction=f).faked(cfg, A, 3)
        assert len(faked) == m and len({s // 3 for s in faked}) == blocks
    one = LazyHost(count=1).faked(cfg, A, 3)
    assert len(one) == 1
    assert LazyHost(0.5, seed=1).faked(cfg, A, 3) != LazyHost(0.5, seed=1).faked(cfg, A, 4)


@pytest.mark.parametrize("kind", [k for k in MALFORMED_KINDS if k != "garbage_state"])
def test_malformed_delta_blobs_are_refused_by_the_bounded_decoder(kind: str) -> None:
    layout = {"w": (64, 8), "b": (8,)}
    payload = codecs.encode({n: torch.randn(s) for n, s in layout.items()}, "int8", 64)
    blob = malformed_delta_blob(payload, kind)
    assert len(blob) < 1 << 20  # small on the wire whatever it claims to inflate to
    with pytest.raises(codecs.CodecError):
        codecs.decode(codecs.from_blob(blob, layout, max_payload_bytes=len(payload)), layout)


def _job() -> Job:
    from protocol.messages import EnvFingerprint

    cfg = tiny_config()
    return Job(
        run_id=1, outer_step=0, host=A, cfg=cfg, trajectory_root="0" * 64, leaf_count=cfg.n_segments + 1,
        delta_hash="1" * 64, final_optimizer_hash="2" * 64, tokens=cfg.tokens_per_outer_step,
        env=EnvFingerprint(torch_version="x", threads=1), sampled=(5,), openings=(), prev_optimizer_hash=None,
    )  # fmt: skip


def test_verifier_behaviours() -> None:
    job = _job()
    honest_accept = Judgement(Reason.ACCEPT, "", "e" * 64, ("f" * 64,), 4)
    honest_reject = Judgement(Reason.DELTA_MISMATCH, "Δ", "d" * 64)

    def never() -> Judgement:
        raise AssertionError("a lazy verifier must not run the checks")

    lazy = resolve_verifier("lazy").decide(job, never)
    assert lazy is not None and lazy.accept and lazy.replay_steps == 0
    malicious = resolve_verifier("malicious")
    flipped = malicious.decide(job, lambda: honest_accept)
    assert flipped is not None and flipped.reason is Reason.REPLAY_MISMATCH
    assert flipped.evidence_hash != honest_accept.evidence_hash
    assert malicious.decide(job, lambda: honest_reject) is honest_reject  # agrees where rejecting is right
    collude = resolve_verifier("collude", {"partner": f"{'gonka1' + 'c' * 38}+{A}"})
    partner = collude.decide(job, never)  # the partner is accepted without a check
    assert partner is not None and partner.accept and partner.replay_steps == 0
    other = collude.decide(dataclasses.replace(job, host="gonka1" + "d" * 38), lambda: honest_reject)
    assert other is honest_reject  # everyone else is judged honestly
    offline = resolve_verifier("offline")
    assert not offline.online() and offline.decide(job, never) is None
    assert resolve_verifier("honest").decide(job, lambda: honest_reject) is honest_reject


def test_host_adversaries_change_only_what_they_attack(tmp_path: Path) -> None:
    lab = Lab(tiny_config(inner_steps=4, segment_len=2), synthetic_corpus(), tmp_path)
    g0 = GlobalModel.from_module(lab.build()[0])
    honest = lab.train(resolve_host("honest"), A, 0, g0).contribution
    scaled = lab.train(resolve_host("scaled"), A, 0, g0).contribution
    assert scaled.leaves == honest.leaves and scaled.delta_hash != honest.delta_hash
    assert honest.delta == {}  # the honest host keeps only the payload (no fp32 Δ held)
    flipped = lab.train(resolve_host("sign_flip"), A, 0, g0).contribution
    assert flipped.delta and set(flipped.delta) == set(scaled.delta)
    for n, d in flipped.delta.items():
        assert torch.allclose(scaled.delta[n], -10 * d)
    zero = lab.train(resolve_host("zero"), A, 0, g0).contribution
    assert len(set(zero.leaves)) == 1 and all(float(d.abs().max()) == 0 for d in zero.delta.values())
    tokens = lab.train(resolve_host("bad_tokens"), A, 0, g0).contribution
    assert tokens.tokens == 4 * honest.tokens and tokens.delta_hash == honest.delta_hash
    wrong = lab.train(resolve_host("wrong_data"), A, 0, g0).contribution
    assert wrong.leaves[0] == honest.leaves[0] and wrong.leaves[1] != honest.leaves[1]
    peers = {"peer_payloads": {"gonka1peer": scaled.payload}}
    copycat = lab.train(resolve_host("copycat"), A, 0, g0, extra=peers).contribution
    assert copycat.delta_hash == scaled.delta_hash and copycat.leaves[0] == honest.leaves[0]


def test_equivocation_sends_two_different_commits(tmp_path: Path) -> None:
    from trainer.behaviour import OuterContext

    lab = Lab(tiny_config(inner_steps=4, segment_len=2), synthetic_corpus(), tmp_path)
    g0 = GlobalModel.from_module(lab.build()[0])
    run = lab.train(resolve_host("equivocation"), A, 0, g0)
    model, loss_fn = lab.build()
    ctx = OuterContext(cfg=lab.cfg, run_id=1, address=A, outer_step=0, global_model=g0, model=model,
                       optimizer=None, loss_fn=loss_fn, data=lab.data, store=run.store,  # type: ignore[arg-type]
                       blobs=None, chain=None)  # type: ignore[arg-type]  # fmt: skip
    msgs = run.behaviour.commit_messages(run.contribution, ctx)
    assert len(msgs) == 2 and msgs[0].trajectory_root == msgs[1].trajectory_root
    assert msgs[0].delta_hash != msgs[1].delta_hash
    assert not resolve_host("no_reveal").should_reveal(run.contribution, ctx)
    assert resolve_host("no_reveal", {"mode": "serve"}).serve_blob("state", "0" * 64, b"x") is None
