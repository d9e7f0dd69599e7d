"""Outer step: agrees with torch's Nesterov SGD, and is bitwise stable across threads and orders."""

from __future__ import annotations

import itertools
import subprocess
import sys
import textwrap
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch

from protocol.outer import (
    OuterError,
    f32_nearest,
    global_model_hash,
    mean_weights,
    outer_update,
    weighted_mean,
)

ROOT = Path(__file__).resolve().parents[1]


def tensors(seed: int, shapes: dict[str, tuple[int, ...]], scale: float = 1.0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {n: torch.randn(s, generator=g) * scale for n, s in shapes.items()}


SHAPES = {"w": (16, 8), "b": (8,), "emb.weight": (5, 3)}


def test_f32_nearest_is_correctly_rounded() -> None:
    assert f32_nearest(Fraction(1, 3)) == np.float32(1 / 3)
    assert f32_nearest(Fraction(1) + Fraction(1, 2**24)) == np.float32(1.0)  # tie → even
    assert f32_nearest(Fraction(1) + Fraction(3, 2**24)) == np.float32(1 + 2**-22)  # tie → even (up)
    # Rounding through double first would land on the tie and round down; exact rounding goes up.
    x = Fraction(1) + Fraction(1, 2**24) + Fraction(1, 2**60)
    assert float(x) == 1 + 2**-24
    assert f32_nearest(x) == np.float32(1 + 2**-23)


def test_mean_weights() -> None:
    assert mean_weights([1, 2]) == [np.float32(1 / 3), np.float32(2 / 3)]
    assert mean_weights([0, 5]) == [np.float32(0), np.float32(1)]
    for bad in ([0, 0], [-1, 2], [1.5, 1], []):
        with pytest.raises(OuterError):
            mean_weights(bad)  # type: ignore[arg-type]


def test_matches_torch_sgd_nesterov_over_steps() -> None:
    params = tensors(0, SHAPES)
    momentum = {n: torch.zeros_like(t) for n, t in params.items()}
    model = {n: torch.nn.Parameter(t.clone()) for n, t in params.items()}
    opt = torch.optim.SGD(list(model.values()), lr=0.7, momentum=0.9, nesterov=True, dampening=0)
    for step in range(3):
        deltas = [(f"gonka1h{i}", 100 * (i + 1), tensors(10 * step + i, SHAPES, 0.01)) for i in range(3)]
        total = sum(w for _, w, _ in deltas)
        params, momentum = outer_update(params, momentum, deltas, lr=0.7, mu=0.9)
        for n, p in model.items():
            p.grad = sum((d[n] * (w / total) for _, w, d in deltas), torch.zeros_like(p))
        opt.step()
        for n, p in model.items():
            torch.testing.assert_close(params[n], p.detach(), rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(momentum[n], opt.state[p]["momentum_buffer"], rtol=1e-5, atol=1e-6)


def test_mean_is_sequential_float32_sum() -> None:
    deltas = [(h, w, tensors(s, SHAPES)) for h, w, s in [("gonka1b", 3, 1), ("gonka1a", 1, 2)]]
    c = [torch.tensor(1 / 4, dtype=torch.float32), torch.tensor(3 / 4, dtype=torch.float32)]
    expected = deltas[1][2]["w"] * c[0] + deltas[0][2]["w"] * c[1]  # sorted: gonka1a first
    assert torch.equal(weighted_mean(deltas, deltas[0][2])["w"], expected)


def test_order_of_deltas_does_not_matter_bitwise() -> None:
    params, momentum = tensors(1, SHAPES), tensors(2, SHAPES, 0.1)
    deltas = [(f"gonka1h{i}", 7 + i * 13, tensors(20 + i, SHAPES, 0.05)) for i in range(4)]
    ref = global_model_hash(*outer_update(params, momentum, deltas, 0.7, 0.9))
    for perm in itertools.islice(itertools.permutations(deltas), 1, 24, 5):
        assert global_model_hash(*outer_update(params, momentum, list(perm), 0.7, 0.9)) == ref
    # and the hash is sensitive: a different weight changes it
    changed = [(h, w + (h == "gonka1h0"), d) for h, w, d in deltas]
    assert global_model_hash(*outer_update(params, momentum, changed, 0.7, 0.9)) != ref


def test_empty_deltas_and_no_mutation() -> None:
    params, momentum = tensors(3, SHAPES), tensors(4, SHAPES)
    before = global_model_hash(params, momentum)
    p2, m2 = outer_update(params, momentum, [], 0.7, 0.9)
    assert global_model_hash(p2, m2) == before
    assert all(p2[n] is not params[n] for n in params)
    outer_update(params, momentum, [("gonka1x", 5, tensors(5, SHAPES))], 0.7, 0.9)
    assert global_model_hash(params, momentum) == before


def test_global_hash_separates_params_and_momentum() -> None:
    a, b = tensors(6, SHAPES), tensors(7, SHAPES)
    assert global_model_hash(a, b) != global_model_hash(b, a)


def test_bad_inputs_are_named_errors() -> None:
    params, momentum = tensors(1, SHAPES), tensors(2, SHAPES)
    good = tensors(3, SHAPES)
    cases = [
        [("gonka1a", 1, {**good, "extra": torch.zeros(1)})],
        [("gonka1a", 1, {**good, "b": torch.zeros(9)})],
        [("gonka1a", 1, {**good, "b": torch.zeros(8, dtype=torch.float64)})],
        [("gonka1a", 1, good), ("gonka1a", 2, good)],
        [("gonka1a", 0, good)],
    ]
    for deltas in cases:
        with pytest.raises(OuterError):
            outer_update(params, momentum, deltas, 0.7, 0.9)
    with pytest.raises(OuterError):
        outer_update(params, {"w": momentum["w"]}, [], 0.7, 0.9)


_CHILD = textwrap.dedent(
    """
    import sys, torch
    torch.set_num_threads(int(sys.argv[1]))
    from protocol.outer import outer_update, global_model_hash
    g = torch.Generator().manual_seed(0)
    shapes = {"a": (512, 1024), "b": (300, 700), "c": (1000,)}
    def rand(scale):
        return {n: torch.randn(s, generator=g) * scale for n, s in shapes.items()}
    params, momentum = rand(1.0), rand(0.1)
    deltas = [(f"gonka1h{i}", 1000 + 37 * i, rand(0.01)) for i in range(3)]
    for _ in range(2):
        params, momentum = outer_update(params, momentum, deltas, 0.7, 0.9)
    print(torch.get_num_threads(), global_model_hash(params, momentum))
    """
)


@pytest.mark.slow
def test_bitwise_identical_across_thread_counts_in_separate_processes() -> None:
    out = {}
    for threads in (1, 2):
        cmd = [sys.executable, "-c", _CHILD, str(threads)]
        res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr
        got_threads, digest = res.stdout.split()
        assert int(got_threads) == threads
        out[threads] = digest
    assert out[1] == out[2]


def test_streaming_accumulator_has_the_bits_of_outer_update() -> None:
    """One Δ at a time, tensor by tensor, in sorted order: bitwise what `outer_update` gives."""
    from protocol.outer import Accumulator

    g = torch.Generator().manual_seed(3)
    shapes = {"a": (17, 5), "b": (9,), "c": (4, 4, 3)}
    params = {n: torch.randn(s, generator=g) for n, s in shapes.items()}
    momentum = {n: torch.randn(s, generator=g) * 0.1 for n, s in shapes.items()}
    hosts = ["gonka1zz", "gonka1aa", "gonka1mm", "gonka1bb"]
    deltas = [(h, 1000 + 37 * i, {n: torch.randn(s, generator=g) * 1e-2 for n, s in shapes.items()})
              for i, h in enumerate(hosts)]  # fmt: skip
    want_p, want_m = outer_update(params, momentum, deltas, 0.7, 0.9)
    acc = Accumulator(params, {h: w for h, w, _ in deltas})
    for host, _, delta in sorted(deltas, key=lambda d: d[0]):
        acc.add(host, reversed(list(delta.items())))  # tensor order inside one Δ does not matter
    got_p, got_m = acc.finish(params, momentum, 0.7, 0.9)
    for n in shapes:
        assert torch.equal(got_p[n].view(torch.int32), want_p[n].view(torch.int32))
        assert torch.equal(got_m[n].view(torch.int32), want_m[n].view(torch.int32))
    with pytest.raises(OuterError, match="out of order"):
        Accumulator(params, {h: 1 for h in hosts}).add("gonka1zz", deltas[0][2].items())


# ---------------------------------------------------------------- sparse payloads (specs §7, codec sparse)


def _sparse_case(seed: int = 11) -> tuple[dict, dict, list[tuple[str, int, bytes]], dict]:
    from protocol.codecs import encode

    g = torch.Generator().manual_seed(seed)
    shapes = {"a": (50, 9), "b": (9,), "c": (4, 4, 3)}
    params = {n: torch.randn(s, generator=g) for n, s in shapes.items()}
    momentum = {n: torch.randn(s, generator=g) * 0.1 for n, s in shapes.items()}
    payloads = []
    for i, h in enumerate(["gonka1zz", "gonka1aa", "gonka1mm"]):
        d = {n: torch.randn(s, generator=g) * 1e-2 for n, s in shapes.items()}
        payloads.append((h, 1000 + 37 * i, encode(d, "sparse", 64, 5)))
    return params, momentum, payloads, shapes


def _dense_reference(params: dict, payloads: list, shapes: dict) -> dict[str, torch.Tensor]:
    """specs §7 for sparse payloads, densely: g = +0, then g = g + c_i·decode(payload_i), sorted."""
    from protocol.codecs import decode

    ordered = sorted(payloads, key=lambda p: p[0])
    cs = [torch.tensor(float(c)) for c in mean_weights([w for _, w, _ in ordered])]
    g = {n: torch.zeros(s) for n, s in shapes.items()}
    for (_, _, p), c in zip(ordered, cs, strict=True):
        d = decode(p, shapes)
        g = {n: torch.add(g[n], torch.mul(d[n], c)) for n in shapes}
    return g


@pytest.mark.parametrize("rule", ["nesterov", "average"])
def test_sparse_aggregation_has_the_bits_of_the_dense_rule(rule: str) -> None:
    from protocol.config import OuterRule
    from protocol.outer import SparseAccumulator, apply_rule, sparse_outer_update

    params, momentum, payloads, shapes = _sparse_case()
    want_p, want_m = apply_rule(OuterRule(rule), params, momentum, _dense_reference(params, payloads, shapes),
                                0.7, 0.9)  # fmt: skip
    acc = SparseAccumulator(shapes, {h: w for h, w, _ in payloads}, chunk=64, topk=5)
    for h, _, p in sorted(payloads):
        acc.add(h, memoryview(p))
    got = [acc.finish(params, momentum, 0.7, 0.9, OuterRule(rule)),
           sparse_outer_update(params, momentum, payloads, 0.7, 0.9, chunk=64, topk=5, rule=OuterRule(rule))]
    for got_p, got_m in got:
        for n in shapes:
            assert torch.equal(got_p[n].view(torch.int32), want_p[n].view(torch.int32))
            assert torch.equal(got_m[n].view(torch.int32), want_m[n].view(torch.int32))
    if rule == "average":  # θ − lr·g, the momentum untouched
        assert all(torch.equal(got[0][1][n], momentum[n]) for n in shapes)


def test_sparse_aggregation_refuses_what_does_not_fit() -> None:
    import struct

    from protocol.codecs import encode, read_header
    from protocol.outer import SparseAccumulator, sparse_outer_update

    params, momentum, payloads, shapes = _sparse_case()
    tokens = {h: w for h, w, _ in payloads}
    acc = SparseAccumulator(shapes, tokens, chunk=64, topk=5)
    with pytest.raises(OuterError, match="out of order"):
        acc.add("gonka1zz", payloads[0][2])
    with pytest.raises(OuterError, match="int8 payload"):
        acc.add("gonka1aa", encode({n: torch.zeros(s) for n, s in shapes.items()}, "int8", 64))
    with pytest.raises(OuterError, match="topk 5"):
        acc.add("gonka1aa", encode({n: torch.zeros(s) for n, s in shapes.items()}, "sparse", 64, 4))
    broken = bytearray(payloads[1][2])
    start = read_header(payloads[1][2]).spans()["c"][0]
    broken[start : start + 4] = struct.pack("<f", float("nan"))  # the last tensor's first scale
    with pytest.raises(OuterError, match="NaN"):
        acc.add("gonka1aa", bytes(broken))
    assert acc.added == 0 and all(int(torch.count_nonzero(t)) == 0 for t in acc.acc.values())  # untouched
    with pytest.raises(OuterError, match="not added"):
        acc.finish(params, momentum, 0.7, 0.9)
    with pytest.raises(OuterError, match="twice"):
        sparse_outer_update(params, momentum, [payloads[0], payloads[0]], 0.7, 0.9, chunk=64, topk=5)
    same_p, same_m = sparse_outer_update(params, momentum, [], 0.7, 0.9, chunk=64, topk=5)
    assert all(torch.equal(same_p[n], params[n]) and torch.equal(same_m[n], momentum[n]) for n in shapes)


_SPARSE_CHILD = textwrap.dedent(
    """
    import sys, torch
    torch.set_num_threads(int(sys.argv[1]))
    from protocol.codecs import encode
    from protocol.config import OuterRule
    from protocol.outer import SparseAccumulator, global_model_hash
    g = torch.Generator().manual_seed(0)
    shapes = {"a": (512, 1024), "b": (300, 700), "c": (1000,)}
    def rand(scale):
        return {n: torch.randn(s, generator=g) * scale for n, s in shapes.items()}
    params, momentum = rand(1.0), rand(0.1)
    payloads = [(f"gonka1h{i}", 1000 + 37 * i, encode(rand(0.01), "sparse", 4096, 64)) for i in range(3)]
    for rule in (OuterRule.NESTEROV, OuterRule.AVERAGE):
        acc = SparseAccumulator(shapes, {h: w for h, w, _ in payloads}, chunk=4096, topk=64)
        for h, _, p in payloads:
            acc.add(h, p)
        params, momentum = acc.finish(params, momentum, 0.7, 0.9, rule)
    print(torch.get_num_threads(), global_model_hash(params, momentum))
    """
)


def test_sparse_aggregation_is_bitwise_identical_across_thread_counts() -> None:
    out = {}
    for threads in (1, 2):
        cmd = [sys.executable, "-c", _SPARSE_CHILD, str(threads)]
        res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stderr
        got_threads, digest = res.stdout.split()
        assert int(got_threads) == threads
        out[threads] = digest
    assert out[1] == out[2]


def test_average_rule_on_dense_deltas() -> None:
    from protocol.config import OuterRule

    params, momentum = tensors(1, SHAPES), tensors(2, SHAPES, 0.1)
    deltas = [("gonka1b", 3, tensors(3, SHAPES, 0.01)), ("gonka1a", 1, tensors(4, SHAPES, 0.01))]
    new_p, new_m = outer_update(params, momentum, deltas, 0.5, 0.9, rule=OuterRule.AVERAGE)
    g = weighted_mean(deltas, params)
    for n in SHAPES:
        assert torch.equal(new_p[n], torch.sub(params[n], torch.mul(g[n], torch.tensor(0.5))))
        assert torch.equal(new_m[n], momentum[n])
