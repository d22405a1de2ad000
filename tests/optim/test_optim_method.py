"""The OptimMethod base: validation, lazy state, dtypes, hyperparameters, configs, errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bigdl_py import backend
from bigdl_py.optim import (
    OPTIM_METHODS,
    SGD,
    Adadelta,
    Adagrad,
    Adam,
    Adamax,
    AdamW,
    Cosine,
    RMSprop,
    Warmup,
    optim_method_from_config,
)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: SGD(lr=-0.1), r"SGD: invalid learning rate -0.1; it must be in \[0, inf\)"),
        (lambda: SGD(momentum=-1), r"invalid momentum -1"),
        (lambda: SGD(dampening=1.5), r"invalid dampening 1.5; it must be in \[0, 1\]"),
        (lambda: SGD(nesterov=True), r"nesterov=True needs momentum > 0"),
        (lambda: SGD(momentum=0.9, dampening=0.1, nesterov=True), r"dampening == 0"),
        (lambda: Adam(betas=(0.9, 1.0)), r"Adam: invalid beta2 1.0; it must be in \[0, 1\)"),
        (lambda: Adam(betas=(0.9,)), r"betas must be a pair"),
        (lambda: AdamW(eps=-1e-8), r"AdamW: invalid eps"),
        (lambda: Adam(weight_decay=-1), r"invalid weight_decay -1"),
        (lambda: Adagrad(lr_decay=-1), r"invalid lr_decay"),
        (lambda: Adagrad(initial_accumulator_value=-1), r"initial_accumulator_value"),
        (lambda: Adadelta(rho=1.1), r"invalid rho 1.1"),
        (lambda: RMSprop(alpha=-0.1), r"invalid alpha"),
        (lambda: RMSprop(momentum=-0.1), r"invalid momentum"),
        (lambda: Adamax(betas=(-0.1, 0.9)), r"invalid beta1 -0.1"),
        (lambda: SGD(lr=float("nan")), r"invalid learning rate nan"),
    ],
)
def test_bad_hyper_parameters_raise_with_value_and_range(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_schedule_must_be_a_schedule():
    with pytest.raises(TypeError, match="schedule must be"):
        SGD(lr=0.1, schedule=0.5)


def test_state_is_created_lazily_with_the_weight_shape(rng):
    method = Adam(lr=0.1)
    assert method.state_dict() == {"step": 0, "iteration": 0, "epoch": 0}
    weight = rng.standard_normal(6)
    method.step(weight, rng.standard_normal(6))
    state = method.state_dict()
    assert state["step"] == 1 and state["exp_avg"].shape == (6,)
    with pytest.raises(ValueError, match="holds 6 elements but the weight has 7"):
        method.step(rng.standard_normal(7), rng.standard_normal(7))


def test_step_updates_in_place_and_leaves_the_gradient_alone(rng):
    weight, gradient = rng.standard_normal(5), rng.standard_normal(5)
    before, gradient_before = weight.copy(), gradient.copy()
    returned = SGD(lr=0.5, momentum=0.9, weight_decay=0.1).step(weight, gradient)
    assert returned is weight
    np.testing.assert_array_equal(gradient, gradient_before)
    np.testing.assert_allclose(weight, before - 0.5 * (gradient + 0.1 * before))


@pytest.mark.parametrize("name", sorted(OPTIM_METHODS))
def test_float32_weights_and_state_stay_float32(name, rng):
    method = OPTIM_METHODS[name]()
    weight = rng.standard_normal(9).astype(np.float32)
    for _ in range(3):
        method.step(weight, rng.standard_normal(9).astype(np.float32))
    assert weight.dtype == np.float32
    assert all(
        value.dtype == np.float32
        for value in method.state_dict().values()
        if isinstance(value, np.ndarray)
    )
    assert np.isfinite(weight).all()


def test_step_checks_its_arrays(rng):
    method = SGD(lr=0.1)
    with pytest.raises(ValueError, match="must be a 1-D array"):
        method.step(np.zeros((2, 3)), np.zeros((2, 3)))
    with pytest.raises(ValueError, match=r"gradient shape \(4,\) does not match weight shape"):
        method.step(np.zeros(3), np.zeros(4))
    with pytest.raises(ValueError, match="floating point"):
        method.step(np.zeros(3, dtype=np.int64), np.zeros(3))


def test_load_state_dict_refuses_foreign_state(rng):
    adam = Adam()
    adam.step(rng.standard_normal(4), rng.standard_normal(4))
    with pytest.raises(ValueError, match="do not match this configuration"):
        SGD(momentum=0.9).load_state_dict(adam.state_dict())
    with pytest.raises(ValueError, match="do not match"):
        Adam(amsgrad=True).load_state_dict(adam.state_dict())
    with pytest.raises(ValueError, match=r"missing keys \['step'\]"):
        Adam().load_state_dict({"iteration": 0, "epoch": 0})
    broken = adam.state_dict()
    broken["exp_avg"] = broken["exp_avg"][:2]
    with pytest.raises(ValueError, match="1-D and of one length"):
        Adam().load_state_dict(broken)


def test_loaded_state_is_a_copy(rng):
    source = RMSprop(momentum=0.5)
    source.step(rng.standard_normal(4), rng.standard_normal(4))
    state = source.state_dict()
    kept = state["square_avg"].copy()
    target = RMSprop(momentum=0.5)
    target.load_state_dict(state)
    target.step(rng.standard_normal(4), rng.standard_normal(4))
    np.testing.assert_array_equal(state["square_avg"], kept)


def test_hyper_parameters_and_with_hyper_parameters():
    method = Adam(lr=0.01, betas=(0.8, 0.9), schedule=Cosine(T_max=10))
    method.on_iteration_end(3)
    assert method.hyper_parameters() == {
        "lr": 0.01,
        "betas": (0.8, 0.9),
        "eps": 1e-8,
        "weight_decay": 0.0,
        "amsgrad": False,
    }
    changed = method.with_hyper_parameters(weight_decay=0.5, lr=0.02)
    assert type(changed) is Adam and changed.weight_decay == 0.5 and changed.betas == (0.8, 0.9)
    assert changed.iteration == 3 and changed.schedule is not method.schedule
    assert changed.current_learning_rate() == pytest.approx(2 * method.current_learning_rate())
    with pytest.raises(ValueError, match=r"has no hyperparameters \['momentum'\]"):
        method.with_hyper_parameters(momentum=0.9)


@pytest.mark.parametrize("name", sorted(OPTIM_METHODS))
def test_config_survives_json_and_rebuilds_the_same_method(name):
    method = OPTIM_METHODS[name](lr=0.3, schedule=Warmup(5, then=Cosine(T_max=20)))
    rebuilt = optim_method_from_config(json.loads(json.dumps(method.config())))
    assert type(rebuilt) is type(method)
    assert rebuilt.hyper_parameters() == method.hyper_parameters()
    assert rebuilt.schedule.config() == method.schedule.config()
    with pytest.raises(ValueError, match="unknown OptimMethod 'LBFGS'"):
        optim_method_from_config({"name": "LBFGS"})


def test_repr_shows_hyper_parameters_and_schedule():
    text = repr(SGD(lr=0.1, momentum=0.9, schedule=Cosine(T_max=5)))
    assert text.startswith("SGD(lr=0.1, momentum=0.9") and "Cosine(T_max=5" in text


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(OPTIM_METHODS))
def test_gpu_step_equals_cpu_step(name, rng):
    if not backend.cuda_available():
        pytest.skip("needs CuPy and a CUDA device")
    cpu_method, gpu_method = OPTIM_METHODS[name](), OPTIM_METHODS[name]()
    weight = rng.standard_normal(33)
    gpu_weight = backend.to_device(weight, "cuda")
    for _ in range(4):
        gradient = rng.standard_normal(33)
        cpu_method.step(weight, gradient)
        gpu_method.step(gpu_weight, backend.to_device(gradient, "cuda"))
    np.testing.assert_allclose(backend.as_numpy(gpu_weight), weight, rtol=1e-12, atol=1e-14)
    # A state saved from the GPU resumes there (the arrays go back to the device on step).
    resumed, resumed_weight = OPTIM_METHODS[name](), gpu_weight.copy()
    resumed.load_state_dict(gpu_method.state_dict())
    gradient = backend.to_device(rng.standard_normal(33), "cuda")
    resumed.step(resumed_weight, gradient)
    gpu_method.step(gpu_weight, gradient)
    assert backend.is_cupy_array(resumed_weight)
    np.testing.assert_array_equal(backend.as_numpy(resumed_weight), backend.as_numpy(gpu_weight))


@pytest.mark.parametrize("name", sorted(OPTIM_METHODS))
def test_half_precision_gradients_update_in_the_weights_precision(name, rng):
    weight = rng.standard_normal(12).astype(np.float32)
    gradient = (rng.standard_normal(12) * 400).astype(np.float16)  # squares overflow float16
    expected_method, expected = OPTIM_METHODS[name](), weight.copy()
    expected_method.step(expected, gradient.astype(np.float32))
    OPTIM_METHODS[name]().step(weight, gradient)
    np.testing.assert_array_equal(weight, expected)
    assert np.isfinite(weight).all()


@pytest.mark.parametrize("dampening", [0.0, 0.25], ids=["undamped", "damped"])
def test_sgd_momentum_in_float32_is_bit_exact_to_its_formula(rng, dampening):
    # The undamped update adds the gradient itself, not 1.0 times it: the same float32 bits.
    size, learning_rate, momentum = 1000, 0.01, 0.9
    weight = rng.standard_normal(size).astype(np.float32)
    expected_weight, expected_buffer = weight.copy(), None
    method = SGD(lr=learning_rate, momentum=momentum, dampening=dampening)
    for _ in range(4):
        gradient = rng.standard_normal(size).astype(np.float32)
        method.step(weight, gradient)
        if expected_buffer is None:
            expected_buffer = gradient.copy()
        else:
            expected_buffer = momentum * expected_buffer + (1.0 - dampening) * gradient
        expected_weight = expected_weight - learning_rate * expected_buffer
        assert expected_buffer.dtype == np.float32
        np.testing.assert_array_equal(method.state_dict()["momentum_buffer"], expected_buffer)
        np.testing.assert_array_equal(weight, expected_weight)
