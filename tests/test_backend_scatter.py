"""backend.scatter_reduce: every repeated index takes part, on the host and on a GPU."""

from __future__ import annotations

import numpy as np
import pytest

from bigdl_py import backend

INDEX = np.array([0, 2, 2, 0, 2])
VALUES = np.array([[1.0, -4.0], [3.0, 5.0], [-2.0, 7.0], [6.0, 0.5], [0.0, -1.0]])


def reduced_by_loop(how, start):
    expected = np.full((3, 2), start)
    for row, values in zip(INDEX, VALUES, strict=True):
        expected[row] = getattr(np, how)(expected[row], values)
    return expected


@pytest.mark.parametrize("how, start", [("add", 0.0), ("maximum", -np.inf), ("minimum", np.inf)])
def test_scatter_reduce_combines_every_repeated_index(how, start):
    target = np.full((3, 2), start)
    backend.scatter_reduce(target, INDEX, VALUES, how)
    np.testing.assert_array_equal(target, reduced_by_loop(how, start))


@pytest.mark.gpu
@pytest.mark.skipif(not backend.cuda_available(), reason="needs CuPy and a CUDA device")
@pytest.mark.parametrize("how, start", [("add", 0.0), ("maximum", -np.inf), ("minimum", np.inf)])
def test_scatter_reduce_on_a_gpu_matches_the_host(how, start):
    device = backend.device("cuda")
    target = backend.to_device(np.full((3, 2), start), device)
    backend.scatter_reduce(
        target, backend.to_device(INDEX, device), backend.to_device(VALUES, device), how
    )
    np.testing.assert_array_equal(backend.as_numpy(target), reduced_by_loop(how, start))
