"""The fused updates' NumPy references against the OptimMethods' composed updates.

On the strict device an OptimMethod with a kernel runs its NumPy reference (the kernel's
arithmetic); on NumPy arrays the composed update it always ran. Both, over steps with one
skipped on the device (``apply_if`` False) and left out on the host, end with the same
weights, state and applied step count.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

from bigdl_py import backend
from bigdl_py.optim import SGD, Adadelta, Adagrad, Adam, Adamax, AdamW, RMSprop

METHODS = [
    SGD(lr=0.1),
    SGD(lr=0.1, momentum=0.9),
    SGD(lr=0.1, momentum=0.9, dampening=0.3, weight_decay=1e-3),
    SGD(lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-3),
    Adam(lr=1e-2),
    Adam(lr=1e-2, weight_decay=1e-2, amsgrad=True),
    AdamW(lr=1e-2),
    AdamW(lr=1e-2, amsgrad=True),
    Adamax(lr=2e-3, weight_decay=1e-3),
    Adagrad(lr=0.05, lr_decay=0.01, weight_decay=1e-3),
    RMSprop(lr=1e-2),
    RMSprop(lr=1e-2, momentum=0.9, centered=True, weight_decay=1e-3),
    Adadelta(lr=1.0, weight_decay=1e-3),
]
SKIPPED = 2  # the step the device skips and the host leaves out


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("method", METHODS, ids=repr)
def test_the_reference_update_is_the_composed_update(method, dtype):
    rng = np.random.default_rng(1)
    host_weight = rng.standard_normal(300).astype(dtype)
    device_weight = backend.to_device(host_weight, "strict")
    host_method, device_method = copy.deepcopy(method), copy.deepcopy(method)
    xp = backend.array_module(device_weight)
    for step in range(6):
        gradient = rng.standard_normal(300).astype(dtype)
        applied = step != SKIPPED
        if applied:
            host_method.step(host_weight, gradient)
        device_method.step(
            device_weight, backend.to_device(gradient, "strict"), apply_if=xp.asarray(applied)
        )
    tolerance = {np.float32: 2e-6, np.float64: 1e-13}[np.dtype(dtype).type]
    np.testing.assert_allclose(backend.as_numpy(device_weight), host_weight, tolerance, tolerance)
    host_state, device_state = host_method.state_dict(), device_method.state_dict()
    assert device_state["step"] == host_state["step"] == 5
    assert device_method.step_count == 6  # the calls; the state counts applied updates
    for key, value in host_state.items():
        np.testing.assert_allclose(device_state[key], value, tolerance, tolerance, err_msg=key)


def test_a_method_without_a_kernel_is_gated_by_copies_on_the_device():
    class Halving(SGD):  # a user's rule: no fused kernel of its own
        _fused_kernel = None

        def _update(self, weight, gradient, learning_rate):
            weight *= 0.5

    weight = backend.to_device(np.ones(4, np.float32), "strict")
    method = Halving(lr=0.1, momentum=0.9)
    xp = backend.array_module(weight)
    method.step(weight, xp.zeros(4, dtype=np.float32), apply_if=xp.asarray(False))
    method.step(weight, xp.zeros(4, dtype=np.float32), apply_if=xp.asarray(True))
    np.testing.assert_array_equal(backend.as_numpy(weight), [0.5] * 4)


def test_loading_a_state_restarts_the_devices_step_count_from_it():
    method = Adam(lr=1e-2)
    weight = backend.to_device(np.ones(4, np.float32), "strict")
    xp = backend.array_module(weight)
    for applied in (True, False, True):
        method.step(weight, xp.ones(4, dtype=np.float32), apply_if=xp.asarray(applied))
    state = method.state_dict()
    assert state["step"] == 2
    again = Adam(lr=1e-2)
    again.load_state_dict(state)
    again.step(weight, xp.ones(4, dtype=np.float32))
    assert again.state_dict()["step"] == 3


def test_apply_if_is_refused_on_host_arrays():
    with pytest.raises(ValueError, match="apply_if is for device arrays"):
        SGD(lr=0.1).step(np.ones(3), np.ones(3), apply_if=np.asarray(True))
