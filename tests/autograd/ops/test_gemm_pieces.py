"""Thin GEMMs in pieces (``gemm_pieces``): the same products as one ``matmul``, and convolutions
that take the pieces give the results of those that do not."""

from __future__ import annotations

import numpy as np
import pytest

from bigdl_py import backend
from bigdl_py.autograd import Tensor, ops
from bigdl_py.autograd.ops import conv, gemm_pieces


@pytest.fixture
def pieces(monkeypatch):
    """Pieces on any BLAS (the rules, not the library, are under test); count the products
    cut into pieces. float32 convolutions take the im2col route these pieces belong to,
    not oneDNN's (``conv_onednn``)."""
    monkeypatch.setenv("BIGDL_PY_ONEDNN", "0")
    calls = []
    monkeypatch.setattr(gemm_pieces, "_small_kernels_available", lambda: True)
    real = gemm_pieces.piece_width

    def counted(*args):
        width = real(*args)
        if width:
            calls.append(width)
        return width

    monkeypatch.setattr(gemm_pieces, "piece_width", counted)
    return calls


def test_piece_width_is_the_widest_aligned_width_under_the_limit():
    limit = gemm_pieces.SMALL_KERNEL_MULTIPLY_ADDS
    # (32, 288) @ (288, N): 108 columns fit, 96 is the widest multiple of 32.
    assert gemm_pieces.piece_width(32 * 288, 10_000, 64) == 96
    assert gemm_pieces.piece_width(32 * 288, 10_000, 128) == 0  # narrower than asked
    assert gemm_pieces.piece_width(25 * 6, 28_672, 1024) == 6656
    # A product that fits whole is not cut.
    assert gemm_pieces.piece_width(25 * 6, limit // (25 * 6), 1024) == 0
    assert gemm_pieces.piece_width(0, 100, 1) == 0


@pytest.mark.parametrize(
    "a_shape, b_shape",
    [
        ((6, 25), (25, 7000)),  # pieces of 6,656 and a short last one
        ((32, 288), (288, 1000)),  # thin rows: pieces of 96
        ((2, 12, 150), (2, 150, 1500)),  # two groups
    ],
)
def test_matmul_into_in_pieces_equals_one_matmul(pieces, rng, a_shape, b_shape):
    a = rng.standard_normal(a_shape).astype(np.float32)
    b = rng.standard_normal(b_shape).astype(np.float32)
    out = np.full(a_shape[:-1] + b_shape[-1:], np.nan, dtype=np.float32)
    gemm_pieces.matmul_into(a, b, out)
    assert pieces, "the product was left whole"
    np.testing.assert_allclose(out, np.matmul(a, b), rtol=1e-5, atol=1e-4)


def test_matmul_into_stays_whole_beside_other_threads_and_for_float64(pieces, rng):
    a = rng.standard_normal((6, 25)).astype(np.float32)
    b = rng.standard_normal((25, 7000)).astype(np.float32)
    out = np.empty((6, 7000), dtype=np.float32)
    gemm_pieces.matmul_into(a, b, out, threads_share_tiles=True)
    gemm_pieces.matmul_into(a.astype(np.float64), b.astype(np.float64), out.astype(np.float64))
    assert pieces == []
    np.testing.assert_allclose(out, a @ b, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize(
    "a_shape, b_shape",
    [
        ((25, 30_000), (30_000, 6)),  # 6,656 a piece, a short last one
        ((1, 27, 5000), (1, 5000, 32)),  # a group axis, as convolutions pass it
    ],
)
def test_matmul_summed_over_pieces_equals_one_matmul(pieces, rng, a_shape, b_shape):
    a = rng.standard_normal(a_shape).astype(np.float32)
    b = rng.standard_normal(b_shape).astype(np.float32)
    result = gemm_pieces.matmul_summed(a, b)
    assert pieces, "the product was left whole"
    expected = np.matmul(a.astype(np.float64), b.astype(np.float64))
    assert result.shape == expected.shape and result.dtype == np.float32
    # Only the order of the sums differs: float32 rounding of ~sqrt(K) terms.
    np.testing.assert_allclose(result, expected, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize(
    "input_shape, weight_shape, settings",
    [
        ((16, 1, 28, 28), (6, 1, 5, 5), {"padding": 2}),  # LeNet-5's first layer
        ((16, 6, 14, 14), (12, 6, 5, 5), {}),  # its second: col2im's (150, 12) product
        ((8, 3, 32, 32), (32, 3, 3, 3), {"padding": 1}),  # the CIFAR CNN's first
        ((8, 32, 16, 16), (32, 32, 3, 3), {"padding": 1, "stride": 2}),
    ],
)
def test_convolutions_in_pieces_match_those_without(
    monkeypatch, rng, input_shape, weight_shape, settings
):
    """Forward, input and weight gradients in float32, with and without pieces, against
    float64: the pieces change only rounding. (im2col's route: oneDNN's is switched off.)"""
    monkeypatch.setenv("BIGDL_PY_ONEDNN", "0")
    x = rng.standard_normal(input_shape)
    weight = rng.standard_normal(weight_shape) * 0.2
    bias = rng.standard_normal(weight_shape[0])

    def run(dtype):
        tensors = [Tensor(a, requires_grad=True, dtype=dtype) for a in (x, weight, bias)]
        output = ops.conv2d(*tensors, **settings)
        output.backward(np.random.default_rng(3).standard_normal(output.shape).astype(dtype))
        return [output.numpy()] + [t.grad.numpy() for t in tensors]

    with backend.blas_threads(1):  # column pieces are for products no other thread runs beside
        reference = run(np.float64)
        whole = run(np.float32)
        monkeypatch.setattr(gemm_pieces, "_small_kernels_available", lambda: True)
        cut = []
        real = gemm_pieces.piece_width
        monkeypatch.setattr(
            gemm_pieces, "piece_width", lambda *args: cut.append(real(*args)) or cut[-1]
        )
        in_pieces = run(np.float32)
    assert any(cut), "no product of this convolution was cut"
    names = ("output", "x", "weight", "bias")
    for name, a, b, expected in zip(names, whole, in_pieces, reference, strict=True):
        scale = np.abs(expected).max()
        assert np.abs(b - expected).max() <= 1e-5 * scale * 10, name
        assert np.abs(b - a).max() <= 1e-5 * scale * 10, name


def test_convolutions_take_the_pieces_only_when_no_other_thread_runs_tiles():
    assert conv._threads_share_tiles(threaded=True, on_gpu=False) == (conv.worker_count() > 1)
    assert not conv._threads_share_tiles(threaded=False, on_gpu=False)
    assert not conv._threads_share_tiles(threaded=True, on_gpu=True)
