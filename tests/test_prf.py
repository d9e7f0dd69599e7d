"""PRF: exact definitions, and chi-square uniformity with fixed seeds (deterministic, not flaky)."""

from __future__ import annotations

import hashlib
import math
import random
from collections import Counter

import pytest

from protocol.prf import (
    PrfError,
    assign_verifiers,
    batch_offsets,
    coin,
    prf_bytes,
    prf_int,
    sample_segments,
    shard_index,
    verifier_ranking,
)

HOSTS = [f"gonka1host{i:02d}" for i in range(8)]
VERIFIERS = [f"gonka1ver{i:02d}" for i in range(10)]


def block(i: int) -> str:
    return hashlib.sha256(f"block{i}".encode()).hexdigest()


def chi2_critical(dof: int, z: float = 3.719) -> float:
    """Wilson–Hilferty upper quantile of chi-square (z=3.719 is p = 1e-4)."""
    a = 2 / (9 * dof)
    return dof * (1 - a + z * math.sqrt(a)) ** 3


def assert_uniform(counts: Counter, categories: range | list, total: int) -> None:
    expected = total / len(categories)
    stat = sum((counts.get(c, 0) - expected) ** 2 / expected for c in categories)
    assert set(counts) <= set(categories)
    assert stat < chi2_critical(len(categories) - 1), (stat, counts)


def test_prf_bytes_is_sha256_of_colon_joined_parts() -> None:
    assert prf_bytes(7, "a", 3) == hashlib.sha256(b"7:a:3").digest()
    assert prf_bytes("s") == hashlib.sha256(b"s").digest()


def test_coin_definition_and_range() -> None:
    d = hashlib.sha256(b"seed:item").digest()
    assert coin("seed", "item") == (int.from_bytes(d[:8], "big") >> 11) / 2**53
    values = [coin("seed", i) for i in range(4000)]
    assert all(0 <= x < 1 for x in values)
    assert_uniform(Counter(int(x * 10) for x in values), range(10), len(values))


def test_prf_int_first_word_definition() -> None:
    d = prf_bytes(1, "x")
    assert prf_int(1, "x", bound=1000) == int.from_bytes(d[:8], "big") % 1000


def test_prf_int_uniform_small_bound() -> None:
    draws = Counter(prf_int(42, "u", i, bound=7) for i in range(14_000))
    assert_uniform(draws, range(7), 14_000)


def test_prf_int_has_no_modulo_bias() -> None:
    # With bound ≈ (2/3)·2^64 a plain `w % bound` would put twice the mass on the lower half of
    # [0, bound) as on the upper half. Rejection sampling keeps the quarters equally likely.
    bound = 2**65 // 3 + 1
    n = 4000
    quarters = Counter(min(prf_int(9, "bias", i, bound=bound) * 4 // bound, 3) for i in range(n))
    assert_uniform(quarters, range(4), n)


def test_prf_int_rejects_bad_bounds() -> None:
    for bad in (0, -1, 2**64 + 1, 1.5, True):
        with pytest.raises(PrfError):
            prf_int(1, bound=bad)  # type: ignore[arg-type]


def test_shard_index_uniform_over_hosts() -> None:
    n = 3000
    counts = Counter(shard_index(5, f"gonka1h{i}", 6) for i in range(n))
    assert_uniform(counts, range(6), n)


def test_batch_offsets_deterministic_in_range_and_uniform() -> None:
    a = batch_offsets(1, HOSTS[0], 3, 4, 8, 1000)
    assert a == batch_offsets(1, HOSTS[0], 3, 4, 8, 1000)
    assert a != batch_offsets(1, HOSTS[0], 3, 5, 8, 1000)
    assert a != batch_offsets(1, HOSTS[1], 3, 4, 8, 1000)
    assert len(a) == 8 and all(0 <= x < 1000 for x in a)
    offs = [x for step in range(500) for x in batch_offsets(2, HOSTS[0], 0, step, 8, 50)]
    assert_uniform(Counter(offs), range(50), len(offs))
    with pytest.raises(PrfError):
        batch_offsets(1, HOSTS[0], 0, 0, 4, 0)


def test_sample_segments_shape() -> None:
    for i in range(50):
        out = sample_segments(block(i), HOSTS[0], 10, 3)
        assert out == sorted(set(out)) and len(out) == 3 and out[-1] == 9
    assert sample_segments(block(0), HOSTS[0], 4, 4) == [0, 1, 2, 3]
    assert sample_segments(block(0), HOSTS[0], 1, 1) == [0]
    assert sample_segments(block(0).upper(), HOSTS[0], 10, 3) == sample_segments(block(0), HOSTS[0], 10, 3)


@pytest.mark.parametrize(("n", "s"), [(5, 0), (5, 6), (0, 1)])
def test_sample_segments_rejects_bad_counts(n: int, s: int) -> None:
    with pytest.raises(PrfError):
        sample_segments(block(0), HOSTS[0], n, s)


@pytest.mark.parametrize("bad", ["", "xyz", "12 34", 17])
def test_bad_block_hash_is_named_error(bad: object) -> None:
    with pytest.raises(PrfError):
        sample_segments(bad, HOSTS[0], 4, 2)  # type: ignore[arg-type]
    with pytest.raises(PrfError):
        assign_verifiers(bad, HOSTS[0], VERIFIERS, 2)  # type: ignore[arg-type]


def test_sample_segments_uniform_over_non_last() -> None:
    trials = 2000
    counts = Counter(
        x for i in range(trials) for x in sample_segments(block(i), HOSTS[i % 3], 12, 3)[:-1]
    )
    assert_uniform(counts, range(11), trials * 2)


def test_sample_segments_pairs_uniform() -> None:
    # Independence between the draws: every unordered pair of non-last segments equally likely.
    trials = 3000
    counts = Counter(tuple(sample_segments(block(i), HOSTS[0], 6, 3)[:-1]) for i in range(trials))
    pairs = [(a, b) for a in range(5) for b in range(a + 1, 5)]
    assert_uniform(counts, pairs, trials)


def test_assign_verifiers_never_host_and_order_independent() -> None:
    rng = random.Random(3)
    pool = [*VERIFIERS, HOSTS[0]]
    for i in range(30):
        shuffled = pool[:]
        rng.shuffle(shuffled)
        base = assign_verifiers(block(i), HOSTS[0], pool, 3)
        assert HOSTS[0] not in base and len(base) == 3 and len(set(base)) == 3
        assert assign_verifiers(block(i), HOSTS[0], shuffled, 3) == base
        assert assign_verifiers(block(i), HOSTS[0], shuffled + shuffled[:4], 3) == base


def test_assign_verifiers_rounds_disjoint_and_exhaust() -> None:
    rounds = [assign_verifiers(block(1), HOSTS[0], VERIFIERS, 3, round=r) for r in range(5)]
    assert [len(r) for r in rounds] == [3, 3, 3, 1, 0]
    flat = [a for r in rounds for a in r]
    assert sorted(flat) == sorted(VERIFIERS)
    assert flat == verifier_ranking(block(1), HOSTS[0], VERIFIERS)


def test_assign_verifiers_too_few_returns_all_but_host() -> None:
    assert sorted(assign_verifiers(block(2), HOSTS[0], [HOSTS[0], VERIFIERS[0]], 3)) == [VERIFIERS[0]]
    assert assign_verifiers(block(2), HOSTS[0], [HOSTS[0]], 1) == []
    with pytest.raises(PrfError):
        assign_verifiers(block(2), HOSTS[0], VERIFIERS, 0)


def test_assign_verifiers_uniform_and_position_blind() -> None:
    # Each verifier is picked equally often, and being listed first gives no advantage.
    trials = 3000
    picks: Counter = Counter()
    first_listed_picked = 0
    rng = random.Random(11)
    for i in range(trials):
        order = VERIFIERS[:]
        rng.shuffle(order)
        chosen = assign_verifiers(block(i), HOSTS[i % 8], order, 2)
        picks.update(chosen)
        first_listed_picked += order[0] in chosen
    assert_uniform(picks, VERIFIERS, trials * 2)
    # P(first listed chosen) = 2/10; binomial sd = sqrt(3000*0.2*0.8) ≈ 22
    assert abs(first_listed_picked - trials * 0.2) < 4 * 22


def test_assignment_depends_on_block_and_host() -> None:
    a = assign_verifiers(block(5), HOSTS[0], VERIFIERS, 3)
    assert any(assign_verifiers(block(j), HOSTS[0], VERIFIERS, 3) != a for j in range(6, 10))
    assert any(assign_verifiers(block(5), h, VERIFIERS, 3) != a for h in HOSTS[1:])
