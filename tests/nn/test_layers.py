"""Layers: default initialisation, dtypes, settings, error messages, dropout, reprs.

Numerical correctness (finite differences and PyTorch parity) is in test_layers_parity.py.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from bigdl_py import nn
from bigdl_py.autograd import Tensor, ops


def batch(*shape, dtype=np.float32, seed=0) -> Tensor:
    return Tensor(np.random.default_rng(seed).standard_normal(shape), dtype=dtype)


# --- default initialisation (PyTorch's) ---------------------------------------------------
@pytest.mark.parametrize(
    "layer, fan_in",
    [
        (lambda: nn.Linear(60, 40), 60),
        (lambda: nn.Conv2d(6, 8, (3, 5)), 6 * 3 * 5),
        (lambda: nn.Conv2d(6, 9, 3, groups=3), 2 * 3 * 3),
    ],
    ids=["linear", "conv2d", "conv2d_groups"],
)
def test_weights_and_bias_start_uniform_within_one_over_sqrt_fan_in(layer, fan_in):
    with nn.init.seeded(0):
        module = layer()
    bound = 1 / math.sqrt(fan_in)
    for parameter in (module.weight, module.bias):
        values = parameter.numpy()
        assert values.min() >= -bound and values.max() <= bound
    weight = module.weight.numpy()
    # Hundreds of uniform draws fill the range, with the uniform's standard deviation.
    assert weight.max() > 0.9 * bound and weight.min() < -0.9 * bound
    np.testing.assert_allclose(weight.std(), bound / math.sqrt(3), rtol=0.1)


def test_normalisation_layers_start_as_identity_transforms():
    batch_norm = nn.BatchNorm2d(4)
    np.testing.assert_array_equal(batch_norm.weight.numpy(), np.ones(4))
    np.testing.assert_array_equal(batch_norm.bias.numpy(), np.zeros(4))
    np.testing.assert_array_equal(batch_norm.running_mean.numpy(), np.zeros(4))
    np.testing.assert_array_equal(batch_norm.running_var.numpy(), np.ones(4))
    assert batch_norm.num_batches_tracked.item() == 0
    layer_norm = nn.LayerNorm((2, 3))
    np.testing.assert_array_equal(layer_norm.weight.numpy(), np.ones((2, 3)))
    np.testing.assert_array_equal(layer_norm.bias.numpy(), np.zeros((2, 3)))


def test_embedding_starts_standard_normal_with_a_zero_padding_row():
    with nn.init.seeded(0):
        embedding = nn.Embedding(2000, 50, padding_idx=-1)
    assert embedding.padding_idx == 1999
    weight = embedding.weight.numpy()
    np.testing.assert_array_equal(weight[1999], np.zeros(50))
    assert abs(weight[:1999].mean()) < 0.01 and abs(weight[:1999].std() - 1) < 0.01


def test_reset_parameters_redraws_from_the_default_generator():
    layer = nn.Linear(5, 4)
    before = layer.weight.numpy().copy()
    weight_array = layer.weight.data
    layer.reset_parameters()
    assert layer.weight.data is weight_array  # in place: flat-buffer views stay views
    assert not np.array_equal(before, layer.weight.numpy())


# --- dtypes ---------------------------------------------------------------------------------
def test_parameters_default_to_float32_and_follow_the_dtype_argument():
    assert nn.Linear(3, 2).weight.dtype == np.float32
    for dtype in (np.float64, "float64", np.dtype("float64")):
        layer = nn.Conv2d(1, 2, 3, dtype=dtype)
        assert layer.weight.dtype == np.float64 and layer.bias.dtype == np.float64
    batch_norm = nn.BatchNorm1d(3, dtype="float16")
    assert batch_norm.weight.dtype == np.float16 and batch_norm.running_var.dtype == np.float16
    assert batch_norm.num_batches_tracked.dtype == np.int64


def test_float64_output_from_float64_layer():
    layer = nn.Linear(3, 2, dtype=np.float64)
    assert layer(batch(4, 3, dtype=np.float64)).dtype == np.float64


def test_integer_parameter_dtype_is_rejected_naming_the_layer():
    with pytest.raises(TypeError, match=r"Linear: dtype must be a floating-point type.*int32"):
        nn.Linear(3, 2, dtype=np.int32)


def test_mixing_float32_input_with_float64_layer_names_both_dtypes():
    with pytest.raises(TypeError, match="float32.*float64|float64.*float32"):
        nn.Linear(3, 2, dtype=np.float64)(batch(4, 3))


# --- errors name the layer and the shapes ---------------------------------------------------
@pytest.mark.parametrize(
    "layer, x, message",
    [
        (
            nn.Linear(192, 100),
            batch(128, 190),
            r"Linear\(192 -> 100\): input has 190 features \(shape \(128, 190\)\)",
        ),
        (nn.Conv2d(3, 8, 3), batch(2, 4, 6, 6), r"Conv2d\(3, 8, .*input has 4 channels"),
        (nn.Conv2d(3, 8, 3), batch(3, 6, 6), r"Conv2d\(3, 8, .*\(N, C, H, W\).*\(3, 6, 6\)"),
        (nn.MaxPool2d(2), batch(3, 4), r"MaxPool2d\(kernel_size=\(2, 2\).*\(3, 4\)"),
        (nn.BatchNorm2d(3), batch(2, 5, 4, 4), r"BatchNorm2d\(3, .*input has 5 channels"),
        (nn.BatchNorm1d(3), batch(2, 3, 4, 4), r"BatchNorm1d\(3, .*\(N, C\) or \(N, C, L\)"),
        (nn.LayerNorm(5), batch(2, 4), r"LayerNorm\(\(5,\).*\(2, 4\).*\(5,\)"),
        (nn.Reshape((4, 5)), batch(2, 21), r"Reshape\(shape=\(4, 5\)\).*\(2, 21\).*21 values"),
        (nn.Reshape((4, -1)), batch(2, 6), r"Reshape\(shape=\(4, -1\)\).*6 values"),
        (nn.Flatten(3), batch(2, 3), r"Flatten\(start_dim=3.*\(2, 3\)"),
        (nn.LogSoftmax(dim=2), batch(2, 3), r"LogSoftmax\(dim=2\): dim out of range.*\(2, 3\)"),
        (nn.Add(), [batch(2, 3), batch(2, 4)], r"Add\(\): input 1 has shape \(2, 4\).*\(2, 3\)"),
        (
            nn.Concat(1),
            [batch(2, 3), batch(3, 3)],
            r"Concat\(axis=1\): input 1 has shape \(3, 3\).*only along axis 1",
        ),
        (nn.Concat(2), [batch(2, 3), batch(2, 3)], r"Concat\(axis=2\): axis out of range"),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, nn.Module) else None,
)
def test_shape_errors_name_the_layer_and_the_shapes(layer, x, message):
    with pytest.raises(ValueError, match=message):
        layer(x)


def test_embedding_rejects_float_indices_naming_the_layer():
    with pytest.raises(TypeError, match=r"Embedding\(5, 2\): indices must be integers.*float"):
        nn.Embedding(5, 2)(batch(3))


def test_embedding_out_of_range_index_names_the_vocabulary():
    with pytest.raises(IndexError, match="vocabulary of 5"):
        nn.Embedding(5, 2)(np.array([0, 5]))


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: nn.Linear(0, 3), r"Linear: in_features must be a positive integer, got 0"),
        (lambda: nn.Linear(3.0, 3), r"Linear: in_features must be a positive integer"),
        (lambda: nn.Conv2d(4, 6, 3, groups=4), r"groups=4 must divide.*out_channels=6"),
        (lambda: nn.Conv2d(4, 6, (3, 3, 3)), r"kernel_size must be an int or a pair"),
        (lambda: nn.Conv2d(4, 6, 3, padding=-1), r"padding must be >= 0"),
        (lambda: nn.MaxPool2d(2, padding=2), r"MaxPool2d: padding \(2, 2\) must be at most half"),
        (lambda: nn.BatchNorm2d(3, momentum=1.5), r"momentum must be a number in \[0, 1\] or None"),
        (lambda: nn.Dropout(1.2), r"Dropout: p must be a number in \[0, 1\], got 1.2"),
        (lambda: nn.Embedding(4, 2, padding_idx=4), r"padding_idx 4 is outside a vocabulary"),
        (lambda: nn.Reshape((2, -1, -1)), r"at most one -1"),
        (lambda: nn.GELU("fast"), r"approximate must be 'none' or 'tanh'"),
    ],
)
def test_bad_settings_raise_naming_the_setting_and_value(build, message):
    with pytest.raises(ValueError, match=message):
        build()


# --- settings --------------------------------------------------------------------------------
def test_pair_settings_accept_lists_as_from_a_json_config():
    layer = nn.Conv2d(2, 3, [3, 2], stride=[2, 1], padding=[1, 0])
    assert layer.kernel_size == (3, 2) and layer.stride == (2, 1) and layer.padding == (1, 0)
    assert layer(batch(1, 2, 6, 6)).shape == (1, 3, 3, 5)


def test_pooling_stride_defaults_to_the_kernel_size():
    assert nn.MaxPool2d(3).stride == (3, 3)
    assert nn.AvgPool2d((2, 3), stride=1).stride == (1, 1)
    assert nn.MaxPool2d(2)(batch(1, 1, 6, 4)).shape == (1, 1, 3, 2)


def test_constructor_arguments_are_recorded_as_json_values():
    layers = [
        nn.Linear(3, 2, bias=False, dtype="float64"),
        nn.Conv2d(2, 4, (3, 3), stride=2, padding=1),
        nn.MaxPool2d(2),
        nn.BatchNorm2d(4, momentum=None),
        nn.LayerNorm([2, 3]),
        nn.Dropout(0.3, seed=5),
        nn.Embedding(10, 4, padding_idx=0),
        nn.Reshape((2, -1)),
        nn.Concat(-1),
        nn.LeakyReLU(0.1),
    ]
    for layer in layers:
        args, kwargs = layer._init_args
        rebuilt = type(layer)(*json.loads(json.dumps(args)), **json.loads(json.dumps(kwargs)))
        assert rebuilt.extra_repr() == layer.extra_repr()
        assert rebuilt.state_dict().keys() == layer.state_dict().keys()


def test_extra_repr_shows_the_settings():
    assert repr(nn.Linear(3, 2)) == "Linear(in_features=3, out_features=2, bias=True)"
    assert repr(nn.Conv2d(1, 2, 3, padding=1, bias=False)) == (
        "Conv2d(1, 2, kernel_size=(3, 3), stride=(1, 1), padding=(1, 1), bias=False)"
    )
    assert repr(nn.Embedding(5, 2, padding_idx=0)) == "Embedding(5, 2, padding_idx=0)"
    assert repr(nn.Dropout(0.25)) == "Dropout(p=0.25)"
    assert repr(nn.ReLU()) == "ReLU()"


def test_layers_without_bias_register_no_bias_parameter():
    assert [name for name, _ in nn.Linear(3, 2, bias=False).named_parameters()] == ["weight"]
    assert list(nn.BatchNorm1d(3, affine=False).state_dict()) == [
        "running_mean",
        "running_var",
        "num_batches_tracked",
    ]
    assert list(nn.BatchNorm1d(3, track_running_stats=False).state_dict()) == ["weight", "bias"]


def test_merge_layers_take_inputs_as_arguments_or_as_one_list():
    a, b = batch(2, 3, seed=1), batch(2, 3, seed=2)
    np.testing.assert_allclose(nn.Add()([a, b]).numpy(), nn.Add()(a, b).numpy())
    np.testing.assert_allclose(nn.Multiply()((a, b)).numpy(), (a * b).numpy())
    assert nn.Concat(0)([a]) is a


# --- batch norm's running statistics ---------------------------------------------------------
def test_batch_norm_counts_batches_and_stops_updating_in_eval():
    layer = nn.BatchNorm1d(2)
    layer(batch(8, 2))
    layer(batch(8, 2, seed=1))
    assert layer.num_batches_tracked.item() == 2
    running_mean = layer.running_mean.numpy().copy()
    layer.eval()
    x = batch(4, 2, seed=2)
    output = layer(x)
    np.testing.assert_array_equal(layer.running_mean.numpy(), running_mean)
    expected = (x.numpy() - running_mean) / np.sqrt(layer.running_var.numpy() + layer.eps)
    np.testing.assert_allclose(output.numpy(), expected, rtol=1e-5, atol=1e-6)


# --- dropout ---------------------------------------------------------------------------------
def test_dropout_drops_a_fraction_p_and_scales_the_rest():
    x = Tensor(np.ones((200, 100), np.float32))
    output = nn.Dropout(0.3, seed=0)(x).numpy()
    dropped = output == 0
    assert abs(dropped.mean() - 0.3) < 0.01
    np.testing.assert_allclose(output[~dropped], 1 / 0.7, rtol=1e-6)


def test_dropout_is_the_identity_in_eval_mode_and_for_p_zero():
    x = batch(4, 5)
    assert nn.Dropout(0.5).eval()(x) is x
    assert nn.Dropout(0.0)(x) is x


def test_dropout_with_p_one_drops_everything():
    assert not nn.Dropout(1.0)(batch(3, 4)).numpy().any()


def test_dropout_seed_makes_masks_repeat():
    x = Tensor(np.ones((10, 10), np.float32))
    first, second = nn.Dropout(0.5, seed=3), nn.Dropout(0.5, seed=3)
    np.testing.assert_array_equal(first(x).numpy(), second(x).numpy())
    # Successive calls of one layer draw fresh masks from its stream.
    assert not np.array_equal(first(x).numpy(), first(x).numpy())


def test_dropout_without_a_seed_follows_the_shared_dropout_generator():
    x = Tensor(np.ones((10, 10), np.float32))
    layer = nn.Dropout(0.5)
    ops.manual_seed(11)
    first = layer(x).numpy()
    ops.manual_seed(11)
    np.testing.assert_array_equal(layer(x).numpy(), first)


def test_dropout_gradient_uses_the_forward_mask():
    x = Tensor(np.ones((6, 6)), requires_grad=True, dtype=np.float64)
    output = nn.Dropout(0.5, seed=1)(x)
    output.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), output.numpy())


@pytest.mark.parametrize(
    "layer, shape",
    [
        (nn.Conv1d(2, 3, 2), (1, 2, 5)),
        (nn.Conv2d(2, 3, 2), (1, 2, 5, 5)),
        (nn.ConvTranspose2d(2, 3, 2), (1, 2, 5, 5)),
        (nn.BatchNorm1d(2), (4, 2)),
        (nn.BatchNorm2d(2), (4, 2, 3, 3)),
        (nn.InstanceNorm2d(2), (4, 2, 3, 3)),
        (nn.GroupNorm(1, 2), (4, 2, 3, 3)),
        (nn.LayerNorm(3), (4, 2, 3)),
        (nn.Linear(3, 2), (4, 3)),  # was quietly promoted to float64 (bool to float32)
        (nn.PReLU(2), (4, 2)),  # the op's error named "prelu", not the layer
        (nn.TransformerEncoderLayer(4, 2, 8), (3, 2, 4)),  # named its inner attention
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, nn.Module) else None,
)
@pytest.mark.parametrize("dtype", [np.int64, np.uint8, np.bool_])
def test_integer_input_is_a_type_error_naming_the_layer_and_the_dtype(layer, shape, dtype):
    """Issue 27 item 20: it failed inside NumPy ('Cannot cast ufunc matmul output...');
    Linear gave float64 output."""
    name = type(layer).__name__
    with pytest.raises(TypeError, match=rf"{name}\(.*\): input must be floating point, got dtype"):
        layer(np.ones(shape, dtype=dtype))
    with pytest.raises(TypeError, match=np.dtype(dtype).name):
        layer(Tensor(np.ones(shape, dtype=dtype)))


def test_cumulative_batch_norm_on_a_device_reads_no_count_back():
    from bigdl_py import device_waits

    host, device = nn.BatchNorm1d(3, momentum=None), nn.BatchNorm1d(3, momentum=None)
    device.to("strict")
    rng = np.random.default_rng(0)
    for _ in range(3):
        batch = rng.standard_normal((8, 3)).astype(np.float32)
        host(Tensor(batch))
        with device_waits.no_device_waits():
            device(Tensor(batch, device="strict"))
    for name, value in host.state_dict().items():
        np.testing.assert_allclose(device.state_dict()[name], value, rtol=1e-5, err_msg=name)


@pytest.mark.parametrize(
    "layer, shape",
    [
        (nn.MultiheadAttention(4, 2), (3, 2, 4)),
        (nn.LSTM(4, 3), (3, 2, 4)),
        (nn.GRU(4, 3), (3, 2, 4)),
        (nn.RNN(4, 3), (3, 2, 4)),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, nn.Module) else None,
)
def test_layers_that_want_their_parameters_dtype_refuse_integer_input_naming_both(layer, shape):
    name = type(layer).__name__
    with pytest.raises(TypeError, match=rf"{name}\(.*int64 differs from the parameters' float32"):
        layer(
            *[Tensor(np.ones(shape, dtype=np.int64))] * (3 if name == "MultiheadAttention" else 1)
        )
