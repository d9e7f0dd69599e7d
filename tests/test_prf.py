"""PRF: exact definitions, and chi-square uniformity with fixed seeds (deterministic, not flaky)."""

from __future__ import annotations

import hashlib
import math
import random
from collections import Counter

import pytest

from protocol.prf import (
    PrfError,
    StakePool,
    assign_verifiers,
    audited,
    batch_offsets,
    coin,
    prf_bytes,
    prf_int,
    sample_segments,
    seed_from_blocks,
    shard_index,
)

HOSTS = [f"gonka1host{i:02d}" for i in range(8)]
VERIFIERS = [f"gonka1ver{i:02d}" for i in range(10)]
EQUAL = dict.fromkeys(VERIFIERS, 1000)


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
    for bad in (0, -1, 2**256 + 1, 1.5, True):
        with pytest.raises(PrfError):
            prf_int(1, bound=bad)  # type: ignore[arg-type]


def test_prf_int_above_2_64_reads_two_words_and_stays_uniform() -> None:
    """A sum of stakes can exceed 2^64 ngonka: two words per sample, still no modulo bias."""
    d0 = prf_bytes(3, "big")
    w = int.from_bytes(d0[:16], "big")
    bound = 2**64 + 1
    assert prf_int(3, "big", bound=bound) == w % bound  # w < 2^128 − (2^128 mod bound): accepted
    huge = 3 * 2**100 + 7
    thirds = Counter(prf_int(9, "huge", i, bound=huge) * 3 // huge for i in range(3000))
    assert_uniform(thirds, range(3), 3000)


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
        assign_verifiers(bad, HOSTS[0], EQUAL, 2)  # type: ignore[arg-type]
    with pytest.raises(PrfError):
        seed_from_blocks([block(0), bad])  # type: ignore[list-item]


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
        base = assign_verifiers(block(i), HOSTS[0], dict.fromkeys(pool, 7), 3)
        assert HOSTS[0] not in base and len(base) == 3 and len(set(base)) == 3
        assert assign_verifiers(block(i), HOSTS[0], dict.fromkeys(shuffled, 7), 3) == base


def test_first_pick_definition_cumulative_stake_in_address_order() -> None:
    stakes = {"gonka1c": 5, "gonka1a": 2, "gonka1b": 3}
    x = prf_int(block(4), "verifier", HOSTS[0], 0, 0, bound=10)
    first = "gonka1a" if x < 2 else "gonka1b" if x < 5 else "gonka1c"
    assert assign_verifiers(block(4), HOSTS[0], stakes, 1) == [first]


def test_assign_verifiers_rounds_disjoint_with_exclude_and_exhaust() -> None:
    taken: list[str] = []
    for r in range(5):
        new = assign_verifiers(block(1), HOSTS[0], EQUAL, 3, round=r, exclude=taken)
        assert not set(new) & set(taken)
        assert len(new) == min(3, len(VERIFIERS) - len(taken))
        taken += new
    assert sorted(taken) == VERIFIERS


def test_assign_verifiers_too_few_returns_all_but_host_and_zero_stake_is_never_drawn() -> None:
    assert assign_verifiers(block(2), HOSTS[0], {HOSTS[0]: 5, VERIFIERS[0]: 5}, 3) == [VERIFIERS[0]]
    assert assign_verifiers(block(2), HOSTS[0], {HOSTS[0]: 5}, 1) == []
    sybils = {f"gonka1sybil{i}": 0 for i in range(50)}
    for i in range(50):
        assert assign_verifiers(block(i), HOSTS[0], {**sybils, VERIFIERS[0]: 1}, 3) == [VERIFIERS[0]]
    with pytest.raises(PrfError):
        assign_verifiers(block(2), HOSTS[0], EQUAL, 0)
    with pytest.raises(PrfError):
        assign_verifiers(block(2), HOSTS[0], {VERIFIERS[0]: -1}, 1)


def test_assign_verifiers_uniform_for_equal_stakes_and_position_blind() -> None:
    trials = 3000
    picks: Counter = Counter()
    for i in range(trials):
        picks.update(assign_verifiers(block(i), HOSTS[i % 8], EQUAL, 2))
    assert_uniform(picks, VERIFIERS, trials * 2)


def test_draws_are_proportional_to_stake_and_splitting_stake_buys_nothing() -> None:
    """First picks follow stake; a key split into ten keys of a tenth is drawn as often in total."""
    stakes = {"gonka1a": 1, "gonka1b": 2, "gonka1c": 7}
    trials = 2500
    firsts = Counter(assign_verifiers(block(i), HOSTS[0], stakes, 1)[0] for i in range(trials))
    expected = {a: trials * w / 10 for a, w in stakes.items()}
    stat = sum((firsts[a] - e) ** 2 / e for a, e in expected.items())
    assert stat < chi2_critical(2), firsts
    split = {"gonka1a": 10, "gonka1b": 20, **{f"gonka1c{i}": 7 for i in range(10)}}
    group = sum(any(a.startswith("gonka1c") for a in assign_verifiers(block(i), HOSTS[0], split, 1))
                for i in range(trials))  # fmt: skip
    assert abs(group - 0.7 * trials) < 4 * math.sqrt(trials * 0.21)


def test_stake_pool_draws_many_hosts_and_is_unchanged_after_each() -> None:
    pool = StakePool({a: 1 + i for i, a in enumerate(VERIFIERS)})
    before = list(pool._tree)
    for h in HOSTS:
        assert pool.draw(block(0), h, 4, 0, exclude=VERIFIERS[:2]) == assign_verifiers(
            block(0), h, {a: 1 + i for i, a in enumerate(VERIFIERS)}, 4, 0, exclude=VERIFIERS[:2]
        )
    assert pool._tree == before
    assert sum(1 for _ in pool.draw(block(0), HOSTS[0], 100)) == len(VERIFIERS)


def test_stakes_above_2_64_are_drawn_exactly() -> None:
    stakes = {"gonka1a": 2**70, "gonka1b": 2**70}
    picks = Counter(assign_verifiers(block(i), HOSTS[0], stakes, 1)[0] for i in range(400))
    assert 150 < picks["gonka1a"] < 250


def test_assignment_depends_on_block_and_host() -> None:
    a = assign_verifiers(block(5), HOSTS[0], EQUAL, 3)
    assert any(assign_verifiers(block(j), HOSTS[0], EQUAL, 3) != a for j in range(6, 10))
    assert any(assign_verifiers(block(5), h, EQUAL, 3) != a for h in HOSTS[1:])


def test_seed_from_blocks_definition_and_every_input_counts() -> None:
    hashes = [block(i) for i in range(3)]
    want = hashlib.sha256(b"gonka-diloco/seed/v1\x00" + ":".join(hashes).encode()).hexdigest()
    assert seed_from_blocks(hashes) == want == seed_from_blocks([h.upper() for h in hashes])
    for i in range(3):
        other = [*hashes[:i], block(9), *hashes[i + 1:]]
        assert seed_from_blocks(other) != want  # each proposer controls one input, never the seed
    with pytest.raises(PrfError):
        seed_from_blocks([])


def test_audit_lottery_rate_is_its_basis_points() -> None:
    n = 4000
    hits = sum(audited(block(i), HOSTS[i % 8], 2500) for i in range(n))
    assert abs(hits - n / 4) < 4 * math.sqrt(n * 0.25 * 0.75)
    assert not any(audited(block(i), HOSTS[0], 0) for i in range(100))
    assert all(audited(block(i), HOSTS[0], 10_000) for i in range(100))
    with pytest.raises(PrfError):
        audited(block(0), HOSTS[0], 10_001)
