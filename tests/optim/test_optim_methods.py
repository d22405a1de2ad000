"""Every OptimMethod: PyTorch parity, sharded == whole, and exact resume from a state dict."""

from __future__ import annotations

import io

import numpy as np
import pytest

from bigdl_py.optim import OPTIM_METHODS, all_slice_bounds, concatenate_state_dicts

# (class name, constructor arguments); the argument names are PyTorch's too.
CONFIGS = [
    ("SGD", {"lr": 0.1}),
    ("SGD", {"lr": 0.05, "momentum": 0.9}),
    ("SGD", {"lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 0.01}),
    ("SGD", {"lr": 0.05, "momentum": 0.8, "dampening": 0.3, "weight_decay": 0.1}),
    ("Adam", {"lr": 0.01}),
    ("Adam", {"lr": 0.01, "betas": (0.8, 0.99), "weight_decay": 0.05, "amsgrad": True}),
    ("AdamW", {"lr": 0.01}),
    ("AdamW", {"lr": 0.01, "weight_decay": 0.1, "amsgrad": True}),
    ("Adagrad", {"lr": 0.1}),
    (
        "Adagrad",
        {"lr": 0.1, "lr_decay": 0.01, "weight_decay": 0.01, "initial_accumulator_value": 0.5},
    ),
    ("Adadelta", {}),
    ("Adadelta", {"lr": 0.5, "rho": 0.8, "eps": 1e-5, "weight_decay": 0.01}),
    ("RMSprop", {"lr": 0.01}),
    ("RMSprop", {"lr": 0.01, "momentum": 0.9, "centered": True, "weight_decay": 0.01}),
    ("RMSprop", {"lr": 0.01, "alpha": 0.9, "centered": True}),
    ("RMSprop", {"lr": 0.01, "momentum": 0.5}),
    ("Adamax", {}),
    ("Adamax", {"lr": 0.01, "betas": (0.8, 0.99), "weight_decay": 0.02}),
]
IDS = [f"{name}-{'-'.join(f'{k}={v}' for k, v in kwargs.items())}" for name, kwargs in CONFIGS]


def _build(name, kwargs):
    return OPTIM_METHODS[name](**kwargs)


def _gradients(rng, size, steps):
    # Varying scales, so adaptive methods see very different per-element histories.
    scales = np.exp(rng.uniform(-3, 2, size))
    return [rng.standard_normal(size) * scales for _ in range(steps)]


@pytest.mark.parametrize(("name", "kwargs"), CONFIGS, ids=IDS)
def test_matches_torch_step_for_step(name, kwargs, torch, rng):
    size, steps = 37, 20
    start = rng.standard_normal(size)
    method, weight = _build(name, kwargs), start.copy()
    parameter = torch.nn.Parameter(torch.tensor(start.copy(), dtype=torch.float64))
    torch_method = getattr(torch.optim, name)([parameter], **kwargs)
    for step, gradient in enumerate(_gradients(rng, size, steps)):
        method.step(weight, gradient)
        parameter.grad = torch.tensor(gradient.copy())
        torch_method.step()
        np.testing.assert_allclose(
            weight, parameter.detach().numpy(), rtol=1e-6, atol=1e-12, err_msg=f"step {step}"
        )


@pytest.mark.parametrize(("name", "kwargs"), CONFIGS, ids=IDS)
def test_slices_stepped_separately_equal_the_whole_vector(name, kwargs, rng):
    size, steps = 23, 6
    start = rng.standard_normal(size)
    gradients = _gradients(rng, size, steps)
    whole_method, whole = _build(name, kwargs), start.copy()
    for gradient in gradients:
        whole_method.step(whole, gradient)
    for count in (1, 2, 3, 4, 5, 30):
        bounds = all_slice_bounds(size, count)
        shards, weight = [_build(name, kwargs) for _ in bounds], start.copy()
        for gradient in gradients:
            for shard, (lo, hi) in zip(shards, bounds, strict=True):
                shard.step(weight[lo:hi], gradient[lo:hi])
        np.testing.assert_array_equal(weight, whole, err_msg=f"{count} slices")
        joined = concatenate_state_dicts([shard.state_dict() for shard in shards])
        expected = whole_method.state_dict()
        assert joined.keys() == expected.keys()
        for key, value in expected.items():
            np.testing.assert_array_equal(joined[key], value, err_msg=key)


def _save_and_reload(state):
    """Through an .npz file, as a checkpoint would store it."""
    buffer = io.BytesIO()
    np.savez(buffer, **state)
    buffer.seek(0)
    with np.load(buffer, allow_pickle=False) as stored:
        return {key: stored[key] for key in stored.files}


@pytest.mark.parametrize(("name", "kwargs"), CONFIGS, ids=IDS)
def test_state_dict_round_trip_resumes_bit_exact(name, kwargs, rng):
    size = 15
    gradients = _gradients(rng, size, 8)
    original, weight = _build(name, kwargs), rng.standard_normal(size)
    for gradient in gradients[:4]:
        original.step(weight, gradient)
    resumed, resumed_weight = _build(name, kwargs), weight.copy()
    resumed.load_state_dict(_save_and_reload(original.state_dict()))
    for gradient in gradients[4:]:
        original.step(weight, gradient)
        resumed.step(resumed_weight, gradient)
    np.testing.assert_array_equal(resumed_weight, weight)
    assert resumed.step_count == original.step_count == 8
