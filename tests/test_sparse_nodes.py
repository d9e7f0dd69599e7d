"""The sparse codec with error feedback on real nodes (issue 26, specs §4.1; in-process lockstep
chain, hosts and verifiers serving over HTTP).

Three outer steps, bitwise replay, v = 1. Two honest hosts carry their accumulators across the
steps: each step's start e is the e_next the chain recorded for its last accepted contribution,
fetched by its verifier by hash. Two `ef_forge` hosts train honestly and then lie about error
feedback: `ef_hoard` sends the honest payload but carries a (its committed e is not a − C(a));
`topk_shifted` sends ranks k+1..2k of every chunk (a payload that decodes fine and is not C(a)).
Both are DELTA_MISMATCH in every step; the honest hosts are accepted in every step, their
accumulators are carried (and differ from zeros), and the global model's loss falls.
"""

from __future__ import annotations

import math
import threading
from pathlib import Path
from typing import Any

import torch

from gonka_diloco.adversaries import resolve_host
from nodekit.errorfeedback import EFWriter, ef_step_stored, start_ef
from nodekit.globalmodel import GlobalModel
from nodekit.objects import Kind
from nodekit.store import EF_GROUP, ContentStore
from protocol.config import Codec, ReplayMode, SparseMean
from protocol.errorfeedback import EFConfig, ef_hash, ef_step, fresh_ef_hash
from protocol.messages import Reason
from replay.data import eval_loss
from replay.model import lm_loss
from replay.spec import build_model
from tests.support.nodes import (
    IMPATIENT,
    IMPATIENT_VERIFIER,
    SPEC,
    LockstepChain,
    create_run,
    host_config,
    node_globals,
    run_config,
    running,
    tiny_corpus,
    verdicts,
    verifier_config,
)
from trainer.errorfeedback import FreshEFs
from trainer.node import HostNode
from verifier.node import VerifierNode

HOSTS = {1: ("honest", {}), 2: ("honest", {}), 3: ("ef_forge", {"forger": "ef_hoard"}),
         4: ("ef_forge", {"forger": "topk_shifted"})}  # fmt: skip
VERIFIERS = (11, 12)
STEPS = 3


def _val_loss(gm: GlobalModel, corpus: Any, cfg: Any) -> float:
    model = build_model(SPEC)
    gm.load_into(model)
    return eval_loss(
        model, corpus.val, 4, cfg.seed, batch_size=cfg.batch_size, seq_len=cfg.seq_len, loss_fn=lm_loss
    )


def test_sparse_hosts_carry_error_feedback_and_forgers_are_caught(tmp_path: Path) -> None:
    corpus = tiny_corpus()
    chain = LockstepChain()
    cfg = run_config(
        corpus, max_outer_steps=STEPS, codec=Codec.SPARSE, codec_block_size=64, codec_topk=8,
        inner={"lr": 3e-3},
    )  # fmt: skip
    assert cfg.outer.sparse_mean is SparseMean.CONTRIBUTORS  # the default (issue 37)
    run_id = create_run(chain, cfg)
    quick: dict[str, Any] = {"log": lambda e: None, "patience": IMPATIENT}
    hosts = {i: HostNode(host_config(tmp_path, i, run_id), chain, corpus=corpus,
                         behaviour=resolve_host(name, params), **quick)
             for i, (name, params) in HOSTS.items()}  # fmt: skip
    followed: list[dict[str, Any]] = []  # the verifiers compute G_{n+1} themselves (nodekit.nextmodel)
    verifiers = [
        VerifierNode(verifier_config(tmp_path, i, run_id), chain, corpus=corpus,
                     **{**quick, "patience": IMPATIENT_VERIFIER, "log": followed.append})
        for i in VERIFIERS
    ]
    with running([n.run for n in [*hosts.values(), *verifiers]], chain):
        pass

    honest = sorted(hosts[i].address for i in (1, 2))
    forgers = {hosts[3].address: "ef_hoard", hosts[4].address: "topk_shifted"}
    got = verdicts(chain, run_id, STEPS)
    for n in range(STEPS):
        step = chain.query("outer_step", run_id=run_id, step=n)
        assert step["phase"] == "DONE" and step["accepted"] == honest, (n, step["outcomes"])
        for host in forgers:
            assert step["outcomes"][host] == "rejected", (n, host)
    for n, host, reason in got:
        want = Reason.ACCEPT if host in honest else Reason.DELTA_MISMATCH
        assert reason == want, (n, host, forgers.get(host), reason)
    on_chain = [v for n in range(STEPS) for v in chain.query("verdicts", run_id=run_id, step=n)["verdicts"]]
    details = " ".join(v["detail"] for v in on_chain)
    assert "committed e" in details and "C(β·e + θ_start − θ_H)" in details  # each lie, by its own check

    # every honest commit carried its e_next; the next start named it; it is on the host's disk
    layout = {n: tuple(p.shape) for n, p in build_model(SPEC).named_parameters()}
    zeros = fresh_ef_hash(layout)
    for i in (1, 2):
        a = hosts[i].address
        commits = [chain.query("commitment", run_id=run_id, host=a, step=n) for n in range(STEPS)]
        carried = [c["final_ef_hash"] for c in commits]
        assert all(carried) and len(set(carried)) == STEPS and zeros not in carried
        assert chain.query("start_ef_hash", run_id=run_id, host=a) == carried[-1]
        assert ContentStore(tmp_path / f"host-{i}" / "store").has(Kind.ERROR_FEEDBACK, carried[-1], EF_GROUP)
    for a in forgers:  # a rejected contribution never chains on: its next start is zeros again
        assert chain.query("start_ef_hash", run_id=run_id, host=a) is None

    # the verifiers' own G_{n+1}, over the contributors' mean, is the hosts' result the chain adopted
    applied = {(e["node"], e["outer_step"]) for e in followed if e["event"] == "outer_step_applied"}
    assert not [e for e in followed if e["event"] == "outer_step_differs"]
    assert len(applied) == STEPS * len(VERIFIERS), sorted(applied)

    # the model learned: G_T's validation loss is below G_0's
    final = chain.run(run_id)["global_model_hash"]
    g0 = GlobalModel.from_module(build_model(SPEC))
    gt = node_globals(tmp_path / "host-1").load(final)
    before, after = _val_loss(g0, corpus, cfg), _val_loss(gt, corpus, cfg)
    assert math.isfinite(after) and after < before, (before, after)


def test_the_stored_step_is_the_protocols_step(tmp_path: Path) -> None:
    """`ef_step_stored` (e read from disk, e_next written tensor by tensor and hashed from the file)
    gives the payload and e hash of `protocol.errorfeedback.ef_step` on the same inputs."""
    gen = torch.Generator().manual_seed(0)
    layout = {"a": (3, 50), "b.w": (70,), "c": (1,)}
    e = {n: torch.randn(s, generator=gen) for n, s in layout.items()}
    delta = {n: torch.randn(s, generator=gen) for n, s in layout.items()}
    cfg = EFConfig(chunk=16, topk=3, decay=0.95)
    content = ContentStore(tmp_path / "store")
    writer = EFWriter(content, layout)
    for n in sorted(e, reverse=True):  # any order: each tensor lands at its offset
        writer.write(n, e[n])
    h = writer.finish()
    assert h == ef_hash(e) and content.has(Kind.ERROR_FEEDBACK, h, EF_GROUP)
    stored = start_ef(content, layout, h)
    assert stored is not None and start_ef(content, layout, None) is None
    payload, e_hash = ef_step_stored(content, layout, cfg, sorted(delta.items()), stored)
    want_payload, want_e = ef_step(e, delta, cfg)
    assert payload == want_payload and e_hash == ef_hash(want_e)
    assert content.has(Kind.ERROR_FEEDBACK, e_hash, EF_GROUP)


def test_tolerance_mode_rebuilds_the_sparse_step_from_the_checked_claim(tmp_path: Path) -> None:
    """Tolerance replay: the verifier encodes C(β·e + Δ) from the claimed θ_H it checked (what the
    host encoded), so an honest sparse host is accepted and a forged accumulator still is not."""
    corpus = tiny_corpus()
    chain = LockstepChain()
    cfg = run_config(
        corpus, max_outer_steps=2, codec=Codec.SPARSE, codec_block_size=64, codec_topk=8,
        replay_mode=ReplayMode.TOLERANCE, tolerance=1e-3, tolerance_exp_avg=1e-3, tolerance_exp_avg_sq=1e-3,
    )  # fmt: skip
    run_id = create_run(chain, cfg)
    quick: dict[str, Any] = {"log": lambda e: None, "patience": IMPATIENT}
    honest = HostNode(host_config(tmp_path, 1, run_id), chain, corpus=corpus, **quick)
    forger = HostNode(host_config(tmp_path, 2, run_id), chain, corpus=corpus,
                      behaviour=resolve_host("ef_forge", {"forger": "ef_hoard"}), **quick)  # fmt: skip
    vcfg = verifier_config(tmp_path, 11, run_id)
    verifier = VerifierNode(vcfg, chain, corpus=corpus, **{**quick, "patience": IMPATIENT_VERIFIER})
    with running([honest.run, forger.run, verifier.run], chain):
        pass
    for n in range(2):
        step = chain.query("outer_step", run_id=run_id, step=n)
        assert step["accepted"] == [honest.address], (n, step["outcomes"])
    reasons = {(n, h): r for n, h, r in verdicts(chain, run_id, 2)}
    assert reasons == {(n, h): (Reason.ACCEPT if h == honest.address else Reason.DELTA_MISMATCH)
                       for n in range(2) for h in (honest.address, forger.address)}  # fmt: skip
    assert chain.query("start_ef_hash", run_id=run_id, host=honest.address) is not None


def test_an_accumulator_written_while_pruning_is_kept_until_its_step_is_recorded() -> None:
    """Overlapped runs prune after step n while step n + 1 (or n + 2) trains: an e_next on disk
    but not yet in a record must survive that prune (`FreshEFs`)."""
    fresh = FreshEFs(threading.RLock())
    seen: list[set[str] | None] = []
    assert fresh.write(3, lambda: (seen.append(fresh.held(1)), "e3")[1]) == "e3"
    assert seen == [None]  # mid-write: prune nothing now
    assert fresh.held(2) == {"e3"}  # written for a step after the pruned one: kept
    assert fresh.held(3) == set()  # its step is pruned: the records and the chain decide now
