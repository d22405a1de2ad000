"""L1/L2 regularisers: slice-local gradient terms that match their penalties."""

from __future__ import annotations

import numpy as np
import pytest

from bigdl_py.optim import L1L2Regularizer, L1Regularizer, L2Regularizer, all_slice_bounds

REGULARIZERS = [L1Regularizer(0.3), L2Regularizer(0.2), L1L2Regularizer(0.1, 0.5)]


@pytest.mark.parametrize("regularizer", REGULARIZERS, ids=repr)
def test_gradient_term_is_analytic_and_slice_local(regularizer, rng):
    weight, gradient = rng.standard_normal(30), rng.standard_normal(30)
    expected = gradient + regularizer.l1 * np.sign(weight) + regularizer.l2 * weight
    for lo, hi in all_slice_bounds(30, 4):
        regularizer.add_gradient_(weight[lo:hi], gradient[lo:hi])
    np.testing.assert_allclose(gradient, expected, rtol=1e-15)


@pytest.mark.parametrize(
    "regularizer", [L1Regularizer(0.3), L2Regularizer(0.2), L1L2Regularizer(0.1, 0.5)]
)
def test_gradient_term_is_the_derivative_of_the_penalty(regularizer, rng):  # fmt: skip
    weight = rng.uniform(0.1, 1.0, 8) * rng.choice([-1, 1], 8)  # away from L1's kink at 0
    analytic = regularizer.add_gradient_(weight, np.zeros(8))
    step = 1e-6
    numeric = np.array(
        [
            (regularizer.penalty(weight + step * unit) - regularizer.penalty(weight - step * unit))
            / (2 * step)
            for unit in np.eye(8)
        ]
    )
    np.testing.assert_allclose(analytic, numeric, rtol=1e-6)
    halves = regularizer.penalty(weight[:3]) + regularizer.penalty(weight[3:])
    assert halves == pytest.approx(regularizer.penalty(weight))


def test_regularizer_errors():
    with pytest.raises(ValueError, match="l1 must be >= 0, got -1"):
        L1Regularizer(-1)
    with pytest.raises(ValueError, match=r"weight shape \(3,\) does not match gradient shape"):
        L2Regularizer(0.1).add_gradient_(np.zeros(3), np.zeros(4))
