"""Convolutions on oneDNN (``conv_onednn``): float32 results of the im2col route's float64
ones, in tiles shared among threads, with the routes' choice, fallback and OpenMP setting."""

from __future__ import annotations

import importlib.metadata
import multiprocessing

import numpy as np
import pytest

from bigdl_py import backend
from bigdl_py.autograd import Tensor, ops
from bigdl_py.autograd.ops import conv_onednn, onednn

needs_onednn = pytest.mark.skipif(
    not onednn.available(), reason="oneDNN's library (onednn-cpu-gomp) is not installed"
)

# (id, input shape, weight shape, settings)
CASES = [
    ("padded_3x3", (3, 3, 9, 9), (4, 3, 3, 3), {"padding": 1}),
    (
        "strided_dilated_groups",
        (2, 4, 10, 7),
        (6, 2, 3, 2),
        {"stride": (2, 1), "padding": (1, 0), "dilation": (1, 2), "groups": 2},
    ),
    ("depthwise", (3, 8, 6, 6), (8, 1, 3, 3), {"padding": 1, "groups": 8}),
    # PyTorch's floor leaves the last column and row unread: oneDNN's padding after is -1.
    ("one_by_one_stride2_unread_edge", (2, 3, 6, 6), (5, 3, 1, 1), {"stride": 2}),
    ("stride3_padding2", (1, 2, 7, 8), (3, 2, 3, 3), {"stride": 3, "padding": 2}),
    ("lenet_first_layer", (5, 1, 28, 28), (6, 1, 5, 5), {}),
]


def gradients(x, weight, bias, settings, needs=(True, True, True), seed=7, op=ops.conv2d):
    """Output and the gradients asked for, for a fixed random output gradient."""
    tx = Tensor(x, requires_grad=needs[0])
    tw = Tensor(weight, requires_grad=needs[1])
    tb = None if bias is None else Tensor(bias, requires_grad=needs[2])
    output = op(tx, tw, tb, **settings)
    grad = np.random.default_rng(seed).standard_normal(output.shape).astype(x.dtype)
    output.backward(Tensor(grad))
    results = {"output": output.data}
    for name, tensor in (("x", tx), ("weight", tw), ("bias", tb)):
        if tensor is not None and tensor.requires_grad:
            results[name] = tensor.grad.data
    return results


def assert_close_to_float64(got, want):
    assert got.keys() == want.keys()
    for name in want:
        assert got[name].dtype == np.float32, name
        scale = np.abs(want[name]).max() + 1e-30
        error = np.abs(got[name] - want[name]).max() / scale
        assert error < 2e-6, f"{name}: relative error {error:.2e}"


@pytest.fixture
def onednn_calls(monkeypatch):
    """Count the tiles the oneDNN route runs (forward and backward)."""
    calls = []
    for method in ("forward", "weight_gradient", "input_gradient"):
        real = getattr(conv_onednn._Convolution, method)

        def counted(self, *args, _real=real, _method=method):
            calls.append((_method, self.x_shape[0]))
            return _real(self, *args)

        monkeypatch.setattr(conv_onednn._Convolution, method, counted)
    return calls


def random_case(rng, input_shape, weight_shape, with_bias=True):
    x = rng.standard_normal(input_shape)
    weight = rng.standard_normal(weight_shape)
    bias = rng.standard_normal(weight_shape[0]) if with_bias else None
    return x, weight, bias


def as_float32(*arrays):
    return [None if a is None else a.astype(np.float32) for a in arrays]


@needs_onednn
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize(
    "input_shape, weight_shape, settings",
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_float32_results_match_the_float64_im2col_route(
    rng, onednn_calls, input_shape, weight_shape, settings, with_bias
):
    x, weight, bias = random_case(rng, input_shape, weight_shape, with_bias)
    want = gradients(x, weight, bias, settings)  # float64: always im2col
    assert not onednn_calls
    got = gradients(*as_float32(x, weight, bias), settings)
    assert {name for name, _ in onednn_calls} == {"forward", "weight_gradient", "input_gradient"}
    assert_close_to_float64(got, want)


# (id, input shape, weight shape (C_in, C_out/g, KH, KW), settings)
TRANSPOSED_CASES = [
    ("dcgan_upsampling", (3, 8, 4, 4), (8, 4, 4, 4), {"stride": 2, "padding": 1}),
    (
        "output_padding",
        (2, 4, 5, 3),
        (4, 3, 3, 3),
        {"stride": 2, "padding": 1, "output_padding": 1},
    ),
    ("groups_dilation", (2, 4, 4, 5), (4, 2, 3, 2), {"groups": 2, "dilation": (2, 1)}),
    (
        "output_padding_beyond_padding",
        (2, 3, 4, 4),
        (3, 2, 3, 3),
        {"stride": 3, "output_padding": 2},
    ),
]


@needs_onednn
@pytest.mark.parametrize(
    "input_shape, weight_shape, settings",
    [case[1:] for case in TRANSPOSED_CASES],
    ids=[case[0] for case in TRANSPOSED_CASES],
)
def test_transposed_convolutions_match_the_float64_im2col_route(
    rng, onednn_calls, input_shape, weight_shape, settings
):
    x, weight, _ = random_case(rng, input_shape, weight_shape, with_bias=False)
    bias = rng.standard_normal(weight_shape[1] * settings.get("groups", 1))
    op = ops.conv_transpose2d
    want = gradients(x, weight, bias, settings, op=op)
    assert not onednn_calls
    got = gradients(*as_float32(x, weight, bias), settings, op=op)
    # forward: conv2d's input gradient; input gradient: conv2d; weight gradient: conv2d's
    assert {name for name, _ in onednn_calls} == {"forward", "weight_gradient", "input_gradient"}
    assert_close_to_float64(got, want)


@needs_onednn
@pytest.mark.parametrize("batch", [8, 7], ids=["even", "odd"])
def test_tiles_shared_between_two_threads_sum_the_weight_gradient(
    rng, onednn_calls, monkeypatch, batch
):
    # Each primitive runs in whichever thread takes its tile, both threads at once: with
    # oneDNN's own scratch space that once gave a wrong bias gradient (a full test run,
    # 2026-11-25), so the primitives take per-thread scratch space from us. Ten rounds,
    # each with fresh geometries for some, give the threads many chances to collide.
    monkeypatch.setattr(conv_onednn, "MIN_THREADED_MULTIPLY_ADDS", 0)
    for channels in range(4, 14):
        onednn_calls.clear()
        x, weight, bias = random_case(rng, (batch, channels, 8, 8), (6, channels, 3, 3))
        settings = {"padding": 1}
        want = gradients(x, weight, bias, settings)
        with backend.blas_threads(2):
            got = gradients(*as_float32(x, weight, bias), settings)
        # One tile per thread: 4 + 4 samples, or 4 + 3.
        assert sorted(size for name, size in onednn_calls if name == "forward") == sorted(
            [-(-batch // 2), batch - -(-batch // 2)]
        )
        assert_close_to_float64(got, want)


@needs_onednn
@pytest.mark.parametrize(
    "needs",
    [(False, True, True), (True, False, False), (False, False, True)],
    ids=["no_input_gradient", "input_gradient_only", "bias_gradient_only"],
)
def test_only_the_gradients_asked_for_are_given(rng, needs):
    x, weight, bias = random_case(rng, (3, 3, 7, 7), (4, 3, 3, 3))
    want = gradients(x, weight, bias, {"padding": 1}, needs)
    got = gradients(*as_float32(x, weight, bias), {"padding": 1}, needs)
    assert_close_to_float64(got, want)


@needs_onednn
def test_a_non_contiguous_input_gives_its_copys_result(rng):
    x = rng.standard_normal((6, 6, 3, 2)).astype(np.float32).transpose(3, 2, 0, 1)
    weight = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    got = ops.conv2d(Tensor(x), Tensor(weight), padding=1).data
    want = ops.conv2d(Tensor(np.ascontiguousarray(x)), Tensor(weight), padding=1).data
    np.testing.assert_array_equal(got, want)


@needs_onednn
def test_matches_torch_on_a_cifar_layer(torch, rng):
    x, weight, bias = as_float32(*random_case(rng, (8, 32, 16, 16), (64, 32, 3, 3)))
    got = gradients(x, weight, bias, {"padding": 1})
    tx, tw, tb = (torch.tensor(a, requires_grad=True) for a in (x, weight, bias))
    output = torch.nn.functional.conv2d(tx, tw, tb, padding=1)
    grad = np.random.default_rng(7).standard_normal(output.shape).astype(np.float32)
    output.backward(torch.from_numpy(grad))
    want = {"output": output.detach(), "x": tx.grad, "weight": tw.grad, "bias": tb.grad}
    for name, value in want.items():
        expected = value.numpy()
        error = np.abs(got[name] - expected).max() / np.abs(expected).max()
        assert error < 1e-5, f"{name}: relative error {error:.2e}"


def test_float64_float16_and_non_numpy_operands_keep_to_im2col():
    x = np.zeros((1, 1, 3, 3), dtype=np.float32)
    assert not onednn.applies_to(x.astype(np.float64), x)
    assert not onednn.applies_to(x.astype(np.float16), x)
    assert not onednn.applies_to(x, [[1.0]])


@needs_onednn
def test_the_switch_turns_the_route_off(rng, onednn_calls, monkeypatch):
    monkeypatch.setenv(onednn.SWITCH_VARIABLE, "0")
    x, weight, bias = as_float32(*random_case(rng, (2, 3, 5, 5), (4, 3, 3, 3)))
    gradients(x, weight, bias, {})
    assert not onednn_calls


@needs_onednn
def test_a_geometry_onednn_declines_takes_im2col_and_is_remembered(rng, monkeypatch):
    made = []

    def decline(self, *args):
        made.append(args)
        onednn.PrimitiveSet.__init__(self, onednn.loaded())
        raise onednn.OneDNNError("oneDNN: no kernel (test)")

    monkeypatch.setattr(conv_onednn._Convolution, "__init__", decline)
    monkeypatch.setattr(conv_onednn, "_geometries", {})
    x, weight, bias = random_case(rng, (2, 3, 6, 5), (4, 3, 2, 2))
    want = gradients(x, weight, bias, {"stride": 2})
    for _ in range(2):
        got = gradients(*as_float32(x, weight, bias), {"stride": 2})
        assert_close_to_float64(got, want)
    assert len(made) == 1  # declined once, then looked up


@needs_onednn
def test_a_geometry_without_gradient_kernels_takes_im2col_for_the_backward(
    rng, onednn_calls, monkeypatch
):
    def decline(self):
        raise onednn.OneDNNError("oneDNN: no gradient kernel (test)")

    monkeypatch.setattr(conv_onednn._Convolution, "make_backward", decline)
    x, weight, bias = random_case(rng, (2, 3, 6, 6), (4, 3, 3, 3))
    want = gradients(x, weight, bias, {"padding": 1})
    got = gradients(*as_float32(x, weight, bias), {"padding": 1})
    assert [name for name, _ in onednn_calls] == ["forward"]
    assert_close_to_float64(got, want)


@needs_onednn
def test_the_callers_openmp_setting_is_restored(rng):
    gomp = onednn.loaded().gomp
    gomp.omp_set_num_threads(3)
    try:
        x, weight, bias = as_float32(*random_case(rng, (2, 3, 5, 5), (4, 3, 3, 3)))
        gradients(x, weight, bias, {})
        assert gomp.omp_get_max_threads() == 3
    finally:
        gomp.omp_set_num_threads(backend.cpu_count())


def _child_convolution(x, weight, queue):
    queue.put(ops.conv2d(Tensor(x), Tensor(weight), padding=1).data.sum())


@needs_onednn
@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="needs fork")
def test_a_forked_child_convolves_after_its_parent_did_on_two_threads(rng, monkeypatch):
    # libgomp hangs a forked child's first team if the parent ran one; the route runs none.
    monkeypatch.setattr(conv_onednn, "MIN_THREADED_MULTIPLY_ADDS", 0)
    x, weight, _ = as_float32(*random_case(rng, (4, 3, 8, 8), (4, 3, 3, 3), with_bias=False))
    with backend.blas_threads(2):
        expected = ops.conv2d(Tensor(x), Tensor(weight), padding=1).data.sum()
        context = multiprocessing.get_context("fork")
        queue = context.Queue()
        child = context.Process(target=_child_convolution, args=(x, weight, queue))
        child.start()
        child.join(timeout=60)
    assert child.exitcode == 0, "the forked child did not finish its convolution"
    assert queue.get(timeout=5) == pytest.approx(expected, rel=1e-6)


def test_the_library_loads_where_its_wheel_is_installed():
    try:
        importlib.metadata.distribution("onednn-cpu-gomp")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("onednn-cpu-gomp is not installed")
    assert onednn.loaded() is not None
    names = conv_onednn.implementations((4, 16, 8, 8), (16, 16, 3, 3), padding=(1, 1))
    assert set(names) == {"forward", "input_gradient", "weight_gradient"}
    assert all(names.values())
