"""misc.row_sums: the scatter-add behind the embedding gradients, against a plain loop."""

from __future__ import annotations

import numpy as np
import pytest

from bigdl_py.autograd.ops.misc import add_rows, row_sums


@pytest.mark.parametrize(
    "index",
    [
        pytest.param([3, 1, 3, 0, 3, 1], id="many_repeats"),
        pytest.param([*range(20), 5, 19], id="few_repeats"),
        pytest.param([4, 0, 2], id="unique"),
        pytest.param([2, 2, 2, 2], id="one_index_only"),
        # A first round of rows, then nine repeats of one index: summed sorted.
        pytest.param([0] * 10 + list(range(1, 11)), id="rounds_then_sorted"),
        pytest.param([], id="empty"),
    ],
)
def test_row_sums_add_every_repeated_index(index):
    rng = np.random.default_rng(0)
    index = np.array(index, dtype=np.int64)
    rows = rng.standard_normal((index.size, 3)).astype(np.float32)
    expected = np.zeros((24, 3), dtype=np.float32)
    for position, row in zip(index, rows, strict=True):
        expected[position] += row
    sums = row_sums(index, rows, 24)
    assert sums.dtype == np.float32
    np.testing.assert_allclose(sums, expected, rtol=1e-6)


@pytest.mark.parametrize("index_dtype", [np.int32, np.uint16, np.int64])
def test_row_sums_of_rows_with_several_axes_and_narrow_indices(index_dtype):
    # Narrow index dtypes index the claimant array and the table as int64 ids do.
    rng = np.random.default_rng(1)
    index = rng.integers(0, 40, size=30).astype(index_dtype)
    rows = rng.standard_normal((30, 2, 3))
    expected = np.zeros((40, 2, 3))
    np.add.at(expected, index, rows)
    np.testing.assert_allclose(row_sums(index, rows, 40), expected, rtol=1e-12)


def test_row_sums_of_non_contiguous_rows():
    rng = np.random.default_rng(2)
    index = np.array([5, 1, 5, 7, 2, 9, 0, 3], dtype=np.int64)
    wide = rng.standard_normal((8, 6)).astype(np.float32)
    rows = wide[:, ::2]  # a strided view, as the gradient of a concatenation gives
    expected = np.zeros((10, 3), dtype=np.float32)
    np.add.at(expected, index, rows)
    np.testing.assert_allclose(row_sums(index, rows, 10), expected, rtol=1e-6)


@pytest.mark.parametrize("vocabulary", [400, 3], ids=["few_repeats", "many_repeats"])
def test_add_rows_adds_into_a_table_that_holds_values(vocabulary):
    rng = np.random.default_rng(3)
    index = rng.integers(0, vocabulary, size=60)
    rows = rng.standard_normal((60, 4))
    table = rng.standard_normal((vocabulary, 4))
    expected = table.copy()
    np.add.at(expected, index, rows)
    add_rows(table, index, rows)
    np.testing.assert_allclose(table, expected, rtol=1e-12)
