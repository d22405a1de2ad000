"""ELU, SiLU, Softplus, PReLU, Hardtanh, Mish and Hardswish: the checks every layer gets
(float64 finite differences; PyTorch parity of output, input and weight gradients to 1e-5
relative, see ``test_layers_parity.py``), save/load, stability, settings and errors."""

from __future__ import annotations

import numpy as np
import pytest
import test_layers_parity as parity
from layer_checks import check_save_load_round_trip

from bigdl_py import backend, nn
from bigdl_py.autograd import Tensor, ops

F64 = np.float64
# -6 .. 6 reaches every piece (Hardswish's flat and linear ends, Hardtanh's clipped ends)
# while no value sits on a kink (+-3, +-1, 0), where finite differences are undefined.
WIDE_RANGE = np.linspace(-6.0, 6.0, 24).reshape(4, 6)

CASES = [
    ("elu", nn.ELU, lambda t: t.nn.ELU(), [WIDE_RANGE]),
    ("elu_alpha", lambda: nn.ELU(alpha=0.5), lambda t: t.nn.ELU(alpha=0.5), [(3, 4)]),
    ("silu", nn.SiLU, lambda t: t.nn.SiLU(), [WIDE_RANGE]),
    ("softplus", nn.Softplus, lambda t: t.nn.Softplus(), [WIDE_RANGE]),
    (
        # beta * x passes the threshold for x > 2.5: both the smooth and the linear piece.
        "softplus_beta_threshold",
        lambda: nn.Softplus(beta=2.0, threshold=5.0),
        lambda t: t.nn.Softplus(beta=2.0, threshold=5.0),
        [WIDE_RANGE],
    ),
    ("mish", nn.Mish, lambda t: t.nn.Mish(), [WIDE_RANGE]),
    ("hardtanh", nn.Hardtanh, lambda t: t.nn.Hardtanh(), [WIDE_RANGE]),
    (
        "hardtanh_range",
        lambda: nn.Hardtanh(-2.0, 0.5),
        lambda t: t.nn.Hardtanh(-2.0, 0.5),
        [WIDE_RANGE],
    ),
    ("hardswish", nn.Hardswish, lambda t: t.nn.Hardswish(), [WIDE_RANGE]),
    ("prelu_shared", lambda: nn.PReLU(dtype=F64), lambda t: t.nn.PReLU(), [WIDE_RANGE]),
    (
        "prelu_per_channel",
        lambda: parity.with_random_affine(nn.PReLU(3, dtype=F64)),
        lambda t: t.nn.PReLU(3),
        [(2, 3, 4)],
    ),
    (
        "prelu_per_channel_4d",
        lambda: nn.PReLU(2, init=0.1, dtype=F64),
        lambda t: t.nn.PReLU(2, init=0.1),
        [(2, 2, 3, 3)],
    ),
]
CASE_PARAMS = [pytest.param(*case[1:], id=case[0]) for case in CASES]


@pytest.mark.parametrize("make_ours, make_theirs, specs", CASE_PARAMS)
def test_layer_gradients_match_finite_differences(make_ours, make_theirs, specs):
    parity.test_layer_gradients_match_finite_differences(make_ours, make_theirs, specs)


@pytest.mark.parametrize("make_ours, make_theirs, specs", CASE_PARAMS)
def test_layer_matches_pytorch(torch, make_ours, make_theirs, specs):
    parity.test_layer_matches_pytorch(torch, make_ours, make_theirs, specs)


@pytest.mark.gpu
@pytest.mark.skipif(not backend.cuda_available(), reason="needs CuPy and a CUDA device")
@pytest.mark.parametrize("make_ours, make_theirs, specs", CASE_PARAMS)
def test_layer_on_cuda_matches_cpu(make_ours, make_theirs, specs):
    parity.test_layer_on_cuda_matches_cpu(make_ours, make_theirs, specs)


@pytest.mark.parametrize("make_ours, make_theirs, specs", CASE_PARAMS)
def test_layer_round_trips_through_save_and_load(tmp_path, make_ours, make_theirs, specs):
    check_save_load_round_trip(tmp_path, make_ours, specs)


@pytest.mark.parametrize(
    "layer", [nn.ELU(), nn.SiLU(), nn.Softplus(), nn.Mish(), nn.Hardswish(), nn.PReLU()]
)
def test_large_float32_inputs_give_finite_outputs_and_gradients(layer):
    x = Tensor([[-1000.0, -80.0, 0.0, 80.0, 1000.0]], requires_grad=True, dtype=np.float32)
    output = layer(x)
    output.sum().backward()
    assert output.dtype == np.float32 and x.grad.dtype == np.float32
    assert np.all(np.isfinite(output.numpy())) and np.all(np.isfinite(x.grad.numpy()))
    # Far out every one of them is the identity on the right.
    assert output.numpy()[0, -1] == pytest.approx(1000.0)


def test_prelu_weight_starts_at_init_and_is_pytorchs_parameter():
    layer = nn.PReLU(4, init=0.1)
    assert [name for name, _ in layer.named_parameters()] == ["weight"]
    np.testing.assert_array_equal(layer.weight.numpy(), np.full(4, 0.1, np.float32))
    layer.weight.data[...] = 3.0
    layer.reset_parameters()
    np.testing.assert_array_equal(layer.weight.numpy(), np.full(4, 0.1, np.float32))


def test_softplus_threshold_switches_to_the_identity():
    x = Tensor([[30.0, 2.0]], dtype=np.float64)
    np.testing.assert_array_equal(ops.softplus(x, threshold=20.0).numpy()[0, 0], 30.0)
    assert ops.softplus(x, threshold=20.0).numpy()[0, 1] == pytest.approx(np.log1p(np.exp(2.0)))


def test_prelu_shape_error_names_the_layer_and_the_shape():
    with pytest.raises(ValueError, match=r"PReLU\(num_parameters=3\): expects 3 channels on "):
        nn.PReLU(3)(Tensor(np.zeros((2, 4, 5), np.float32)))


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: nn.ELU(alpha="1"), r"ELU: alpha must be a finite number, got '1'"),
        (lambda: nn.Softplus(beta=0), r"Softplus: beta must be > 0, got 0"),
        (lambda: nn.Hardtanh(1.0, -1.0), r"Hardtanh: max_val \(-1.0\) must be greater than"),
        (lambda: nn.PReLU(0), r"PReLU: num_parameters must be a positive integer, got 0"),
        (lambda: nn.PReLU(init=None), r"PReLU: init must be a finite number, got None"),
    ],
)
def test_bad_settings_raise_naming_the_layer_and_the_setting(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_integer_input_is_refused_naming_the_op():
    with pytest.raises(TypeError, match=r"hardswish: input must be floating point"):
        nn.Hardswish()(Tensor(np.arange(4)))
