"""Gradient clipping: element-wise, and global-norm in two phases over slices."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bigdl_py.optim import ConstantClipping, L2NormClipping, all_slice_bounds


def test_constant_clipping_is_element_wise_and_in_place(rng):
    gradient = rng.standard_normal(50) * 3
    expected = np.clip(gradient, -1.5, 0.5)
    clipping = ConstantClipping(-1.5, 0.5)
    pieces = [gradient[lo:hi] for lo, hi in all_slice_bounds(50, 4)]
    for piece in pieces:  # slice by slice, in place, equals clipping the whole vector
        assert clipping.clip_(piece) is piece
    np.testing.assert_array_equal(gradient, expected)
    assert not clipping.is_global


def test_constant_clipping_refuses_inverted_bounds():
    with pytest.raises(ValueError, match="min_value must be <= max_value"):
        ConstantClipping(1.0, -1.0)


@pytest.mark.parametrize("max_norm", [0.5, 3.0, 1e3])
def test_l2_norm_clipping_matches_torch_clip_grad_norm(max_norm, torch, rng):
    gradient = rng.standard_normal(40)
    tensors = [torch.zeros(n, dtype=torch.float64, requires_grad=True) for n in (10, 25, 5)]
    for tensor, piece in zip(tensors, np.split(gradient, [10, 35]), strict=True):
        tensor.grad = torch.tensor(piece.copy())
    torch_norm = torch.nn.utils.clip_grad_norm_(tensors, max_norm)
    norm = L2NormClipping(max_norm).clip_(gradient)
    assert norm == pytest.approx(float(torch_norm), rel=1e-12)
    expected = np.concatenate([tensor.grad.numpy() for tensor in tensors])
    np.testing.assert_allclose(gradient, expected, rtol=1e-12)


@pytest.mark.parametrize("count", [1, 2, 3, 7, 60])
def test_global_norm_from_slice_sums_equals_whole_vector_clipping(count, rng):
    whole = rng.standard_normal(45) * 2
    sliced = whole.copy()
    clipping = L2NormClipping(max_norm=1.0)
    clipping.clip_(whole)
    bounds = all_slice_bounds(45, count)
    # Phase 1 on every partition, one all-reduce of scalars, phase 2 on every partition.
    total = sum(clipping.sum_of_squares(sliced[lo:hi]) for lo, hi in bounds)
    for lo, hi in bounds:
        clipping.clip_slice_(sliced[lo:hi], total)
    np.testing.assert_allclose(sliced, whole, rtol=1e-13)
    assert np.linalg.norm(sliced) == pytest.approx(1.0, rel=1e-5)
    assert clipping.is_global


def test_small_gradients_are_left_exactly_alone(rng):
    gradient = rng.standard_normal(10) * 1e-3
    before = gradient.copy()
    L2NormClipping(max_norm=1.0).clip_(gradient)
    np.testing.assert_array_equal(gradient, before)


def test_half_precision_sum_of_squares_does_not_overflow():
    gradient = np.full(4, 300.0, dtype=np.float16)  # 300**2 is past float16's largest value
    assert L2NormClipping.sum_of_squares(gradient) == pytest.approx(4 * 300.0**2)


def test_non_finite_norms():
    strict = L2NormClipping(1.0, error_if_nonfinite=True)
    with pytest.raises(FloatingPointError, match="norm is inf"):
        strict.scale_for(math.inf)
    lenient = L2NormClipping(1.0)
    assert lenient.scale_for(math.inf) == 0.0  # as torch: max_norm / (inf + 1e-6)
    assert math.isnan(lenient.scale_for(math.nan))


def test_max_norm_must_be_positive():
    with pytest.raises(ValueError, match="max_norm must be > 0, got 0"):
        L2NormClipping(0)


@pytest.mark.gpu
def test_clipping_on_gpu_equals_cpu(rng):
    from bigdl_py import backend

    if not backend.cuda_available():
        pytest.skip("needs CuPy and a CUDA device")
    gradient = rng.standard_normal(100) * 3
    on_device = backend.to_device(gradient, "cuda")
    ConstantClipping(-2.0, 2.0).clip_(gradient)
    ConstantClipping(-2.0, 2.0).clip_(on_device)
    assert L2NormClipping(1.0).clip_(on_device) == pytest.approx(
        L2NormClipping(1.0).clip_(gradient)
    )
    np.testing.assert_allclose(backend.as_numpy(on_device), gradient, rtol=1e-12)


@pytest.mark.parametrize("max_norm", [0.5, 1e6])
def test_l2_clipping_on_a_device_keeps_the_norm_there_and_clips_as_on_the_host(max_norm, rng):
    from bigdl_py import backend, device_waits

    host = rng.standard_normal(500).astype(np.float32)
    device = backend.to_device(host, "strict")
    clipping = L2NormClipping(max_norm)
    with device_waits.no_device_waits():  # as in a training step: nothing is read back
        norm = clipping.clip_(device)
    expected_norm = clipping.clip_(host)
    np.testing.assert_allclose(backend.as_numpy(device), host, rtol=1e-6)
    assert float(norm) == pytest.approx(expected_norm, rel=1e-6)


def test_a_nonfinite_norm_on_a_device_is_reported_at_the_next_sync_point():
    from bigdl_py import backend, device_waits

    device = backend.to_device(np.array([1.0, np.inf], dtype=np.float32), "strict")
    with device_waits.no_device_waits():
        L2NormClipping(1.0, error_if_nonfinite=True).clip_(device)
        with pytest.raises(FloatingPointError, match="gradient norm is inf"):
            device_waits.raise_deferred_checks()
