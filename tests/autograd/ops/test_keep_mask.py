"""misc._keep_mask, the dropout masks of ops.dropout and fused attention."""

from __future__ import annotations

import numpy as np
import pytest

from bigdl_py.autograd.ops.misc import _keep_mask


@pytest.mark.parametrize(
    "bit_generator", [np.random.PCG64, np.random.SFC64, np.random.MT19937], ids=lambda c: c.__name__
)
@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_keep_fraction_is_one_minus_p(bit_generator, p):
    like = np.zeros(1, dtype=np.float32)
    keep = _keep_mask((400, 501), p, like, np.random.Generator(bit_generator(0)))
    assert keep.shape == (400, 501) and keep.dtype == bool
    # 200,400 draws: the kept fraction is within 5 standard deviations of 1 - p.
    assert abs(keep.mean() - (1 - p)) < 5 * np.sqrt(p * (1 - p) / keep.size)


def test_same_seed_same_mask_for_any_dtype_and_odd_sizes():
    masks = [
        _keep_mask((3, 7), 0.3, np.zeros(1, dtype=dtype), np.random.default_rng(5))
        for dtype in (np.float32, np.float64)
    ]
    np.testing.assert_array_equal(masks[0], masks[1])
    assert not np.array_equal(
        masks[0], _keep_mask((3, 7), 0.3, np.zeros(1), np.random.default_rng(6))
    )


def test_p_zero_keeps_everything_and_p_one_drops_everything():
    rng = np.random.default_rng(0)
    assert _keep_mask((5, 5), 0.0, np.zeros(1), rng).all()
    assert not _keep_mask((5, 5), 1.0, np.zeros(1), rng).any()
