"""On a GPU: every compiled kernel computes what its NumPy reference computes (the same
inputs as the host-emulation tests), and an OptimMethod on CuPy arrays matches the host."""

from __future__ import annotations

import numpy as np
import pytest
from cases import CASES, copies

from bigdl_py import backend

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not backend.cuda_available(), reason="needs CuPy and a CUDA device"),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("kernel_case", CASES, ids=repr)
def test_the_compiled_kernel_computes_its_reference(kernel_case, dtype):
    dtype = np.dtype(dtype)
    arguments = kernel_case.arguments(np.random.default_rng(0), dtype)
    expected = copies(arguments)
    kernel_case.reference(*expected)
    on_device = [
        backend.to_device(value, "cuda") if isinstance(value, np.ndarray) else value
        for value in arguments
    ]
    blocks, threads = kernel_case.blocks(arguments), kernel_case.threads(arguments)
    kernel_case.kernel.launch(blocks, dtype, *on_device, threads=threads)
    # Transcendental functions (exp, tanh, log) are within a few ulp of the host's.
    tolerance = {np.float32: 1e-5, np.float64: 1e-12}[dtype.type]
    for position in kernel_case.outputs:
        np.testing.assert_allclose(
            backend.as_numpy(on_device[position]),
            expected[position],
            rtol=tolerance,
            atol=tolerance,
            err_msg=f"argument {position} of {kernel_case.kernel.name}",
        )
