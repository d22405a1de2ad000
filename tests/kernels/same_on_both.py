"""Run one computation on the host (the composed ops) and on the strict device (the fused
kernels' NumPy references) and compare outputs and input gradients."""

from __future__ import annotations

import contextlib

import numpy as np

from bigdl_py import device_waits
from bigdl_py.autograd import Tensor


def compare(compute, arrays, differentiable, rtol=None, atol=None, seed=0):
    """``compute(*tensors)`` on both devices; ``differentiable[i]`` says whether input ``i``
    takes a gradient. Inside the strict run no value is read back (a training step's rule).
    Returns the strict run's output, as a host array."""
    outputs, gradients = [], []
    for device in ("cpu", "strict"):
        tensors = [
            Tensor(array, requires_grad=bool(grad), device=device)
            for array, grad in zip(arrays, differentiable, strict=True)
        ]
        with device_waits.no_device_waits() if device == "strict" else contextlib.nullcontext():
            output = compute(*tensors)
            upstream = np.random.default_rng(seed).standard_normal(output.shape)
            upstream = Tensor(upstream.astype(output.dtype), device=device)
            output.backward(upstream)
        outputs.append(output.numpy())
        gradients.append([t.grad.numpy() if t.requires_grad else None for t in tensors])
    dtype = np.asarray(arrays[0]).dtype
    rtol = rtol if rtol is not None else (2e-5 if dtype == np.float32 else 1e-12)
    atol = atol if atol is not None else rtol
    np.testing.assert_allclose(outputs[1], outputs[0], rtol=rtol, atol=atol, err_msg="output")
    for position, (host, device) in enumerate(zip(*gradients, strict=True)):
        if host is not None:
            np.testing.assert_allclose(
                device, host, rtol=rtol, atol=atol, err_msg=f"gradient of input {position}"
            )
    return outputs[1]
