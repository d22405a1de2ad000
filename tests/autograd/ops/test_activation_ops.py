"""Activations and (log-)softmax against PyTorch, and their numerical stability."""

from __future__ import annotations

import numpy as np
import pytest

from bigdl_py.autograd import Tensor, ops


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_matches_torch(torch, compare_with_torch, rng, approximate):
    compare_with_torch(
        lambda a: ops.gelu(a, approximate=approximate),
        lambda a: torch.nn.functional.gelu(a, approximate=approximate),
        [3 * rng.standard_normal((4, 6))],
    )


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_softmax_and_log_softmax_match_torch(torch, compare_with_torch, rng, axis):
    values = [rng.standard_normal((3, 4, 5))]
    compare_with_torch(
        lambda a: ops.softmax(a, axis=axis), lambda a: torch.softmax(a, dim=axis), values
    )
    compare_with_torch(
        lambda a: ops.log_softmax(a, axis=axis), lambda a: torch.log_softmax(a, dim=axis), values
    )


def test_softmax_family_is_stable_for_large_inputs():
    x = Tensor([[1000.0, 0.0, -1000.0]], requires_grad=True, dtype=np.float32)
    probabilities = ops.softmax(x)
    log_probabilities = ops.log_softmax(x)
    assert np.all(np.isfinite(probabilities.numpy()))
    np.testing.assert_allclose(log_probabilities.numpy(), [[0.0, -1000.0, -2000.0]])
    np.testing.assert_allclose(ops.sigmoid(x).numpy(), [[1.0, 0.5, 0.0]])


def test_gelu_rejects_an_unknown_approximation():
    with pytest.raises(ValueError, match="gelu: approximate must be 'none' or 'tanh'"):
        ops.gelu(Tensor([1.0]), approximate="fast")
