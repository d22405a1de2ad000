"""Conv1d and ConvTranspose2d layers: PyTorch parity (outputs, input and parameter
gradients, float64, 1e-5 relative), finite differences, default init, save/load, errors."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bigdl_py import nn
from bigdl_py.autograd import Tensor, gradcheck

F64 = np.float64

# (id, our layer in float64, PyTorch's layer, input shape)
CASES = [
    ("conv1d", lambda: nn.Conv1d(3, 4, 3, dtype=F64), lambda t: t.nn.Conv1d(3, 4, 3), (2, 3, 7)),
    (
        "conv1d_stride_padding_dilation_groups_no_bias",
        lambda: nn.Conv1d(
            4, 2, 3, stride=2, padding=2, dilation=2, groups=2, bias=False, dtype=F64
        ),
        lambda t: t.nn.Conv1d(4, 2, 3, stride=2, padding=2, dilation=2, groups=2, bias=False),
        (2, 4, 9),
    ),
    (
        "conv_transpose2d",
        lambda: nn.ConvTranspose2d(3, 2, 3, dtype=F64),
        lambda t: t.nn.ConvTranspose2d(3, 2, 3),
        (2, 3, 4, 4),
    ),
    (
        "conv_transpose2d_dcgan_upsampling",
        lambda: nn.ConvTranspose2d(4, 2, 4, stride=2, padding=1, bias=False, dtype=F64),
        lambda t: t.nn.ConvTranspose2d(4, 2, 4, stride=2, padding=1, bias=False),
        (2, 4, 3, 3),
    ),
    (
        "conv_transpose2d_all_settings",
        lambda: nn.ConvTranspose2d(
            4,
            6,
            (3, 2),
            stride=(2, 3),
            padding=(1, 0),
            output_padding=(1, 2),
            groups=2,
            dilation=(2, 1),
            dtype=F64,
        ),
        lambda t: t.nn.ConvTranspose2d(
            4,
            6,
            (3, 2),
            stride=(2, 3),
            padding=(1, 0),
            output_padding=(1, 2),
            groups=2,
            dilation=(2, 1),
        ),
        (1, 4, 3, 4),
    ),
]
CASE_PARAMS = [pytest.param(*case[1:], id=case[0]) for case in CASES]


@pytest.mark.parametrize("make_ours, make_theirs, input_shape", CASE_PARAMS)
def test_layer_matches_pytorch(torch, make_ours, make_theirs, input_shape):
    ours = make_ours()
    theirs = make_theirs(torch).double()
    # strict=True: our parameter names and shapes are PyTorch's.
    theirs.load_state_dict({k: torch.from_numpy(v) for k, v in ours.state_dict().items()})
    values = np.random.default_rng(0).standard_normal(input_shape)
    x = Tensor(values, requires_grad=True, dtype=F64)
    x_torch = torch.tensor(values, requires_grad=True)
    output, output_torch = ours(x), theirs(x_torch)
    np.testing.assert_allclose(output.numpy(), output_torch.detach().numpy(), rtol=1e-5)
    upstream = np.random.default_rng(1).standard_normal(output.shape)
    output.backward(upstream)
    output_torch.backward(torch.from_numpy(upstream))
    np.testing.assert_allclose(x.grad.numpy(), x_torch.grad.numpy(), rtol=1e-5, atol=1e-12)
    their_parameters = dict(theirs.named_parameters())
    for name, parameter in ours.named_parameters():
        np.testing.assert_allclose(
            parameter.grad.numpy(),
            their_parameters[name].grad.numpy(),
            rtol=1e-5,
            atol=1e-12,
            err_msg=name,
        )


@pytest.mark.parametrize("make_ours, make_theirs, input_shape", CASE_PARAMS)
def test_layer_gradients_match_finite_differences(make_ours, make_theirs, input_shape):
    layer = make_ours()
    x = Tensor(np.random.default_rng(2).standard_normal(input_shape), requires_grad=True)
    parameters = list(layer.parameters())
    assert gradcheck(lambda a, *_: layer(a), [x, *parameters])


@pytest.mark.parametrize("make_ours, make_theirs, input_shape", CASE_PARAMS)
def test_layer_round_trips_through_save_and_load(tmp_path, make_ours, make_theirs, input_shape):
    layer = make_ours()
    path = tmp_path / "layer.bigdl"
    nn.save(layer, path)
    loaded = nn.load(path)
    assert repr(loaded) == repr(layer)
    x = Tensor(np.random.default_rng(3).standard_normal(input_shape))
    np.testing.assert_array_equal(loaded(x).numpy(), layer(x).numpy())


@pytest.mark.parametrize(
    "layer, weight_shape, fan_in",
    [
        (lambda: nn.Conv1d(4, 6, 5, groups=2), (6, 2, 5), 2 * 5),
        (lambda: nn.ConvTranspose2d(4, 6, (3, 2), groups=2), (4, 3, 3, 2), 3 * 3 * 2),
    ],
)
def test_default_init_is_pytorchs_uniform_bound(layer, weight_shape, fan_in):
    with nn.init.seeded(0):
        module = layer()
    assert module.weight.shape == weight_shape and module.weight.dtype == np.float32
    bound = 1.0 / math.sqrt(fan_in)
    for parameter in (module.weight, module.bias):
        values = parameter.numpy()
        assert np.abs(values).max() <= bound
        assert np.abs(values).max() > 0.5 * bound  # spread over the range, not near zero


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: nn.Conv1d(3, 4, 3, groups=2), r"Conv1d: groups=2 must divide in_channels=3"),
        (lambda: nn.Conv1d(3, 4, (3, 3)), r"Conv1d: kernel_size must be an int or a 1-tuple"),
        (lambda: nn.Conv1d(3, 4, 3, padding=-1), r"Conv1d: padding must be >= 0"),
        (
            lambda: nn.ConvTranspose2d(2, 2, 3, stride=2, output_padding=2),
            r"ConvTranspose2d: output_padding \(2, 2\) must be smaller than either the stride",
        ),
        (
            lambda: nn.ConvTranspose2d(3, 4, 3, groups=2),
            r"ConvTranspose2d: groups=2 must divide in_channels=3",
        ),
        (lambda: nn.ConvTranspose2d(3, 0, 3), r"ConvTranspose2d: out_channels must be a positive"),
    ],
)
def test_bad_settings_raise_naming_the_layer(make, message):
    with pytest.raises(ValueError, match=message):
        make()


@pytest.mark.parametrize(
    "layer, shape, message",
    [
        (nn.Conv1d(3, 4, 3), (2, 3, 4, 4), r"Conv1d\(3, 4, .*expects \(N, C, L\) input, got shape"),
        (
            nn.Conv1d(3, 4, 3),
            (2, 2, 7),
            r"Conv1d\(3, 4, .*input has 2 channels \(shape \(2, 2, 7\)\)",
        ),
        (nn.Conv1d(3, 4, 5), (2, 3, 4), r"Conv1d\(3, 4, .*shorter than the \(dilated\) kernel"),
        (
            nn.ConvTranspose2d(3, 4, 3),
            (2, 3, 4),
            r"ConvTranspose2d\(3, 4, .*expects \(N, C, H, W\) input, got shape \(2, 3, 4\)",
        ),
        (
            nn.ConvTranspose2d(3, 4, 3),
            (1, 5, 4, 4),
            r"ConvTranspose2d\(3, 4, .*input has 5 channels",
        ),
    ],
)
def test_bad_inputs_raise_naming_the_layer_and_shape(layer, shape, message):
    with pytest.raises(ValueError, match=message):
        layer(Tensor(np.zeros(shape, dtype=np.float32)))
