"""misc.add_rows: the scatter-add behind the embedding gradients, against a plain loop."""

from __future__ import annotations

import numpy as np
import pytest

from bigdl_py.autograd.ops.misc import add_rows


@pytest.mark.parametrize(
    "index",
    [
        pytest.param([3, 1, 3, 0, 3, 1], id="repeats"),
        pytest.param([4, 0, 2], id="unique"),
        pytest.param([2, 2, 2, 2], id="one_index_only"),
        pytest.param([], id="empty"),
    ],
)
def test_add_rows_sums_every_repeated_index(index):
    rng = np.random.default_rng(0)
    index = np.array(index, dtype=np.int64)
    rows = rng.standard_normal((index.size, 3))
    target = rng.standard_normal((5, 3))
    expected = target.copy()
    for position, row in zip(index, rows, strict=True):
        expected[position] += row
    add_rows(target, index, rows)
    np.testing.assert_allclose(target, expected, rtol=1e-12)
