"""DiLoCo around a user's own model: it trains, and workers agree bitwise after every sync."""

from __future__ import annotations

import threading

import pytest
import torch
from torch import nn

from trainer.diloco import DiLoCo, InProcessGroup


def _toy(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))


def _data(worker: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + worker)
    x = torch.randn(256, 4, generator=g)
    return x, x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])


def _loss(model: nn.Module, worker: int) -> float:
    x, y = _data(worker)
    with torch.no_grad():
        return float(((model(x) - y) ** 2).mean())


def test_two_workers_train_a_user_model_and_stay_in_sync() -> None:
    group = InProcessGroup(2, timeout=60)
    models = [_toy(0), _toy(0)]
    before = sum(_loss(m, w) for w, m in enumerate(models))
    snapshots: list[list[dict[str, torch.Tensor]]] = [[], []]
    outer_steps = [0, 0]  # asserted in the main thread: a failed assert in a worker would be lost

    def worker(w: int) -> None:
        model = models[w]
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        dl = DiLoCo(model, opt, sync_every=10, aggregate=group, name=f"w{w}", outer_lr=0.7)
        x, y = _data(w)
        for i in range(60):
            opt.zero_grad()
            (
                (model(x[i % 8 * 32 : i % 8 * 32 + 32]) - y[i % 8 * 32 : i % 8 * 32 + 32]) ** 2
            ).mean().backward()
            opt.step()
            if dl.inner_steps % 10 == 0:
                snapshots[w].append({n: p.detach().clone() for n, p in model.named_parameters()})
        outer_steps[w] = dl.outer_steps
        dl.close()

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert outer_steps == [6, 6]
    assert len(snapshots[0]) == len(snapshots[1]) == 6
    for a, b in zip(*snapshots, strict=True):
        assert all(torch.equal(a[n], b[n]) for n in a)  # the outer step is bitwise identical
    after = sum(_loss(m, w) for w, m in enumerate(models))
    assert after < 0.5 * before


def test_solo_diloco_counts_and_rejects_bad_interval() -> None:
    model = _toy(1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="sync_every"):
        DiLoCo(model, opt, sync_every=0)
    dl = DiLoCo(model, opt, sync_every=3)
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    x, y = _data(0)
    for _ in range(3):
        opt.zero_grad()
        ((model(x) - y) ** 2).mean().backward()
        opt.step()
    assert dl.outer_steps == 1
    # after a sync the local params ARE the global params, and they moved
    assert all(torch.equal(p, dl.global_params[n]) for n, p in model.named_parameters())
    assert not all(torch.equal(start[n], dl.global_params[n]) for n in start)
    dl.close()
    opt.step()
    assert dl.inner_steps == 3
