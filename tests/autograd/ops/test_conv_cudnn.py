"""Convolutions on cuDNN (``conv_cudnn``) and the one place that picks a library route
(``conv_routes``).

Without a GPU: the geometry handed to cuDNN (operand shapes, padding, strides, dilation,
accumulation and scaling types, pointer alignment, TF32), the engine filter, the route
choice, and the roles of each direction: ``conv_cudnn.forward``/``backward`` run on NumPy
float64 with a stand-in plan that computes its direction with the im2col functions, and
must give conv2d's and conv_transpose2d's results, bias and skipped gradients included, on
geometries whose shapes cuDNN would check (:class:`ReferencePlan` asserts them).

With a GPU (``gpu``): the cuDNN route against the CuPy im2col route (``BIGDL_PY_CUDNN=0``)
and NumPy float64, checked to have run, and a forward captured in a CUDA graph.
"""

from __future__ import annotations

import numpy as np
import pytest

from bigdl_py import backend
from bigdl_py.autograd import Tensor, ops
from bigdl_py.autograd.ops import conv, conv_cudnn, conv_onednn, conv_routes, cudnn, onednn
from bigdl_py.autograd.ops.conv_cudnn import Geometry, make_geometry

# --- the geometry cuDNN is given ---------------------------------------------------------------


def _geometry(dtype="float32", tf32=False, padding=(1, 2), stride=(2, 1), dilation=(1, 3)):
    return Geometry(
        (4, 6, 9, 11), (8, 3, 3, 2), (4, 8, 5, 10), stride, padding, dilation,
        np.dtype(dtype).str, tf32, 16,
    )  # fmt: skip


def test_the_convolution_descriptor_carries_pytorch_settings():
    attributes = {name: values for name, _, values in _geometry().convolution_attributes()}
    assert attributes[cudnn.CUDNN_ATTR_CONVOLUTION_CONV_MODE] == [cudnn.CUDNN_CROSS_CORRELATION]
    assert attributes[cudnn.CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS] == [2]
    assert attributes[cudnn.CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES] == [2, 1]
    assert attributes[cudnn.CUDNN_ATTR_CONVOLUTION_DILATIONS] == [1, 3]  # PyTorch's counting
    assert attributes[cudnn.CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS] == [1, 2]
    assert attributes[cudnn.CUDNN_ATTR_CONVOLUTION_POST_PADDINGS] == [1, 2]
    assert attributes[cudnn.CUDNN_ATTR_CONVOLUTION_COMP_TYPE] == [cudnn.CUDNN_DATA_FLOAT]


@pytest.mark.parametrize(
    ("dtype", "accumulation", "scaling"),
    [
        ("float16", cudnn.CUDNN_DATA_FLOAT, cudnn.CUDNN_TYPE_FLOAT),
        ("float32", cudnn.CUDNN_DATA_FLOAT, cudnn.CUDNN_TYPE_FLOAT),
        ("float64", cudnn.CUDNN_DATA_DOUBLE, cudnn.CUDNN_TYPE_DOUBLE),
    ],
)
def test_accumulation_and_scaling_types_follow_the_dtype(dtype, accumulation, scaling):
    geometry = _geometry(dtype)
    attributes = {name: values for name, _, values in geometry.convolution_attributes()}
    assert attributes[cudnn.CUDNN_ATTR_CONVOLUTION_COMP_TYPE] == [accumulation]
    assert geometry.scaling_type() == scaling


def test_alignment_is_the_largest_power_of_two_every_pointer_keeps():
    assert conv_cudnn.alignment([512, 1024, 4096], 4) == 16
    assert conv_cudnn.alignment([512, 1032, 4096], 4) == 8
    assert conv_cudnn.alignment([512, 1028], 4) == 4
    assert conv_cudnn.alignment([6], 2) == 2
    assert conv_cudnn.alignment([8], 8) == 8


def test_make_geometry_takes_tf32_only_for_float32(monkeypatch):
    monkeypatch.setattr(backend, "_tf32", {"matmul": False, "cudnn": True})
    shapes = ((1, 2, 5, 5), (3, 2, 3, 3), (1, 3, 3, 3), (1, 1), (0, 0), (1, 1))
    assert make_geometry(*shapes, np.float32, [256]).tf32
    assert not make_geometry(*shapes, np.float64, [256]).tf32
    backend.allow_tf32(cudnn=False)
    float32 = make_geometry(*shapes, np.float32, [256])
    assert not float32.tf32 and float32.alignment == 16 and float32.dtype == "<f4"


@pytest.mark.parametrize(
    ("notes", "dtype", "tf32", "usable"),
    [
        ([], "float32", False, True),
        ([cudnn.CUDNN_NUMERICAL_NOTE_TENSOR_CORE], "float32", False, False),
        ([cudnn.CUDNN_NUMERICAL_NOTE_TENSOR_CORE], "float32", True, True),
        ([cudnn.CUDNN_NUMERICAL_NOTE_TENSOR_CORE], "float16", False, True),
        ([cudnn.CUDNN_NUMERICAL_NOTE_TENSOR_CORE], "float64", False, True),
        ([cudnn.CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS], "float32", True, False),
        ([cudnn.CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS], "float16", True, False),
    ],
)
def test_engines_that_break_the_precision_asked_for_are_skipped(notes, dtype, tf32, usable):
    assert conv_cudnn.usable_engine(notes, dtype, tf32) is usable


# --- which route -----------------------------------------------------------------------------


class FakeDeviceArray:
    """Looks like a CuPy array to ``backend.is_cupy_array`` (its module's name)."""

    __module__ = "cupy.fake"

    def __init__(self, dtype):
        self.dtype = np.dtype(dtype)


def test_numpy_operands_take_onednn_or_im2col():
    x, weight = np.ones((1, 2, 4, 4), np.float32), np.ones((2, 2, 3, 3), np.float32)
    expected = conv_onednn if onednn.available() else None
    assert conv_routes.library_route(x, weight, None) is expected
    assert conv_routes.library_route(x.astype(np.float64), weight.astype(np.float64)) is None


def test_cupy_operands_take_cudnn_where_it_loads(monkeypatch):
    monkeypatch.setattr(cudnn, "loaded", lambda: object())
    monkeypatch.delenv(cudnn.SWITCH_VARIABLE, raising=False)
    float32 = FakeDeviceArray(np.float32)
    assert conv_routes.library_route(float32, float32, None) is conv_cudnn
    assert conv_routes.library_route(FakeDeviceArray(np.float16), FakeDeviceArray(np.float16))
    # mixed dtypes, integer operands, no operand at all: no library route
    assert conv_routes.library_route(float32, FakeDeviceArray(np.float64)) is None
    assert conv_routes.library_route(FakeDeviceArray(np.int32)) is None
    assert not cudnn.applies_to(None, None)
    monkeypatch.setenv(cudnn.SWITCH_VARIABLE, "0")
    assert conv_routes.library_route(float32, float32, None) is None


def test_without_the_library_cupy_operands_take_im2col(monkeypatch):
    monkeypatch.setattr(cudnn, "loaded", lambda: None)
    assert conv_routes.library_route(FakeDeviceArray(np.float32)) is None


# --- each direction's roles, on a stand-in plan ------------------------------------------------


class ReferencePlan:
    """Computes a direction of a :class:`Geometry` with the im2col functions, after
    checking the shapes are ones cuDNN's graph would accept."""

    runs: list = []

    def __init__(self, direction: str, geometry: Geometry):
        self.direction, self.geometry = direction, geometry
        x, weight, y = geometry.x_shape, geometry.weight_shape, geometry.y_shape
        assert x[1] % weight[1] == 0 and weight[0] % (x[1] // weight[1]) == 0
        assert (y[0], y[1]) == (x[0], weight[0])
        for axis in (0, 1):  # the output is the floor formula's, padding on both sides
            assert y[2 + axis] == conv.output_size(
                x[2 + axis],
                weight[2 + axis],
                geometry.stride[axis],
                geometry.padding[axis],
                geometry.dilation[axis],
            )

    def run(self, x, weight, y):
        g = self.geometry
        groups = g.x_shape[1] // g.weight_shape[1]
        padded_hw = tuple(g.x_shape[2 + a] + 2 * g.padding[a] for a in (0, 1))
        if self.direction == "forward":
            y[...] = conv.convolve(x, weight, g.stride, g.padding, padded_hw, g.dilation, groups)
        elif self.direction == "input_gradient":
            settings = (g.stride, g.padding, g.dilation, groups)
            x[...] = conv.transposed_convolution(y, weight, settings, g.x_shape[2:])
        else:
            weight[...], _ = conv.convolution_weight_gradient(
                x, y, g.weight_shape, g.stride, g.padding, padded_hw, g.dilation, groups
            )
        ReferencePlan.runs.append(self.direction)


@pytest.fixture
def reference_cudnn(monkeypatch):
    """conv_cudnn on NumPy operands, its plans computed by :class:`ReferencePlan`."""
    ReferencePlan.runs = []
    monkeypatch.setattr(conv_cudnn, "_address", lambda array: array.ctypes.data)
    monkeypatch.setattr(conv_cudnn, "_plan", ReferencePlan)
    monkeypatch.setattr(
        conv_routes, "library_route", lambda *arrays: conv_cudnn
    )  # every op now takes the cuDNN route
    return ReferencePlan.runs


def _im2col(monkeypatch):
    monkeypatch.setattr(conv_routes, "library_route", lambda *arrays: None)


GEOMETRIES = [
    # input, weight, stride, padding, dilation, groups
    ((2, 4, 9, 8), (6, 4, 3, 3), 1, 1, 1, 1),
    ((3, 4, 11, 10), (6, 2, 3, 2), (2, 3), (1, 0), (2, 1), 2),
    ((1, 3, 7, 7), (3, 1, 5, 5), 2, 2, 1, 3),
    ((2, 2, 1, 17), (5, 2, 1, 4), 3, (0, 1), 2, 1),  # a Conv1d as conv2d sees it
]


def _conv2d_results(x, weight, bias, settings):
    stride, padding, dilation, groups = settings
    x_tensor = Tensor(x, requires_grad=True)
    w_tensor = Tensor(weight, requires_grad=True)
    b_tensor = Tensor(bias, requires_grad=True)
    out = ops.conv2d(x_tensor, w_tensor, b_tensor, stride, padding, dilation, groups)
    upstream = np.random.default_rng(3).standard_normal(out.shape)
    (out * Tensor(upstream)).sum().backward()
    return [out.numpy(), x_tensor.grad.numpy(), w_tensor.grad.numpy(), b_tensor.grad.numpy()]


@pytest.mark.parametrize(("x_shape", "w_shape", *"spdg"), GEOMETRIES)
def test_conv2d_directions_have_the_roles_of_im2col(
    monkeypatch, reference_cudnn, x_shape, w_shape, s, p, d, g
):
    rng = np.random.default_rng(0)
    x, weight = rng.standard_normal(x_shape), rng.standard_normal(w_shape)
    bias = rng.standard_normal(w_shape[0])
    through_cudnn = _conv2d_results(x, weight, bias, (s, p, d, g))
    assert sorted(reference_cudnn) == ["forward", "input_gradient", "weight_gradient"]
    _im2col(monkeypatch)
    for got, want in zip(
        through_cudnn, _conv2d_results(x, weight, bias, (s, p, d, g)), strict=True
    ):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_conv1d_runs_on_the_route(reference_cudnn):
    rng = np.random.default_rng(1)
    x = Tensor(rng.standard_normal((2, 3, 12)), requires_grad=True)
    weight = Tensor(rng.standard_normal((4, 3, 3)), requires_grad=True)
    out = ops.conv1d(x, weight, None, stride=2, padding=1)
    out.sum().backward()
    assert out.shape == (2, 4, 6)
    assert sorted(reference_cudnn) == ["forward", "input_gradient", "weight_gradient"]


def _transposed_results(x, weight, bias, settings):
    stride, padding, output_padding, groups, dilation = settings
    x_tensor = Tensor(x, requires_grad=True)
    w_tensor = Tensor(weight, requires_grad=True)
    b_tensor = Tensor(bias, requires_grad=True)
    out = ops.conv_transpose2d(
        x_tensor, w_tensor, b_tensor, stride, padding, output_padding, groups, dilation
    )
    upstream = np.random.default_rng(4).standard_normal(out.shape)
    (out * Tensor(upstream)).sum().backward()
    return [out.numpy(), x_tensor.grad.numpy(), w_tensor.grad.numpy(), b_tensor.grad.numpy()]


@pytest.mark.parametrize(
    ("x_shape", "w_shape", "settings"),
    [
        ((2, 4, 5, 6), (4, 3, 3, 3), (2, 1, 1, 1, 1)),  # output_padding: rows beyond the floor
        ((1, 6, 4, 4), (6, 2, 3, 2), ((2, 3), (1, 0), (0, 2), 3, (1, 2))),
    ],
)
def test_conv_transpose2d_directions_have_the_roles_of_im2col(
    monkeypatch, reference_cudnn, x_shape, w_shape, settings
):
    rng = np.random.default_rng(2)
    x, weight = rng.standard_normal(x_shape), rng.standard_normal(w_shape)
    bias = rng.standard_normal(w_shape[1] * settings[3])
    through_cudnn = _transposed_results(x, weight, bias, settings)
    assert sorted(reference_cudnn) == ["forward", "input_gradient", "weight_gradient"]
    _im2col(monkeypatch)
    for got, want in zip(
        through_cudnn, _transposed_results(x, weight, bias, settings), strict=True
    ):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_only_the_gradients_asked_for_run(reference_cudnn):
    rng = np.random.default_rng(5)
    x = Tensor(rng.standard_normal((2, 3, 6, 6)))  # a constant input: no input gradient
    weight = Tensor(rng.standard_normal((4, 3, 3, 3)), requires_grad=True)
    ops.conv2d(x, weight).sum().backward()
    assert sorted(reference_cudnn) == ["forward", "weight_gradient"]


def test_a_declined_geometry_takes_im2col(monkeypatch):
    monkeypatch.setattr(conv_cudnn, "_address", lambda array: array.ctypes.data)
    monkeypatch.setattr(conv_cudnn, "_plan", lambda direction, geometry: None)
    monkeypatch.setattr(conv_routes, "library_route", lambda *arrays: conv_cudnn)
    rng = np.random.default_rng(6)
    x, weight, bias = (
        rng.standard_normal((2, 3, 7, 7)),
        rng.standard_normal((4, 3, 3, 3)),
        rng.standard_normal(4),
    )
    declined = _conv2d_results(x, weight, bias, (1, 1, 1, 1))
    _im2col(monkeypatch)
    for got, want in zip(declined, _conv2d_results(x, weight, bias, (1, 1, 1, 1)), strict=True):
        np.testing.assert_array_equal(got, want)


def test_an_empty_batch_is_left_to_im2col():
    empty = np.zeros((0, 3, 5, 5))
    assert conv_cudnn.forward(empty, np.ones((2, 3, 3, 3)), None, (1, 1), (0, 0), (1, 1), 1,
                              (0, 2, 3, 3)) is None  # fmt: skip
    geometry = ((1, 1), (0, 0), (1, 1), 1)
    assert conv_cudnn.backward(empty, np.ones((2, 3, 3, 3)), np.zeros((0, 2, 3, 3)), geometry,
                               False, (True, True, False)) is None  # fmt: skip


# --- on a GPU ----------------------------------------------------------------------------------

requires_gpu = pytest.mark.skipif(
    not backend.cuda_available(), reason="needs CuPy and a CUDA device"
)


@pytest.fixture
def cudnn_plan_runs(monkeypatch):
    """Every direction a real cuDNN plan ran (a GPU machine without cuDNN 9 fails here:
    the route these tests are for would silently not run)."""
    monkeypatch.delenv(cudnn.SWITCH_VARIABLE, raising=False)
    if cudnn.loaded() is None:
        pytest.fail("cuDNN 9 does not load: install the 'gpu' or 'gpu-cuda13' extra")
    runs = []
    real = conv_cudnn._Plan.run

    def counted(self, *arrays):
        runs.append(self)
        return real(self, *arrays)

    monkeypatch.setattr(conv_cudnn._Plan, "run", counted)
    return runs


def _on_device(arrays, dtype):
    cupy = backend.cupy_module()
    return [cupy.asarray(np.asarray(a, dtype=dtype)) for a in arrays]


def _gpu_conv2d(arrays, settings):
    x, weight, bias = (Tensor(a, requires_grad=True) for a in arrays)
    out = ops.conv2d(x, weight, bias, *settings)
    upstream = backend.cupy_module().asarray(
        np.random.default_rng(3).standard_normal(out.shape), dtype=out.dtype
    )
    (out * Tensor(upstream)).sum().backward()
    return [backend.as_numpy(t) for t in (out.data, x.grad.data, weight.grad.data, bias.grad.data)]


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize(("x_shape", "w_shape", *"spdg"), GEOMETRIES)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_gpu_cudnn_matches_the_cupy_route_and_numpy(
    monkeypatch, cudnn_plan_runs, dtype, x_shape, w_shape, s, p, d, g
):
    monkeypatch.setattr(backend, "_tf32", {"matmul": False, "cudnn": False})  # exact float32
    rng = np.random.default_rng(0)
    host = [rng.standard_normal(x_shape), rng.standard_normal(w_shape)]
    host.append(rng.standard_normal(w_shape[0]))
    settings = (s, p, d, g)
    through_cudnn = _gpu_conv2d(_on_device(host, dtype), settings)
    assert len(cudnn_plan_runs) == 3, f"declined: {conv_cudnn.declined()}"
    monkeypatch.setenv(cudnn.SWITCH_VARIABLE, "0")
    cupy_route = _gpu_conv2d(_on_device(host, dtype), settings)
    assert len(cudnn_plan_runs) == 3
    reference = _conv2d_results(*host, settings)
    tolerance = 1e-10 if dtype == "float64" else 2e-4
    for got, cupy_got, want in zip(through_cudnn, cupy_route, reference, strict=True):
        np.testing.assert_allclose(got, cupy_got, rtol=tolerance, atol=tolerance)
        np.testing.assert_allclose(got, want, rtol=tolerance, atol=tolerance)


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize(
    ("x_shape", "w_shape", "settings"),
    [((2, 4, 5, 6), (4, 3, 3, 3), (2, 1, 1, 1, 1)), ((1, 6, 4, 4), (6, 2, 3, 2), (2, 0, 1, 3, 1))],
)
def test_gpu_conv_transpose2d_on_cudnn_matches_numpy(cudnn_plan_runs, x_shape, w_shape, settings):
    rng = np.random.default_rng(2)
    host = [rng.standard_normal(x_shape), rng.standard_normal(w_shape)]
    host.append(rng.standard_normal(w_shape[1] * settings[3]))
    x, weight, bias = (Tensor(a, requires_grad=True) for a in _on_device(host, "float64"))
    out = ops.conv_transpose2d(x, weight, bias, *settings[:3], settings[3], settings[4])
    upstream = np.random.default_rng(4).standard_normal(out.shape)
    (out * Tensor(backend.cupy_module().asarray(upstream))).sum().backward()
    got = [backend.as_numpy(t) for t in (out.data, x.grad.data, weight.grad.data, bias.grad.data)]
    assert len(cudnn_plan_runs) == 3
    for g, w in zip(got, _transposed_results(*host, settings), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-10)


@pytest.mark.gpu
@requires_gpu
def test_gpu_tf32_convolutions_stay_close_to_float64(monkeypatch, cudnn_plan_runs):
    """With TF32 allowed (the default) float32 convolutions may round their inputs to
    10-bit mantissas: results within TF32's error of float64's."""
    monkeypatch.setattr(backend, "_tf32", {"matmul": False, "cudnn": True})
    rng = np.random.default_rng(7)
    host = [rng.standard_normal((8, 32, 16, 16)), rng.standard_normal((64, 32, 3, 3)) / 10]
    x, weight = _on_device(host, "float32")
    got = backend.as_numpy(ops.conv2d(Tensor(x), Tensor(weight), None, 1, 1).data)
    want = ops.conv2d(Tensor(host[0]), Tensor(host[1]), None, 1, 1).numpy()
    assert len(cudnn_plan_runs) == 1
    np.testing.assert_allclose(got, want, rtol=0, atol=5e-3 * np.abs(want).max())


@pytest.mark.gpu
@requires_gpu
def test_gpu_a_cudnn_convolution_replays_in_a_cuda_graph(cudnn_plan_runs):
    """Once its plan exists (a warm-up call on the capture stream), a convolution is
    captured and replayed, reading the inputs' buffers as they are at replay."""
    cupy = backend.cupy_module()
    rng = np.random.default_rng(8)
    x = cupy.asarray(rng.standard_normal((4, 8, 12, 12)))
    weight = cupy.asarray(rng.standard_normal((16, 8, 3, 3)))
    out = cupy.empty((4, 16, 12, 12))
    cupy.cuda.runtime.deviceSynchronize()  # the inputs, written on the default stream
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        conv_cudnn._run("forward", x, weight, out, (1, 1), (1, 1), (1, 1))  # warm-up
        stream.begin_capture()
        conv_cudnn._run("forward", x, weight, out, (1, 1), (1, 1), (1, 1))
        graph = stream.end_capture()
        # new input on the same stream (a non-blocking stream does not wait for others)
        x[...] = cupy.asarray(rng.standard_normal(x.shape))
        out[...] = 0
        graph.launch(stream)
    stream.synchronize()
    want = ops.conv2d(Tensor(x.get()), Tensor(weight.get()), None, 1, 1).numpy()
    np.testing.assert_allclose(out.get(), want, rtol=1e-10, atol=1e-10)
