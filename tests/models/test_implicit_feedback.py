"""Leave-latest-out split, negative sampling and hit rate at k for implicit feedback."""

from __future__ import annotations

import numpy as np
import pytest

from bigdl_py.models.implicit_feedback import hit_rate_at_k, leave_latest_out, sample_negatives


def test_leave_latest_out_holds_out_each_users_latest_interaction():
    users = np.array([0, 1, 0, 1, 2, 0])
    items = np.array([5, 6, 7, 8, 9, 4])
    times = np.array([10, 30, 20, 5, 1, 20])  # user 0's tie at 20: the later row wins
    train, held_out = leave_latest_out(users, items, times)
    assert list(held_out) == [5, 1, 4]
    assert sorted(np.r_[train, held_out]) == list(range(6))
    with pytest.raises(ValueError, match="equal length"):
        leave_latest_out(users, items, times[:2])


def test_negatives_are_items_the_user_never_interacted_with(rng):
    users = np.repeat(np.arange(5), 4)
    items = rng.integers(0, 12, size=20)
    held_out = (np.arange(5), np.full(5, 11))
    pairs, labels = sample_negatives(users, items, 12, 3, rng, exclude=held_out)
    assert pairs.shape == (20 + 60, 2) and labels.sum() == 20 and labels[:20].all()
    known = {(u, i) for u, i in zip(users, items, strict=True)} | {(u, 11) for u in range(5)}
    negatives = [tuple(pair) for pair in pairs[20:]]
    assert not known & set(negatives)
    np.testing.assert_array_equal(pairs[20:, 0], np.repeat(users, 3))


def test_hit_rate_is_one_for_an_oracle_and_zero_for_a_constant(rng):
    num_items = 300
    held_out = np.stack([np.arange(40), rng.integers(0, num_items, size=40)], axis=1)
    target = {tuple(pair) for pair in held_out}

    def oracle(pairs):
        return np.array([1.0 if tuple(pair) in target else 0.0 for pair in pairs])

    assert hit_rate_at_k(oracle, held_out, held_out, num_items, rng) == 1.0
    constant = hit_rate_at_k(lambda p: np.zeros(len(p)), held_out, held_out, num_items, rng)
    assert constant == 0.0
    random_scores = hit_rate_at_k(
        lambda p: rng.random(len(p)), held_out, held_out, num_items, rng, k=50
    )
    assert 0.2 < random_scores < 0.8  # about k / candidates = 0.5
    with pytest.raises(ValueError, match="k <= candidates"):
        hit_rate_at_k(oracle, held_out, held_out, num_items, rng, k=101)
