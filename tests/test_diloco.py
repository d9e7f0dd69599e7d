"""DiLoCo around a user's own model: it trains, and workers agree bitwise after every sync."""

from __future__ import annotations

import threading

import pytest
import torch
from torch import nn

from protocol.outer import eager_scale
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


# ---------------------------------------------------------------- the overlapped schedule (issue 16)

H, T = 3, 4
POISON = 1e3  # a rejected Δ this large would show in any global model or start it reached


def _sequential_reference(accept: list[list[str]]) -> tuple[list[dict[str, torch.Tensor]], list]:
    """The recurrence written out by hand: step n trains from base_n = G_n,
    Δ_n = base_n − θ_{n,H}, G_{n+1} = Nesterov(G_n, mean of the accepted Δ_n), inner state carried."""
    model = _toy(3)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x, y = _data(0)
    lr, mu = 0.7, 0.9
    globals_ = [{n: p.detach().clone() for n, p in model.named_parameters()}]
    buf = {n: torch.zeros_like(t) for n, t in globals_[0].items()}
    starts = []
    for n in range(T):
        base = globals_[n]
        starts.append(base)
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(base[name])
        for i in range(H):
            opt.zero_grad()
            ((model(x[i * 32 : i * 32 + 32]) - y[i * 32 : i * 32 + 32]) ** 2).mean().backward()
            opt.step()
        own = {name: base[name] - p.detach() for name, p in model.named_parameters()}
        entering = [own if who == "me" else {k: torch.full_like(v, 0.01) for k, v in own.items()}
                    for who in accept[n]]  # fmt: skip
        g = globals_[n]
        if entering:
            mean = {k: sum(d[k] for d in entering) / len(entering) for k in g}
            buf = {k: mu * buf[k] + mean[k] for k in g}
            g = {k: g[k] - lr * (mean[k] + mu * buf[k]) for k in g}
        globals_.append(g)
    return globals_, starts


def _wrapper(accept: list[list[str]], eager: bool = False) -> tuple[list[dict[str, torch.Tensor]], list]:
    """The same run through `DiLoCo(eager=eager)`; the aggregation hands back only the
    accepted Δs of each step (ours and/or a peer's), never the rejected poisoned one."""
    model = _toy(3)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x, y = _data(0)
    step = [0]

    def aggregate(name: str, tokens: int, delta: dict) -> list:
        rejected = {k: torch.full_like(v, POISON) for k, v in delta.items()}  # submitted, rejected
        peer = {k: torch.full_like(v, 0.01) for k, v in delta.items()}
        offered = {
            "me": (name, tokens, delta),
            "peer": ("peer", tokens, peer),
            "liar": ("liar", tokens, rejected),
        }
        out = [offered[who] for who in accept[step[0]]]
        step[0] += 1
        return out

    dl = DiLoCo(model, opt, sync_every=H, aggregate=aggregate, eager=eager)
    globals_ = [dict(dl.global_params)]
    starts = [{n: p.detach().clone() for n, p in model.named_parameters()}]
    for i in range(H * T):
        opt.zero_grad()
        j = i % H
        ((model(x[j * 32 : j * 32 + 32]) - y[j * 32 : j * 32 + 32]) ** 2).mean().backward()
        opt.step()
        if dl.inner_steps % H == 0:
            globals_.append(dict(dl.global_params))
            starts.append({n: p.detach().clone() for n, p in model.named_parameters()})
            assert all(torch.equal(starts[-1][n], dl.base_params[n]) for n in starts[-1])
    dl.close()
    return globals_, starts[:T]


# step 1: our own Δ rejected (only the peer's enters); step 2: nothing accepted at all
ACCEPT = [["me", "peer"], ["peer"], [], ["me"]]


def test_sequential_matches_the_hand_written_recurrence() -> None:
    got_g, got_starts = _wrapper(ACCEPT)
    want_g, want_starts = _sequential_reference(ACCEPT)
    for got, want in zip(got_g, want_g, strict=True):
        assert all(torch.allclose(got[n], want[n], atol=1e-5, rtol=1e-5) for n in want)
    for got, want in zip(got_starts, want_starts, strict=True):
        assert all(torch.allclose(got[n], want[n], atol=1e-5, rtol=1e-5) for n in want)
    # only accepted Δs: the liar's 1e3 entries reached no global model and no start state
    assert max(float(t.abs().max()) for g in got_g for t in g.values()) < 10


# ---------------------------------------------------------------- the eager schedule (issue 16)


def _eager_reference(accept: list[list[str]]) -> tuple[list[dict[str, torch.Tensor]], list]:
    """Eager by hand: step n starts from Nesterov(G_{n−1}, b_{n−1}, α·own Δ_{n−1}) (weight 1) when its
    step n − 1 contribution is a parent (its own parent, if any, accepted), else from G_{n−1};
    Δ_n = start_n − θ_{n,H}; G_{n+1} = Nesterov(G_n, mean of the accepted Δ_n); optimizer carried."""
    model = _toy(3)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x, y = _data(0)
    lr, mu = 0.7, 0.9
    globals_ = [{n: p.detach().clone() for n, p in model.named_parameters()}]
    moms = [{n: torch.zeros_like(t) for n, t in globals_[0].items()}]
    starts: list[dict[str, torch.Tensor]] = []
    eligible: list[bool] = []
    own: dict[str, torch.Tensor] = {}
    for n in range(T):
        base, bmom = globals_[max(0, n - 1)], moms[max(0, n - 1)]
        if n >= 1 and eligible[n - 1]:
            a = float(eager_scale(lr, mu))  # α = 1/(lr·(1+μ)): the own Δ enters with coefficient 1
            start = {k: base[k] - lr * (a * own[k] + mu * (mu * bmom[k] + a * own[k])) for k in base}
        else:
            start = base
        eligible.append(not (n >= 1 and eligible[n - 1]) or "me" in accept[n - 1])
        starts.append(start)
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(start[name])
        for i in range(H):
            opt.zero_grad()
            ((model(x[i * 32 : i * 32 + 32]) - y[i * 32 : i * 32 + 32]) ** 2).mean().backward()
            opt.step()
        own = {name: start[name] - p.detach() for name, p in model.named_parameters()}
        entering = [own if who == "me" else {k: torch.full_like(v, 0.01) for k, v in own.items()}
                    for who in accept[n]]  # fmt: skip
        g, b = globals_[n], moms[n]
        if entering:
            mean = {k: sum(d[k] for d in entering) / len(entering) for k in g}
            b = {k: mu * b[k] + mean[k] for k in g}
            g = {k: g[k] - lr * (mean[k] + mu * b[k]) for k in g}
        globals_.append(g)
        moms.append(b)
    return globals_, starts


def test_eager_matches_the_hand_written_recurrence_and_keeps_rejected_deltas_out() -> None:
    """Step 1's own Δ is rejected: it is step 2's stand-in (its verdict is not known when step 2
    opens) but never reaches a global model, and step 3 (whose parent would be step 2, a child of
    the rejected Δ) starts from G_2 without it."""
    got_g, got_starts = _wrapper(ACCEPT, eager=True)
    want_g, want_starts = _eager_reference(ACCEPT)
    for got, want in zip(got_g, want_g, strict=True):
        assert all(torch.allclose(got[n], want[n], atol=1e-5, rtol=1e-5) for n in want)
    for got, want in zip(got_starts, want_starts, strict=True):
        assert all(torch.allclose(got[n], want[n], atol=1e-5, rtol=1e-5) for n in want)
    assert max(float(t.abs().max()) for g in got_g for t in g.values()) < 10
    assert not all(torch.equal(got_starts[1][k], got_g[0][k]) for k in got_starts[1])  # own Δ moved it
    assert all(torch.equal(got_starts[3][k], got_g[2][k]) for k in got_starts[3])  # no parent: G_2
