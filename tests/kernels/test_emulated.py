"""Every kernel's CUDA source, run on the host (``emulate.h``), computes what its NumPy
reference computes: the references are what the CPU suite checks against the composed
ops, so this ties the CUDA code itself to them without a GPU."""

from __future__ import annotations

import emulator
import numpy as np
import pytest
from cases import CASES, copies


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("kernel_case", CASES, ids=repr)
def test_the_cuda_source_computes_its_reference(emulate, kernel_case, dtype):
    dtype = np.dtype(dtype)
    emulator.register(*(other.kernel for other in CASES))
    arguments = kernel_case.arguments(np.random.default_rng(0), dtype)
    expected, emulated = copies(arguments), copies(arguments)
    kernel_case.reference(*expected)
    blocks, threads = kernel_case.blocks(arguments), kernel_case.threads(arguments)
    emulate(kernel_case.kernel, blocks, dtype, *emulated, threads=threads)
    # The C library's exp/tanh/log and NumPy's may differ in the last bit; near a
    # cancellation (1 + tanh(x) for x << 0) that bit is all of a tiny value: hence atol.
    rtol, atol = {np.float32: (2e-6, 1e-5), np.float64: (1e-13, 1e-13)}[dtype.type]
    for position in kernel_case.outputs:
        np.testing.assert_allclose(
            emulated[position],
            expected[position],
            rtol=rtol,
            atol=atol,
            err_msg=f"argument {position} of {kernel_case.kernel.name}",
        )
