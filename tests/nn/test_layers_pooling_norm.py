"""Pooling, resizing, normalisation and regularisation layers of the second wave.

The numerical checks are the ones every layer gets (``test_layers_parity.py``): float64
finite differences, and PyTorch parity of the output, input and parameter gradients and
buffers to 1e-5 relative. Here each layer also round-trips through ``nn.save``/``nn.load``
and its errors are checked to name the layer and the bad setting or shape.
"""

from __future__ import annotations

import numpy as np
import pytest
import test_layers_parity as parity
from layer_checks import check_save_load_round_trip
from memory_checks import traced_peak

from bigdl_py import backend, nn
from bigdl_py.autograd import Tensor, gradcheck, ops

F64 = np.float64


# (id, our layer in float64, the PyTorch layer, input specs)
CASES = [
    (
        "adaptive_avg_pool2d_global",
        lambda: nn.AdaptiveAvgPool2d(1),
        lambda t: t.nn.AdaptiveAvgPool2d(1),
        [(2, 3, 4, 5)],
    ),
    (
        "adaptive_avg_pool2d_uneven_windows",
        lambda: nn.AdaptiveAvgPool2d((3, 2)),
        lambda t: t.nn.AdaptiveAvgPool2d((3, 2)),
        [(2, 2, 7, 5)],
    ),
    (
        "adaptive_avg_pool2d_keep_height_upsample_width",
        lambda: nn.AdaptiveAvgPool2d((None, 7)),
        lambda t: t.nn.AdaptiveAvgPool2d((None, 7)),
        [(1, 2, 3, 5)],
    ),
    (
        "adaptive_max_pool2d_global",
        lambda: nn.AdaptiveMaxPool2d(1),
        lambda t: t.nn.AdaptiveMaxPool2d(1),
        [(2, 3, 4, 5)],
    ),
    (
        "adaptive_max_pool2d_overlapping_windows",
        lambda: nn.AdaptiveMaxPool2d((4, 3)),
        lambda t: t.nn.AdaptiveMaxPool2d((4, 3)),
        [(2, 2, 7, 5)],
    ),
    ("max_pool1d", lambda: nn.MaxPool1d(2), lambda t: t.nn.MaxPool1d(2), [(2, 3, 7)]),
    (
        "max_pool1d_overlapping_padded",
        lambda: nn.MaxPool1d(3, stride=2, padding=1),
        lambda t: t.nn.MaxPool1d(3, stride=2, padding=1),
        [(2, 2, 8)],
    ),
    ("avg_pool1d", lambda: nn.AvgPool1d(3), lambda t: t.nn.AvgPool1d(3), [(2, 3, 7)]),
    (
        "avg_pool1d_overlapping_padded",
        lambda: nn.AvgPool1d(4, stride=1, padding=2),
        lambda t: t.nn.AvgPool1d(4, stride=1, padding=2),
        [(1, 2, 6)],
    ),
    (
        "upsample_nearest_scale_factor",
        lambda: nn.Upsample(scale_factor=2),
        lambda t: t.nn.Upsample(scale_factor=2),
        [(2, 2, 3, 4)],
    ),
    (
        "upsample_nearest_fractional_scale_per_axis",
        lambda: nn.Upsample(scale_factor=(1.5, 0.6)),
        lambda t: t.nn.Upsample(scale_factor=(1.5, 0.6)),
        [(1, 2, 3, 5)],
    ),
    (
        "upsample_nearest_size",
        lambda: nn.Upsample(size=(5, 7)),
        lambda t: t.nn.Upsample(size=(5, 7)),
        [(1, 2, 3, 4)],
    ),
    (
        "upsample_bilinear_scale_factor",
        lambda: nn.Upsample(scale_factor=2, mode="bilinear"),
        lambda t: t.nn.Upsample(scale_factor=2, mode="bilinear"),
        [(2, 2, 3, 4)],
    ),
    (
        "upsample_bilinear_align_corners_size",
        lambda: nn.Upsample(size=(5, 6), mode="bilinear", align_corners=True),
        lambda t: t.nn.Upsample(size=(5, 6), mode="bilinear", align_corners=True),
        [(1, 2, 3, 4)],
    ),
    (
        "upsample_bilinear_fractional_scale_down_and_up",
        lambda: nn.Upsample(scale_factor=(0.7, 2.5), mode="bilinear", align_corners=False),
        lambda t: t.nn.Upsample(scale_factor=(0.7, 2.5), mode="bilinear", align_corners=False),
        [(1, 2, 5, 3)],
    ),
    (
        "upsample_recompute_scale_factor",
        lambda: nn.Upsample(scale_factor=1.7, mode="bilinear", recompute_scale_factor=True),
        lambda t: t.nn.Upsample(scale_factor=1.7, mode="bilinear", recompute_scale_factor=True),
        [(1, 2, 3, 5)],
    ),
    (
        "group_norm",
        lambda: parity.with_random_affine(nn.GroupNorm(2, 4, dtype=F64)),
        lambda t: t.nn.GroupNorm(2, 4),
        [(2, 4, 3, 3)],
    ),
    (
        "group_norm_one_group_sequence_input",
        lambda: parity.with_random_affine(nn.GroupNorm(1, 3, dtype=F64)),
        lambda t: t.nn.GroupNorm(1, 3),
        [(2, 3, 5)],
    ),
    (
        "group_norm_a_group_per_channel_no_affine",
        lambda: nn.GroupNorm(3, 3, affine=False, dtype=F64),
        lambda t: t.nn.GroupNorm(3, 3, affine=False),
        [(2, 3, 2, 3)],
    ),
    (
        "instance_norm2d",
        lambda: nn.InstanceNorm2d(3, dtype=F64),
        lambda t: t.nn.InstanceNorm2d(3),
        [(2, 3, 3, 4)],
    ),
    (
        "instance_norm2d_affine_unbatched",
        lambda: parity.with_random_affine(nn.InstanceNorm2d(2, affine=True, dtype=F64)),
        lambda t: t.nn.InstanceNorm2d(2, affine=True),
        [(2, 3, 4)],
    ),
    (
        "instance_norm2d_running_stats_train",
        lambda: parity.with_random_affine(
            nn.InstanceNorm2d(3, momentum=0.3, affine=True, track_running_stats=True, dtype=F64)
        ),
        lambda t: t.nn.InstanceNorm2d(3, momentum=0.3, affine=True, track_running_stats=True),
        [(4, 3, 3, 3)],
    ),
    (
        "instance_norm2d_running_stats_eval",
        lambda: parity.with_random_running_stats(
            nn.InstanceNorm2d(3, track_running_stats=True, dtype=F64)
        ).eval(),
        lambda t: t.nn.InstanceNorm2d(3, track_running_stats=True),
        [(2, 3, 2, 3)],
    ),
    (
        "instance_norm2d_no_running_stats_eval",
        lambda: nn.InstanceNorm2d(2, dtype=F64).eval(),
        lambda t: t.nn.InstanceNorm2d(2),
        [(2, 2, 3, 3)],
    ),
    (
        "dropout2d_eval",
        lambda: nn.Dropout2d(0.5).eval(),
        lambda t: t.nn.Dropout2d(0.5),
        [(2, 3, 2, 2)],
    ),
    ("dropout2d_p0", lambda: nn.Dropout2d(0.0), lambda t: t.nn.Dropout2d(0.0), [(2, 3, 2, 2)]),
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


def test_adaptive_max_pool_sends_the_gradient_of_a_tie_to_the_first_maximum():
    x = Tensor(np.zeros((1, 1, 3, 3)), requires_grad=True)
    nn.AdaptiveMaxPool2d(1)(x).sum().backward()
    expected = np.zeros((3, 3))
    expected[0, 0] = 1.0
    np.testing.assert_array_equal(x.grad.numpy()[0, 0], expected)


def test_adaptive_pools_keep_float32():
    x = Tensor(np.ones((1, 2, 5, 5)), requires_grad=True, dtype=np.float32)
    for layer in (nn.AdaptiveAvgPool2d(2), nn.AdaptiveMaxPool2d(3)):
        output = layer(x)
        assert output.dtype == np.float32
        output.sum().backward()
        assert x.grad.dtype == np.float32


@pytest.mark.parametrize(
    "layer, shape, message",
    [
        (nn.AdaptiveAvgPool2d(2), (3, 4, 4), r"AdaptiveAvgPool2d\(output_size=2\).*\(3, 4, 4\)"),
        (nn.AdaptiveMaxPool2d((2, 1)), (4, 4), r"AdaptiveMaxPool2d\(output_size=\(2, 1\)\)"),
        (nn.MaxPool1d(2), (2, 3, 4, 4), r"MaxPool1d\(kernel_size=2.*\(N, C, L\).*\(2, 3, 4, 4\)"),
        (nn.AvgPool1d(5), (2, 3, 4), r"AvgPool1d\(kernel_size=5.*length 4.*shorter than"),
        (nn.Upsample(scale_factor=2), (2, 3, 4), r"Upsample\(scale_factor=2.*\(2, 3, 4\)"),
        (nn.GroupNorm(2, 4), (2, 6, 3, 3), r"GroupNorm\(2, 4, .*\(N, 4, \.\.\.\).*\(2, 6, 3, 3\)"),
        (nn.InstanceNorm2d(3), (2, 4, 3, 3), r"InstanceNorm2d\(3, .*input has 4 channels"),
        (nn.InstanceNorm2d(3), (2, 3), r"InstanceNorm2d\(3, .*\(N, C, H, W\).*\(2, 3\)"),
        (nn.InstanceNorm2d(3), (2, 3, 5), r"InstanceNorm2d\(3, .*2 channels \(shape \(2, 3, 5\)"),
        (nn.InstanceNorm2d(3), (2, 3, 1, 1), r"InstanceNorm2d\(3, .*more than one spatial value"),
        (nn.Dropout2d(0.5), (4, 5), r"Dropout2d\(p=0.5\): expects \(N, C, H, W\) or \(N, C, L\)"),
        (
            nn.Upsample(scale_factor=0.1),
            (1, 1, 4, 4),
            r"Upsample\(scale_factor=0.1.*empty output.*\(1, 1, 4, 4\)",
        ),
    ],
)
def test_shape_errors_name_the_layer_and_the_shape(layer, shape, message):
    with pytest.raises(ValueError, match=message):
        layer(Tensor(np.zeros(shape)))


@pytest.mark.parametrize(
    "layer",
    [
        nn.Upsample(scale_factor=1e12),  # 8e12 x 8e12 pixels: the element count overflows int64
        nn.Upsample(scale_factor=1e12, mode="bilinear"),
        nn.Upsample(scale_factor=(1.0, 1e9)),  # fits int64, not any machine's memory
        nn.Upsample(size=(10**7, 10**7)),
    ],
    ids=["nearest", "bilinear", "one_axis", "size"],
)
def test_an_output_larger_than_memory_is_refused_before_allocating(layer):
    x = Tensor(np.ones((1, 2, 8, 8), dtype=np.float32))
    with traced_peak() as peak, pytest.raises(ValueError) as refused:
        layer(x)
    message = str(refused.value)
    assert message.startswith(f"Upsample({layer.extra_repr()})")
    assert "(input shape (1, 2, 8, 8))" in message
    assert "requested output size (" in message and "bytes of memory of device cpu" in message
    assert peak["bytes"] < 1_000_000


def test_the_output_bound_is_the_devices_memory(monkeypatch):
    """Not a limit of our own: an output is refused exactly when it cannot fit in memory."""
    monkeypatch.setattr(backend, "memory_bytes", lambda where: 4 * 2 * 64 * 64)
    x = Tensor(np.ones((1, 2, 8, 8), dtype=np.float32))
    assert nn.Upsample(scale_factor=8)(x).shape == (1, 2, 64, 64)  # exactly fits
    with pytest.raises(
        ValueError, match=r"\(1, 2, 72, 72\) \(41,472 bytes\), more than the 32,768"
    ):
        nn.Upsample(scale_factor=9)(x)
    # A path with resampling matrices counts them too.
    with pytest.raises(ValueError, match=r"bytes with its resampling matrices\), more than"):
        nn.Upsample(size=(64, 63))(x)


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: nn.AdaptiveAvgPool2d(0), r"AdaptiveAvgPool2d: output_size must be a positive"),
        (lambda: nn.AdaptiveMaxPool2d((2, 2, 2)), r"AdaptiveMaxPool2d: output_size must be"),
        (lambda: nn.AdaptiveMaxPool2d(2, return_indices=True), r"return_indices=True is not"),
        (lambda: nn.MaxPool1d(0), r"MaxPool1d: kernel_size must be a positive integer, got 0"),
        (lambda: nn.AvgPool1d(2, padding=2), r"AvgPool1d: padding 2 must be at most half"),
        (lambda: nn.GroupNorm(3, 4), r"GroupNorm: num_groups=3 must divide num_channels=4"),
        (lambda: nn.GroupNorm(0, 4), r"GroupNorm: num_groups must be a positive integer"),
        (
            lambda: nn.InstanceNorm2d(3, momentum=2.0),
            r"InstanceNorm2d: momentum must be a number in",
        ),
        (lambda: nn.Dropout2d(-0.1), r"Dropout2d: p must be a number in \[0, 1\]"),
        (lambda: nn.Upsample(), r"Upsample: give exactly one of size and scale_factor"),
        (
            lambda: nn.Upsample(size=3, recompute_scale_factor=True),
            r"Upsample: recompute_scale_factor is meaningful with scale_factor only",
        ),
        (lambda: nn.MaxPool1d(2, ceil_mode=True), r"MaxPool1d: ceil_mode=True is not supported"),
        (lambda: nn.MaxPool1d(2, dilation=2), r"MaxPool1d: dilation=2 is not supported"),
        (
            lambda: nn.AvgPool1d(2, count_include_pad=False),
            r"AvgPool1d: count_include_pad=False is not supported \(only count_include_pad=True\)",
        ),
        (lambda: nn.Upsample(size=2, scale_factor=2), r"Upsample: give exactly one of size"),
        (lambda: nn.Upsample(size=(2, 0)), r"Upsample: size must be a positive integer"),
        (lambda: nn.Upsample(scale_factor=-1.0), r"Upsample: scale_factor must be a positive"),
        (lambda: nn.Upsample(scale_factor=2, mode="cubic"), r"Upsample: mode must be 'nearest'"),
        (
            lambda: nn.Upsample(scale_factor=2, align_corners=True),
            r"Upsample: align_corners applies to mode='bilinear' only",
        ),
    ],
)
def test_bad_settings_raise_naming_the_layer_and_the_setting(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_norm_layers_start_as_identity_transforms_with_pytorchs_defaults():
    group_norm = nn.GroupNorm(2, 4)
    np.testing.assert_array_equal(group_norm.weight.numpy(), np.ones(4))
    np.testing.assert_array_equal(group_norm.bias.numpy(), np.zeros(4))
    instance_norm = nn.InstanceNorm2d(4)
    assert instance_norm.weight is None and instance_norm.bias is None
    assert list(instance_norm.state_dict()) == []
    tracked = nn.InstanceNorm2d(4, affine=True, track_running_stats=True)
    assert list(tracked.state_dict()) == [
        "weight",
        "bias",
        "running_mean",
        "running_var",
        "num_batches_tracked",
    ]


def test_instance_norm_with_momentum_none_keeps_its_running_stats_like_pytorch(torch):
    ours = nn.InstanceNorm2d(2, momentum=None, track_running_stats=True, dtype=F64)
    theirs = torch.nn.InstanceNorm2d(2, momentum=None, track_running_stats=True).double()
    values = np.random.default_rng(0).standard_normal((3, 2, 4, 4))
    ours(Tensor(values, dtype=F64))
    theirs(torch.from_numpy(values))
    for name, buffer in ours.named_buffers():
        np.testing.assert_array_equal(buffer.numpy(), dict(theirs.named_buffers())[name].numpy())


def test_dropout2d_in_training_gradient_matches_finite_differences():
    x = Tensor(np.random.default_rng(0).standard_normal((3, 4, 2, 2)), requires_grad=True)

    def run(a):
        # A fresh layer with a fixed seed draws the same mask on every call.
        return nn.Dropout2d(0.4, seed=5)(a)

    assert gradcheck(run, [x])


# PyTorch warns that it may one day read 3-d input as one (C, H, W) sample; today (and here)
# it is (N, C, L).
@pytest.mark.filterwarnings("ignore:dropout2d. Received a 3D input:UserWarning")
@pytest.mark.parametrize("shape", [(40, 50, 3, 3), (40, 50, 6)], ids=["4d", "3d"])
def test_dropout2d_drops_whole_channels_and_scales_like_pytorch(torch, shape):
    """Output and input gradient follow PyTorch's rule given each library's own mask:
    each (sample, channel) map kept and scaled by 1/(1-p), or zero; about p of them zero."""
    p = 0.3
    values = 1.0 + np.random.default_rng(0).random(shape)  # no zeros: a zero marks a drop
    upstream = np.random.default_rng(1).standard_normal(shape)
    ours = Tensor(values, requires_grad=True, dtype=F64)
    our_output = nn.Dropout2d(p, seed=0)(ours)
    our_output.backward(upstream)
    theirs = torch.tensor(values, requires_grad=True)
    torch.manual_seed(0)
    their_output = torch.nn.Dropout2d(p).train()(theirs)
    their_output.backward(torch.from_numpy(upstream))
    spatial = tuple(range(2, len(shape)))
    results = [
        (our_output.numpy(), ours.grad.numpy()),
        (their_output.detach().numpy(), theirs.grad.numpy()),
    ]
    for output, gradient in results:
        kept = np.all(output != 0, axis=spatial, keepdims=True)
        assert np.array_equal(np.any(output != 0, axis=spatial, keepdims=True), kept)
        np.testing.assert_allclose(output, np.where(kept, values / (1 - p), 0.0), rtol=1e-12)
        np.testing.assert_allclose(gradient, np.where(kept, upstream / (1 - p), 0.0), rtol=1e-12)
        assert abs((~kept).mean() - p) < 0.05


def test_functional_dropout2d_checks_its_settings_and_passes_through_when_off():
    x = Tensor(np.ones((2, 3, 4, 4)))
    assert ops.dropout2d(x, 0.5, training=False) is x
    assert ops.dropout2d(x, 0.0) is x
    with pytest.raises(ValueError, match=r"dropout2d: p must be in \[0, 1\], got 1.5"):
        ops.dropout2d(x, 1.5)
    with pytest.raises(ValueError, match=r"dropout2d: input must be \(N, C, H, W\) or \(N, C, L\)"):
        ops.dropout2d(Tensor(np.ones((2, 3))), 0.5)
    everything_dropped = ops.dropout2d(x, 1.0, rng=np.random.default_rng(0))
    np.testing.assert_array_equal(everything_dropped.numpy(), np.zeros((2, 3, 4, 4)))
