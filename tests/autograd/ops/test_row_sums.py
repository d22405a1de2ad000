"""misc.row_sums: the scatter-add behind the embedding gradients, against a plain loop."""

from __future__ import annotations

import numpy as np
import pytest

from bigdl_py.autograd.ops.misc import row_sums


@pytest.mark.parametrize(
    "index",
    [
        pytest.param([3, 1, 3, 0, 3, 1], id="many_repeats"),
        pytest.param([*range(20), 5, 19], id="few_repeats"),
        pytest.param([4, 0, 2], id="unique"),
        pytest.param([2, 2, 2, 2], id="one_index_only"),
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
