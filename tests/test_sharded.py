"""Prototype of phase 2: the tensor-sharded AdamW step (ranks as threads) trains exactly the
trajectory of the unsharded data-parallel step, bit for bit, with each rank holding 1/W of the moments."""

from __future__ import annotations

import threading

import pytest

from tests.test_step_replay import HOST, fresh, tiny_cfg, tiny_corpus
from trainer.data import batch
from trainer.model import lm_loss
from trainer.sharded import LocalGroup, ShardedAdamW, shard_ranges
from trainer.step import configure_determinism, train_segment, training_hash, training_state


def test_shard_ranges_cover_every_tensor_once_in_order() -> None:
    for numels, w in (([5, 1, 1, 9, 3], 2), ([4] * 7, 4), ([10, 1], 4), ([1], 1)):
        ranges = shard_ranges(numels, w)
        assert len(ranges) == w and [i for r in ranges for i in r] == list(range(len(numels)))
    assert [list(r) for r in shard_ranges([4] * 8, 4)] == [[0, 1], [2, 3], [4, 5], [6, 7]]


@pytest.mark.parametrize("world", [2, 4])
def test_sharded_step_is_the_unsharded_trajectory_bit_for_bit(world: int) -> None:
    configure_determinism(1)
    cfg, data, steps = tiny_cfg(), tiny_corpus(), 3
    ref_model, ref_opt = fresh(cfg)
    train_segment(ref_model, ref_opt, cfg, data, HOST, 0, 0, steps, micro_batches=world)
    want = training_hash(training_state(ref_model, ref_opt))

    group = LocalGroup(world)
    models = [fresh(cfg)[0] for _ in range(world)]
    ranks = [ShardedAdamW(models[r], cfg.inner, group.member(r)) for r in range(world)]
    errors: list[BaseException] = []

    def rank(r: int) -> None:
        try:
            for i in range(steps):
                ranks[r].step(*batch(cfg, data, HOST, 0, i), lm_loss)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)
            group._barrier.abort()

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors

    state = {f"param/{n}": p.detach() for n, p in models[0].named_parameters()}
    for r in range(world):
        state.update(ranks[r].shard_state({p: n for n, p in models[r].named_parameters()}))
        own = sum(p.numel() for p in ranks[r].mine)
        assert own < sum(p.numel() for p in models[r].parameters())  # moments of a shard only
    assert training_hash(state) == want
    for m in models[1:]:  # every replica holds the same parameters after the all-gather
        assert all(a.equal(b) for a, b in zip(m.parameters(), models[0].parameters(), strict=True))
