"""Numerical gradient check: central finite differences in float64."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from bigdl_py import backend
from bigdl_py.autograd.tensor import Tensor


def gradcheck(
    function: Callable,
    inputs: Sequence[Tensor],
    eps: float = 1e-6,
    atol: float = 1e-5,
    rtol: float = 1e-3,
    raise_exception: bool = True,
    seed: int = 0,
) -> bool:
    """Compare autograd's gradients of ``function(*inputs)`` with finite differences.

    The output is reduced to a scalar with fixed random weights (so every output element is
    checked), then each input element is perturbed by ``+eps`` and ``-eps``. Inputs must be
    float64 tensors; those with ``requires_grad=True`` are checked.

    Returns
    -------
    bool
        True when every gradient matches; raises ``AssertionError`` naming the input and the
        worst element otherwise (or returns False when ``raise_exception`` is False).
    """
    for position, tensor in enumerate(inputs):
        if isinstance(tensor, Tensor) and tensor.requires_grad and tensor.dtype != np.float64:
            raise TypeError(
                f"gradcheck: input {position} has dtype {tensor.dtype}; finite differences "
                "need float64 inputs"
            )
    checked = [
        (position, tensor)
        for position, tensor in enumerate(inputs)
        if isinstance(tensor, Tensor) and tensor.requires_grad
    ]
    if not checked:
        raise ValueError("gradcheck: no input has requires_grad=True")

    first_output = function(*inputs)
    rng = np.random.default_rng(seed)
    weights_host = rng.standard_normal(first_output.shape)
    weights = backend.to_device(weights_host, first_output.device).astype(first_output.dtype)

    def objective() -> float:
        output = function(*inputs)
        return float((output.data * weights).sum())

    for _, tensor in checked:
        tensor.grad = None
    (first_output * Tensor(weights, _copy=False)).sum().backward()

    for position, tensor in checked:
        analytic = np.zeros(tensor.shape) if tensor.grad is None else tensor.grad.numpy()
        numeric = np.zeros(tensor.shape)
        flat_data = tensor.data.reshape(-1)  # a view: perturbations change the tensor itself
        flat_numeric = numeric.reshape(-1)
        for i in range(flat_data.size):
            original = float(flat_data[i])
            flat_data[i] = original + eps
            plus = objective()
            flat_data[i] = original - eps
            minus = objective()
            flat_data[i] = original
            flat_numeric[i] = (plus - minus) / (2 * eps)
        error = np.abs(analytic - numeric)
        bound = atol + rtol * np.abs(numeric)
        if np.any(error > bound):
            worst = np.unravel_index(np.argmax(error - bound), tensor.shape)
            message = (
                f"gradcheck: input {position} (shape {tensor.shape}) gradient mismatch at index "
                f"{tuple(int(i) for i in worst)}: autograd {analytic[worst]:.8g}, "
                f"finite differences {numeric[worst]:.8g}"
            )
            if raise_exception:
                raise AssertionError(message)
            return False
    return True
