"""Initialisers: distributions, fans and gains, in-place filling, seeding."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bigdl_py import nn
from bigdl_py.autograd import Tensor
from bigdl_py.nn import Parameter, init

# Large enough that sample statistics sit within about 1% of the distribution's.
SHAPE = (300, 200)


def parameter(shape=SHAPE, dtype=np.float64) -> Parameter:
    return Parameter(np.full(shape, np.nan, dtype=dtype))


def generator(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


# --- distributions -------------------------------------------------------------------------
def test_xavier_uniform_stays_in_its_bound_with_the_matching_variance():
    weight = init.xavier_uniform_(parameter(), gain=2.0, generator=generator())
    bound = 2.0 * math.sqrt(6 / (200 + 300))
    values = weight.numpy()
    assert values.min() >= -bound and values.max() <= bound
    assert values.min() < -0.99 * bound and values.max() > 0.99 * bound
    np.testing.assert_allclose(values.var(), bound**2 / 3, rtol=0.02)


def test_xavier_normal_has_the_glorot_standard_deviation():
    values = init.xavier_normal_(parameter(), generator=generator()).numpy()
    np.testing.assert_allclose(values.std(), math.sqrt(2 / (200 + 300)), rtol=0.02)
    assert abs(values.mean()) < 0.02 * values.std()  # the standard error is std / 245


@pytest.mark.parametrize("mode, fan", [("fan_in", 200 * 9), ("fan_out", 300 * 9)])
@pytest.mark.parametrize(
    "nonlinearity, slope, gain",
    [("relu", 0.0, math.sqrt(2)), ("leaky_relu", 0.2, math.sqrt(2 / 1.04)), ("linear", 0, 1.0)],
)
def test_kaiming_uses_the_fan_of_the_mode_and_the_gain(mode, fan, nonlinearity, slope, gain):
    # A conv weight (out=300, in=200, 3x3): fans include the kernel's 9 taps.
    shape = (300, 200, 3, 3)
    std = gain / math.sqrt(fan)
    normal = init.kaiming_normal_(
        parameter(shape), a=slope, mode=mode, nonlinearity=nonlinearity, generator=generator()
    )
    np.testing.assert_allclose(normal.numpy().std(), std, rtol=0.01)
    uniform = init.kaiming_uniform_(
        parameter(shape), a=slope, mode=mode, nonlinearity=nonlinearity, generator=generator()
    ).numpy()
    assert np.abs(uniform).max() <= math.sqrt(3) * std
    np.testing.assert_allclose(uniform.std(), std, rtol=0.01)


def test_uniform_and_normal_follow_their_arguments():
    values = init.uniform_(parameter(), -3.0, 5.0, generator=generator()).numpy()
    assert values.min() >= -3.0 and values.max() < 5.0
    np.testing.assert_allclose(values.mean(), 1.0, atol=0.05)
    values = init.normal_(parameter(), mean=2.0, std=0.5, generator=generator()).numpy()
    np.testing.assert_allclose([values.mean(), values.std()], [2.0, 0.5], rtol=0.01)


def test_constant_zeros_and_ones():
    np.testing.assert_array_equal(init.constant_(parameter((2, 3)), 0.25).numpy(), 0.25)
    np.testing.assert_array_equal(init.zeros_(parameter((4,))).numpy(), 0.0)
    np.testing.assert_array_equal(init.ones_(parameter((2, 2))).numpy(), 1.0)


def test_gains_match_pytorch(torch):
    for nonlinearity in ("linear", "conv2d", "sigmoid", "tanh", "relu", "selu"):
        assert init.calculate_gain(nonlinearity) == pytest.approx(
            torch.nn.init.calculate_gain(nonlinearity)
        )
    for slope in (None, 0.0, 0.3, 2):
        assert init.calculate_gain("leaky_relu", slope) == pytest.approx(
            torch.nn.init.calculate_gain("leaky_relu", slope)
        )


def test_fans_match_pytorch_for_linear_and_conv_weights(torch):
    for shape in ((7, 5), (8, 3, 5, 2), (4, 6, 3)):
        ours = init.fan_in_and_fan_out(parameter(shape))
        theirs = torch.nn.init._calculate_fan_in_and_fan_out(torch.empty(shape))
        assert ours == tuple(theirs)


# --- in place ---------------------------------------------------------------------------------
def test_initialisers_fill_in_place_and_return_the_tensor():
    flat = np.zeros(12)
    view = Parameter(flat[2:8].reshape(2, 3))  # like a parameter inside a flat buffer
    assert init.uniform_(view, 1.0, 2.0) is view
    assert view.data.base is flat and (flat[2:8] >= 1).all() and not flat[:2].any()


def test_float32_and_float64_fills_differ_only_by_rounding():
    single = init.xavier_uniform_(parameter((5, 4), np.float32), generator=generator(1))
    double = init.xavier_uniform_(parameter((5, 4), np.float64), generator=generator(1))
    assert single.dtype == np.float32
    np.testing.assert_array_equal(single.numpy(), double.numpy().astype(np.float32))


# --- seeding ---------------------------------------------------------------------------------
def build():
    return nn.Sequential(
        nn.Conv2d(1, 2, 3), nn.Flatten(), nn.Linear(8, 4), nn.Embedding(5, 2), nn.BatchNorm1d(2)
    )


def assert_same_state(first, second):
    for (name, a), b in zip(first.state_dict().items(), second.state_dict().values(), strict=True):
        np.testing.assert_array_equal(a, b, err_msg=name)


def test_manual_seed_makes_two_builds_identical():
    init.manual_seed(123)
    first = build()
    init.manual_seed(123)
    second = build()
    assert_same_state(first, second)
    third = build()  # the stream moved on: a different model
    assert not np.array_equal(third[0].weight.numpy(), first[0].weight.numpy())


def test_seeded_block_restores_the_previous_stream():
    init.manual_seed(5)
    expected_next = init.default_generator().bit_generator.state
    with init.seeded(9) as seeded_generator:
        first = build()
        assert init.default_generator() is seeded_generator
    assert init.default_generator().bit_generator.state == expected_next
    with init.seeded(9):
        second = build()
    assert_same_state(first, second)


def test_an_explicit_generator_does_not_touch_the_default_stream():
    init.manual_seed(0)
    state = init.default_generator().bit_generator.state
    init.normal_(parameter((3, 3)), generator=generator(4))
    assert init.default_generator().bit_generator.state == state


# --- errors ----------------------------------------------------------------------------------
def test_errors_name_the_problem():
    with pytest.raises(ValueError, match=r"at least 2 dimensions, got shape \(5,\)"):
        init.xavier_uniform_(parameter((5,)))
    with pytest.raises(ValueError, match="mode must be 'fan_in' or 'fan_out', got 'fan'"):
        init.kaiming_uniform_(parameter((2, 2)), mode="fan")
    with pytest.raises(ValueError, match="unknown nonlinearity 'swish'"):
        init.kaiming_normal_(parameter((2, 2)), nonlinearity="swish")
    with pytest.raises(ValueError, match="std must be >= 0"):
        init.normal_(parameter((2,)), std=-1.0)
    with pytest.raises(ValueError, match="a=2.0 is above upper bound b=1.0"):
        init.uniform_(parameter((2,)), 2.0, 1.0)
    with pytest.raises(TypeError, match="got ndarray"):
        init.zeros_(np.ones(3))
    with pytest.raises(TypeError, match="generator must be a numpy.random.Generator"):
        init.uniform_(parameter((2,)), generator=np.random.RandomState(0))


def test_empty_tensors_are_left_alone():
    empty = Tensor(np.zeros((0, 4)))
    assert init.kaiming_uniform_(empty).shape == (0, 4)
    assert init.xavier_normal_(empty).shape == (0, 4)
