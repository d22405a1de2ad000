"""Fused batch norm and layer norm (their NumPy references, on the strict device) against
the composed ops on the host: outputs, gradients and running statistics."""

from __future__ import annotations

import numpy as np
import pytest
from same_on_both import compare

from bigdl_py import backend
from bigdl_py.autograd import Tensor, ops

DTYPES = pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])


@DTYPES
@pytest.mark.parametrize("shape", [(6, 3, 5, 4), (9, 4), (2, 300, 7)])
@pytest.mark.parametrize("affine", [(True, True), (False, True), (False, False)])
@pytest.mark.parametrize("training", [True, False])
def test_batch_norm(shape, affine, training, dtype):
    rng = np.random.default_rng(0)
    channels = shape[1]
    x = (rng.standard_normal(shape) * 2 + 1).astype(dtype)
    weight = rng.standard_normal(channels).astype(dtype)
    bias = rng.standard_normal(channels).astype(dtype)
    statistics = {}

    def run(x, weight, bias):
        device = x.device
        running = {
            name: Tensor(value.astype(dtype), device=device)
            for name, value in (("mean", rng_mean), ("var", rng_var))
        }
        out = ops.batch_norm(
            x,
            running["mean"],
            running["var"],
            weight if affine[0] else None,
            bias if affine[1] else None,
            training=training,
            momentum=0.3,
        )
        statistics[str(device)] = running  # read after the step
        return out

    rng_mean, rng_var = rng.standard_normal(channels), rng.random(channels) + 0.5
    compare(run, [x, weight, bias], [True, affine[0], affine[1]])
    for name, value in statistics["cpu"].items():
        tolerance = 2e-5 if dtype == np.float32 else 1e-12
        np.testing.assert_allclose(
            backend.as_numpy(statistics["strict"][name].data), value.numpy(), tolerance, tolerance
        )


@DTYPES
@pytest.mark.parametrize("shape", [(4, 5, 16), (3, 300), (2, 3, 4, 5)])
@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm(shape, affine, dtype):
    rng = np.random.default_rng(1)
    normalized = shape[-1:] if len(shape) < 4 else shape[-2:]
    x = (rng.standard_normal(shape) * 3 - 1).astype(dtype)
    weight = rng.standard_normal(normalized).astype(dtype)
    bias = rng.standard_normal(normalized).astype(dtype)

    def run(x, weight, bias):
        return ops.layer_norm(x, normalized, weight if affine else None, bias if affine else None)

    compare(run, [x, weight, bias], [True, affine, affine])
