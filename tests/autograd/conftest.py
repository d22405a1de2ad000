"""Fixtures of the autograd tests: the devices to run on, and float64 random inputs."""

from __future__ import annotations

import numpy as np
import pytest

from bigdl_py import backend
from bigdl_py.autograd import Tensor


def device_params() -> list:
    """``'cpu'``, plus ``'cuda'`` (marked ``gpu``) when CuPy sees a CUDA device."""
    params = [pytest.param("cpu", id="cpu")]
    if backend.cuda_available():
        params.append(pytest.param("cuda", id="cuda", marks=pytest.mark.gpu))
    return params


@pytest.fixture(params=device_params())
def device(request) -> str:
    return request.param


@pytest.fixture
def make_tensor(rng):
    """``make_tensor(*shape, requires_grad=True, low=None)``: a float64 standard-normal Tensor
    (uniform in [low, low + 1) when ``low`` is given, for ops that need positive inputs)."""

    def make(*shape, requires_grad: bool = True, low: float | None = None) -> Tensor:
        if low is None:
            values = rng.standard_normal(shape)
        else:
            values = low + rng.random(shape)
        return Tensor(values, requires_grad=requires_grad, dtype=np.float64)

    return make


@pytest.fixture
def compare_with_torch(torch):
    """``compare(ours, theirs, arrays)``: run both on float64 copies of ``arrays`` and assert
    that outputs and the gradients of every float input agree to 1e-5 relative."""

    def compare(ours, theirs, arrays, rtol: float = 1e-5, atol: float = 1e-10, seed: int = 0):
        is_float = [np.issubdtype(np.asarray(a).dtype, np.floating) for a in arrays]
        our_inputs = [
            Tensor(a, requires_grad=True, dtype=np.float64) if floating else Tensor(a)
            for a, floating in zip(arrays, is_float, strict=True)
        ]
        their_inputs = [
            torch.tensor(a, dtype=torch.float64, requires_grad=True)
            if floating
            else torch.tensor(a)
            for a, floating in zip(arrays, is_float, strict=True)
        ]
        our_output = ours(*our_inputs)
        their_output = theirs(*their_inputs)
        np.testing.assert_allclose(
            our_output.numpy(), their_output.detach().numpy(), rtol=rtol, atol=atol
        )
        upstream = np.random.default_rng(seed).standard_normal(our_output.shape)
        our_output.backward(upstream)
        their_output.backward(torch.tensor(upstream))
        for position, (mine, theirs_) in enumerate(zip(our_inputs, their_inputs, strict=True)):
            if is_float[position]:
                np.testing.assert_allclose(
                    mine.grad.numpy(),
                    theirs_.grad.numpy(),
                    rtol=rtol,
                    atol=atol,
                    err_msg=f"gradient of input {position}",
                )
        return our_output

    return compare


@pytest.fixture
def tile_calls(monkeypatch):
    """``tile_calls(module, what)``: from now on, every ``for_each_tile`` call of the op
    module ``module`` appends its ``what`` (``"size"`` or ``"threaded"``) to the returned
    list, and still runs."""

    def record(module, what: str) -> list:
        calls = []
        real_for_each_tile = module.for_each_tile

        def recording(count, size, work, on_gpu=False, threaded=True):
            calls.append({"size": size, "threaded": threaded}[what])
            return real_for_each_tile(count, size, work, on_gpu, threaded)

        monkeypatch.setattr(module, "for_each_tile", recording)
        return calls

    return record
