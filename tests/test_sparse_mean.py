"""`outer.sparse_mean` (issue 37, specs §4.1, §7): the sparse mean over the hosts that kept a
coordinate (SparseLoCo's reference aggregation) has the bits of a plain dense reference written
from the spec, whichever way it is computed (host by host with a count, tensor by tensor, the
node's `GlobalModel.apply_sparse`), in separate processes at 1 and 2 threads; the setting keeps
every existing config's hash and wire bytes."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from protocol.codecs import encode, iter_sparse
from protocol.config import ModelSpec, OuterOptim, OuterRule, RunConfig, SparseMean
from protocol.outer import (
    Denominators,
    SparseAccumulator,
    apply_rule,
    global_model_hash,
    mean_weights,
    sparse_outer_update,
)

ROOT = Path(__file__).resolve().parents[1]
SHAPES = {"a": (50, 9), "b": (9,), "c": (4, 4, 3)}
HOSTS = ["gonka1zz", "gonka1aa", "gonka1mm"]
CONTRIB = SparseMean.CONTRIBUTORS


def _case(tokens: list[int], seed: int = 11) -> tuple[dict, dict, list[tuple[str, int, bytes]]]:
    """Three hosts' payloads (chunk 64, k 5); host gonka1mm's "b" is all zeros, so its kept entries
    there decode to +0 (a chunk with scale 0) and still count as kept."""
    g = torch.Generator().manual_seed(seed)
    params = {n: torch.randn(s, generator=g) for n, s in SHAPES.items()}
    momentum = {n: torch.randn(s, generator=g) * 0.1 for n, s in SHAPES.items()}
    payloads = []
    for h, w in zip(HOSTS, tokens, strict=True):
        d = {n: torch.randn(s, generator=g) * 1e-2 for n, s in SHAPES.items()}
        if h == "gonka1mm":
            d["b"] = torch.zeros(SHAPES["b"])
        payloads.append((h, w, encode(d, "sparse", 64, 5)))
    return params, momentum, payloads


def dense_contributors_mean(payloads: list[tuple[str, int, bytes]], shapes: dict) -> dict[str, torch.Tensor]:
    """specs §4.1 CONTRIBUTORS, densely: s = +0 + c_i·Δ̂_i and d = +0 + c_i where host i kept the
    coordinate, in sorted host order; g = s / d where d ≠ 0, else +0."""
    ordered = sorted(payloads, key=lambda p: p[0])
    cs = [torch.tensor(float(c)) for c in mean_weights([w for _, w, _ in ordered])]
    s = {n: torch.zeros(sh) for n, sh in shapes.items()}
    d = {n: torch.zeros(sh) for n, sh in shapes.items()}
    for (_, _, p), c in zip(ordered, cs, strict=True):
        for name, e in iter_sparse(p, shapes):
            value, kept = torch.zeros(shapes[name]), torch.zeros(shapes[name], dtype=torch.bool)
            value.view(-1)[e.positions], kept.view(-1)[e.positions] = e.values, True
            s[name] = torch.add(s[name], torch.mul(value, c))
            d[name] = torch.where(kept, torch.add(d[name], c), d[name])
    return {n: torch.where(d[n] != 0, torch.div(s[n], d[n]), torch.zeros(())) for n in shapes}


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return set(a) == set(b) and all(torch.equal(a[n].view(torch.int32), b[n].view(torch.int32)) for n in a)


@pytest.mark.parametrize("rule", list(OuterRule))
@pytest.mark.parametrize("tokens", [[4096, 4096, 4096], [1000, 1037, 1074]], ids=["equal", "unequal"])
def test_contributors_mean_has_the_bits_of_the_dense_reference(rule: OuterRule, tokens: list[int]) -> None:
    params, momentum, payloads = _case(tokens)
    g = dense_contributors_mean(payloads, SHAPES)
    want_p, want_m = apply_rule(rule, params, momentum, g, 0.7, 0.9)
    acc = SparseAccumulator(SHAPES, {h: w for h, w, _ in payloads}, chunk=64, topk=5, mean=CONTRIB)
    assert acc.den is not None and acc.den.dtype == (torch.uint8 if len(set(tokens)) == 1 else torch.float32)
    for h, _, p in sorted(payloads):
        acc.add(h, memoryview(p))
    got = [
        acc.finish(params, momentum, 0.7, 0.9, rule),
        sparse_outer_update(params, momentum, payloads, 0.7, 0.9, chunk=64, topk=5, rule=rule, mean=CONTRIB),
    ]
    for got_p, got_m in got:
        assert _same(got_p, want_p) and _same(got_m, want_m)
    hosts_p, _ = sparse_outer_update(params, momentum, payloads, 0.7, 0.9, chunk=64, topk=5, rule=rule)
    assert not _same(hosts_p, want_p)  # the two rules are different means
    # one host: its kept values themselves (d = c = 1), where the mean over hosts would be the same
    from protocol.codecs import decode

    one = sparse_outer_update(params, momentum, payloads[:1], 1.0, 0.0, chunk=64, topk=5,
                              rule=OuterRule.AVERAGE, mean=CONTRIB)[0]  # fmt: skip
    assert _same(one, {n: torch.sub(params[n], t) for n, t in decode(payloads[0][2], SHAPES).items()})


def test_the_count_and_the_float_denominators_are_the_same_bits() -> None:
    """Equal weights: a count (uint8 to 255 hosts, int16 beyond) and the table of n-fold sums give
    exactly the float32 sums the unequal-weight path keeps."""
    g = torch.Generator().manual_seed(3)
    for hosts in (3, 255, 256, 300):
        coeffs = [torch.tensor(float(c)) for c in mean_weights([7] * hosts)]
        counted = Denominators(coeffs)
        assert counted.table is not None and counted.dtype == (torch.uint8 if hosts <= 255 else torch.int16)
        summed = Denominators(coeffs)
        summed.table, summed.dtype = None, torch.float32  # force the general path
        n = 1000
        cnt, den = counted.zeros((n,)), summed.zeros((n,))
        for c in coeffs:
            pos = torch.randperm(n, generator=g)[: n // 7]
            counted.add(cnt, pos, c)
            summed.add(den, pos, c)
        s1 = torch.randn(n, generator=g) * (den != 0)
        s2 = s1.clone()
        counted.divide(s1, cnt)
        summed.divide(s2, den)
        assert torch.equal(s1.view(torch.int32), s2.view(torch.int32))


_CHILD = textwrap.dedent(
    """
    import sys, torch
    torch.set_num_threads(int(sys.argv[1]))
    from protocol.codecs import encode
    from protocol.config import OuterRule, SparseMean
    from protocol.outer import SparseAccumulator, global_model_hash
    g = torch.Generator().manual_seed(0)
    shapes = {"a": (512, 1024), "b": (300, 700), "c": (1000,)}
    def rand(scale):
        return {n: torch.randn(s, generator=g) * scale for n, s in shapes.items()}
    params, momentum = rand(1.0), rand(0.1)
    out = [str(torch.get_num_threads())]
    for tokens in ([5000] * 3, [1000, 1037, 1074]):
        payloads = [(f"gonka1h{i}", w, encode(rand(0.01), "sparse", 4096, 64)) for i, w in enumerate(tokens)]
        p, m = params, momentum
        for rule in (OuterRule.NESTEROV, OuterRule.AVERAGE):
            acc = SparseAccumulator(shapes, {h: w for h, w, _ in payloads}, chunk=4096, topk=64,
                                    mean=SparseMean.CONTRIBUTORS)
            for h, _, pl in payloads:
                acc.add(h, pl)
            p, m = acc.finish(p, m, 0.7, 0.9, rule)
        out.append(global_model_hash(p, m))
    print(" ".join(out))
    """
)


def test_contributors_mean_is_bitwise_identical_across_processes_and_threads() -> None:
    """Separate processes at 1 and 2 threads, and this process's dense reference: one hash."""
    out = {}
    for threads in (1, 2):
        res = subprocess.run([sys.executable, "-c", _CHILD, str(threads)], cwd=ROOT, capture_output=True,
                             text=True, timeout=300)  # fmt: skip
        assert res.returncode == 0, res.stderr
        got_threads, *digests = res.stdout.split()
        assert int(got_threads) == threads
        out[threads] = digests
    assert out[1] == out[2]
    g = torch.Generator().manual_seed(0)  # the child's inputs again, through the dense reference
    shapes = {"a": (512, 1024), "b": (300, 700), "c": (1000,)}

    def rand(scale: float) -> dict[str, torch.Tensor]:
        return {n: torch.randn(s, generator=g) * scale for n, s in shapes.items()}

    params, momentum = rand(1.0), rand(0.1)
    want = []
    for tokens in ([5000] * 3, [1000, 1037, 1074]):
        payloads = [(f"gonka1h{i}", w, encode(rand(0.01), "sparse", 4096, 64)) for i, w in enumerate(tokens)]
        p, m = params, momentum
        for rule in (OuterRule.NESTEROV, OuterRule.AVERAGE):
            p, m = apply_rule(rule, p, m, dense_contributors_mean(payloads, shapes), 0.7, 0.9)
        want.append(global_model_hash(p, m))
    assert out[1] == want


def test_the_node_aggregates_with_the_runs_rule() -> None:
    """`GlobalModel.apply_sparse`, what hosts and verifiers both call (`nodekit.nextmodel`), reads
    `outer.sparse_mean` and lands on the bits of the spec's form."""
    from nodekit.globalmodel import GlobalModel

    params, momentum, payloads = _case([4096] * 3)
    by_host = {h: p for h, _, p in payloads}
    for mean in SparseMean:
        outer = OuterOptim(lr=1.0, rule=OuterRule.AVERAGE, sparse_mean=mean)
        gm = GlobalModel.adopt(dict(params), dict(momentum), 1 << 20)
        got = gm.apply_sparse({h: w for h, w, _ in payloads}, by_host.__getitem__, outer, chunk=64, topk=5)
        want_p, want_m = sparse_outer_update(params, momentum, payloads, 1.0, 0.9, chunk=64, topk=5,
                                             rule=OuterRule.AVERAGE, mean=mean)  # fmt: skip
        assert got.hash == global_model_hash(want_p, want_m, 1 << 20)


# ---------------------------------------------------------------- the run setting


def _cfg(**kw: object) -> RunConfig:
    return RunConfig(model=ModelSpec(factory="trainer.model:small_gpt"), dataset_manifest_hash="0" * 64,
                     initial_model_hash="0" * 64, **kw)  # type: ignore[arg-type]  # fmt: skip


def test_the_setting_keeps_every_existing_hash_and_wire_byte() -> None:
    """CONTRIBUTORS is the default and is omitted at it (as is an unset proto3 string): every config
    written before keeps its dump, hash and wire bytes; HOSTS is written out."""
    from protocol.messages import MsgCreateRun
    from protocol.wire import from_any, to_any

    creator = "gonka1" + "q" * 38
    assert OuterOptim().sparse_mean is SparseMean.CONTRIBUTORS
    sparse = _cfg(codec="sparse", codec_block_size=4096, outer=OuterOptim(lr=1.0, rule="average"))
    for base in (_cfg(), sparse):
        outer = base.outer.model_copy(update={"sparse_mean": SparseMean.CONTRIBUTORS})
        same = base.model_copy(update={"outer": outer})
        assert "sparse_mean" not in base.model_dump(mode="json")["outer"]
        assert same.config_hash() == base.config_hash()
        assert to_any(MsgCreateRun(creator=creator, config=same)).value == \
            to_any(MsgCreateRun(creator=creator, config=base)).value  # fmt: skip
    hosts = _cfg(codec="sparse", codec_block_size=4096,
                 outer=OuterOptim(lr=1.0, rule="average", sparse_mean="hosts"))  # fmt: skip
    assert hosts.model_dump(mode="json")["outer"]["sparse_mean"] == "hosts"
    assert hosts.config_hash() != sparse.config_hash()
    back = from_any(to_any(MsgCreateRun(creator=creator, config=hosts)))
    assert back.config == hosts and back.config.config_hash() == hosts.config_hash()  # type: ignore[union-attr]
    unset = OuterOptim.model_validate({"sparse_mean": ""})  # proto3 unset
    assert unset.sparse_mean is SparseMean.CONTRIBUTORS
    with pytest.raises(ValueError, match="sparse_mean"):
        OuterOptim.model_validate({"sparse_mean": "median"})
