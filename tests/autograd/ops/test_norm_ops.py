"""batch_norm and layer_norm: gradients, running statistics, PyTorch parity, errors."""

from __future__ import annotations

import numpy as np
import pytest

from bigdl_py.autograd import Tensor, gradcheck, ops

SHAPES = [(4, 3), (3, 3, 5), (2, 3, 3, 2)]
SHAPE_IDS = ["2d", "3d", "4d"]


def _running_stats(rng, channels=3):
    return rng.standard_normal(channels), 0.5 + rng.random(channels)


@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_batch_norm_gradients(make_tensor, rng, shape, training):
    running_mean, running_var = _running_stats(rng)
    inputs = [make_tensor(*shape), make_tensor(3), make_tensor(3)]

    def normalize(x, weight, bias):
        return ops.batch_norm(
            x, running_mean.copy(), running_var.copy(), weight, bias, training=training
        )

    assert gradcheck(normalize, inputs)


@pytest.mark.parametrize("affine", ["none", "weight_only", "bias_only"])
def test_batch_norm_gradients_with_partial_affine(make_tensor, affine):
    x, scale = make_tensor(4, 3, 2), make_tensor(3)

    def normalize(a, parameter):
        weight = parameter if affine == "weight_only" else None
        bias = parameter if affine == "bias_only" else None
        result = ops.batch_norm(a, None, None, weight, bias, training=True)
        return result * parameter.reshape(3, 1) if affine == "none" else result

    assert gradcheck(normalize, [x, scale])


@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_batch_norm_matches_torch_including_running_statistics(
    torch, compare_with_torch, rng, shape, training
):
    running_mean, running_var = _running_stats(rng)
    ours_mean, ours_var = running_mean.copy(), running_var.copy()
    theirs_mean, theirs_var = torch.tensor(running_mean), torch.tensor(running_var)
    arrays = [rng.standard_normal(shape), rng.standard_normal(3), rng.standard_normal(3)]
    compare_with_torch(
        lambda x, w, b: ops.batch_norm(x, ours_mean, ours_var, w, b, training, 0.3, 1e-4),
        lambda x, w, b: torch.nn.functional.batch_norm(
            x, theirs_mean, theirs_var, w, b, training, 0.3, 1e-4
        ),
        arrays,
    )
    np.testing.assert_allclose(ours_mean, theirs_mean.numpy(), rtol=1e-5)
    np.testing.assert_allclose(ours_var, theirs_var.numpy(), rtol=1e-5)


def test_batch_norm_updates_tensor_buffers_in_place(rng):
    running_mean = Tensor(np.zeros(3), dtype=np.float32)
    running_var = Tensor(np.ones(3), dtype=np.float32)
    mean_array, var_array = running_mean.data, running_var.data
    values = rng.standard_normal((8, 3)).astype(np.float32)
    ops.batch_norm(Tensor(values), running_mean, running_var, momentum=0.1)
    assert running_mean.data is mean_array and running_var.data is var_array
    np.testing.assert_allclose(mean_array, 0.1 * values.mean(axis=0), rtol=1e-5)
    np.testing.assert_allclose(var_array, 0.9 + 0.1 * values.var(axis=0, ddof=1), rtol=1e-5)


def test_batch_norm_in_eval_uses_the_running_statistics_only(rng):
    running_mean, running_var = _running_stats(rng)
    values = rng.standard_normal((5, 3))
    output = ops.batch_norm(
        Tensor(values, dtype=np.float64), running_mean, running_var, training=False, eps=0.0
    )
    np.testing.assert_allclose(output.numpy(), (values - running_mean) / np.sqrt(running_var))


@pytest.mark.parametrize(
    "call, message",
    [
        (
            lambda: ops.batch_norm(Tensor(np.zeros((1, 3))), None, None),
            r"batch_norm: training needs more than one value per channel, got input of shape "
            r"\(1, 3\)",
        ),
        (
            lambda: ops.batch_norm(Tensor(np.zeros((4, 3))), np.zeros(2), np.ones(2)),
            r"batch_norm: running_mean must have shape \(3,\) for input of shape \(4, 3\), got "
            r"\(2,\)",
        ),
        (
            lambda: ops.batch_norm(Tensor(np.zeros((4, 3))), None, None, training=False),
            r"batch_norm: evaluation \(training=False\) needs running_mean and running_var",
        ),
        (
            lambda: ops.batch_norm(Tensor(np.zeros(4)), None, None),
            r"batch_norm: input must be at least 2-d",
        ),
        (
            lambda: ops.layer_norm(Tensor(np.zeros((2, 3))), 4),
            r"layer_norm: normalized_shape \(4,\) does not match the trailing axes of input "
            r"shape \(2, 3\)",
        ),
        (
            lambda: ops.layer_norm(Tensor(np.zeros((2, 3))), 3, Tensor(np.ones(2))),
            r"layer_norm: weight must have shape \(3,\), got \(2,\)",
        ),
    ],
)
def test_normalization_errors(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.parametrize(
    "input_shape, normalized_shape", [((3, 4), 4), ((2, 3, 4), (3, 4)), ((2, 2, 3), (3,))]
)
def test_layer_norm_gradients(make_tensor, input_shape, normalized_shape):
    affine_shape = (normalized_shape,) if isinstance(normalized_shape, int) else normalized_shape
    inputs = [make_tensor(*input_shape), make_tensor(*affine_shape), make_tensor(*affine_shape)]
    assert gradcheck(lambda x, w, b: ops.layer_norm(x, normalized_shape, w, b), inputs)


def test_layer_norm_gradient_without_affine(make_tensor):
    assert gradcheck(lambda x: ops.layer_norm(x, 5), [make_tensor(3, 5)])


@pytest.mark.parametrize("input_shape, normalized_shape", [((4, 6), (6,)), ((2, 3, 4), (3, 4))])
def test_layer_norm_matches_torch(torch, compare_with_torch, rng, input_shape, normalized_shape):
    arrays = [
        rng.standard_normal(input_shape),
        rng.standard_normal(normalized_shape),
        rng.standard_normal(normalized_shape),
    ]
    compare_with_torch(
        lambda x, w, b: ops.layer_norm(x, normalized_shape, w, b, eps=1e-3),
        lambda x, w, b: torch.nn.functional.layer_norm(x, normalized_shape, w, b, eps=1e-3),
        arrays,
    )


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_batch_norm_split_over_threads_matches_one_block_and_float64(
    monkeypatch, rng, training, tile_calls
):
    # Above MIN_SPLIT_BYTES the channels are split, one block per BLAS thread; each channel's
    # numbers must not depend on the split (and short rows take the einsum route: width 4).
    from bigdl_py import backend
    from bigdl_py.autograd.ops import norm

    monkeypatch.setattr(norm, "MIN_SPLIT_BYTES", 0)
    blocks = tile_calls(norm, "size")
    arrays = [
        rng.standard_normal((6, 5, 8, 4)).astype(np.float32) * 3 + 1,
        rng.standard_normal(5).astype(np.float32),
        rng.standard_normal(5).astype(np.float32),
        rng.standard_normal((6, 5, 8, 4)).astype(np.float32),
    ]

    def run(dtype):
        x, weight, bias = (Tensor(a.astype(dtype), requires_grad=True) for a in arrays[:3])
        running = (np.zeros(5, dtype), np.ones(5, dtype))
        output = ops.batch_norm(x, *running, weight, bias, training=training)
        (output * Tensor(arrays[3].astype(dtype))).sum().backward()
        return [output.numpy(), x.grad.numpy(), weight.grad.numpy(), bias.grad.numpy(), *running]

    with backend.blas_threads(1):
        reference = run(np.float64)
        whole = run(np.float32)
    with backend.blas_threads(2):
        split = run(np.float32)
    assert blocks == [5, 5] * 2 + [3, 3]  # forward, backward at one thread; then at two
    for got, want, exact in zip(split, whole, reference, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(got, exact, rtol=1e-4, atol=1e-4)
