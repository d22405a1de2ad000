"""Conv2d on a device (im2col and col2im kernels' references, GEMMs on the cuBLAS route,
reused scratch, on the strict device) against the host's route: outputs and all three
gradients."""

from __future__ import annotations

import numpy as np
import pytest
from same_on_both import compare

from bigdl_py.autograd import ops
from bigdl_py.autograd.ops import conv_device

GEOMETRIES = [
    # (input shape, weight shape, stride, padding, dilation, groups)
    ((3, 4, 9, 8), (5, 4, 3, 3), 1, 1, 1, 1),
    ((2, 3, 11, 10), (6, 3, 5, 3), (2, 1), (0, 2), 1, 1),
    ((2, 4, 10, 10), (6, 2, 3, 3), 2, 1, (2, 1), 2),
    ((4, 1, 28, 28), (6, 1, 5, 5), 1, 0, 1, 1),  # LeNet-5's first layer
    ((2, 8, 4, 4), (8, 8, 1, 1), 2, 0, 1, 1),  # ResNet's strided 1x1 shortcut
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("geometry", GEOMETRIES, ids=str)
def test_conv2d(geometry, with_bias, dtype):
    x_shape, w_shape, stride, padding, dilation, groups = geometry
    rng = np.random.default_rng(0)
    arrays = [
        rng.standard_normal(x_shape).astype(dtype),
        rng.standard_normal(w_shape).astype(dtype),
        rng.standard_normal(w_shape[0]).astype(dtype),
    ]

    def run(x, weight, bias):
        return ops.conv2d(x, weight, bias if with_bias else None, stride, padding, dilation, groups)

    # A weight gradient sums thousands of products of size ~100 in float32: atol covers
    # the order of that sum (1e-6 of its largest terms).
    rtol, atol = (1e-5, 2e-4) if dtype == np.float32 else (1e-12, 1e-10)
    compare(run, arrays, [True, True, with_bias], rtol=rtol, atol=atol)


def test_a_batch_in_several_tiles_gives_the_same_result(monkeypatch):
    monkeypatch.setattr(conv_device, "TILE_BYTES", 2000)  # a sample or two a tile
    rng = np.random.default_rng(1)
    arrays = [
        rng.standard_normal((5, 3, 7, 7)),
        rng.standard_normal((4, 3, 3, 3)),
        rng.standard_normal(4),
    ]
    compare(lambda x, w, b: ops.conv2d(x, w, b, 1, 1), arrays, [True, True, True])
