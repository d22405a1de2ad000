"""Balanced slices of a flat vector, and joining/cutting sharded optimizer state."""

from __future__ import annotations

import numpy as np
import pytest

from bigdl_py.optim import all_slice_bounds, concatenate_state_dicts, slice_bounds, split_state_dict


@pytest.mark.parametrize("size", [0, 1, 2, 7, 23, 100, 1001])
def test_slices_are_contiguous_balanced_and_cover_the_vector(size):
    for count in range(1, 40):
        bounds = all_slice_bounds(size, count)
        assert bounds[0][0] == 0 and bounds[-1][1] == size
        starts = [start for start, _ in bounds]
        assert starts[1:] == [stop for _, stop in bounds[:-1]]
        lengths = [stop - start for start, stop in bounds]
        assert max(lengths) - min(lengths) <= 1
        assert lengths == sorted(lengths, reverse=True)  # the longer slices come first
        if count > size:
            assert lengths.count(0) == count - size


def test_slice_bounds_refuses_bad_arguments():
    with pytest.raises(ValueError, match="slice index must be in"):
        slice_bounds(10, 3, 3)
    with pytest.raises(ValueError, match="number of shares must be a positive integer"):
        slice_bounds(10, 0, 0)
    with pytest.raises(ValueError, match="size to split must be >= 0"):
        slice_bounds(-1, 0, 1)


def test_split_then_concatenate_is_the_identity(rng):
    whole = {"step": 4, "exp_avg": rng.standard_normal(11), "exp_avg_sq": rng.random(11)}
    for count in (1, 3, 4, 12):
        shards = split_state_dict(whole, all_slice_bounds(11, count))
        assert [len(shard["exp_avg"]) for shard in shards] == [
            stop - start for start, stop in all_slice_bounds(11, count)
        ]
        joined = concatenate_state_dicts(shards)
        assert joined["step"] == 4
        np.testing.assert_array_equal(joined["exp_avg"], whole["exp_avg"])
        np.testing.assert_array_equal(joined["exp_avg_sq"], whole["exp_avg_sq"])
    shards[0]["exp_avg"][...] = 0  # shards are copies
    assert whole["exp_avg"].any()


def test_concatenate_refuses_inconsistent_shards():
    with pytest.raises(ValueError, match="shared value 'step' differs"):
        concatenate_state_dicts([{"step": 1}, {"step": 2}])
    with pytest.raises(ValueError, match="has keys"):
        concatenate_state_dicts([{"step": 1, "sum": np.zeros(2)}, {"step": 1}])
    with pytest.raises(ValueError, match="at least one"):
        concatenate_state_dicts([])
    with pytest.raises(ValueError, match="past the end"):
        split_state_dict({"sum": np.zeros(3)}, [(0, 4)])
