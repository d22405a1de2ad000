"""conv2d: gradients (both input-gradient routes), PyTorch parity, shapes and errors."""

from __future__ import annotations

import numpy as np
import pytest

from bigdl_py import backend
from bigdl_py.autograd import Tensor, gradcheck, ops
from bigdl_py.autograd.ops import conv, conv_tiles
from bigdl_py.autograd.ops.conv import _weight_gradient

# (id, input shape, weight shape, settings)
CONV_CASES = [
    ("basic", (2, 3, 5, 5), (4, 3, 3, 3), {}),
    ("stride2", (2, 2, 7, 6), (3, 2, 3, 3), {"stride": 2}),
    ("padding", (1, 2, 4, 5), (3, 2, 3, 3), {"padding": 1}),
    ("pair_settings", (1, 2, 7, 6), (2, 2, 3, 2), {"stride": (2, 1), "padding": (1, 2)}),
    ("dilation", (1, 2, 7, 7), (2, 2, 3, 3), {"dilation": 2, "padding": 1}),
    ("groups", (2, 4, 5, 5), (6, 2, 3, 3), {"groups": 2, "padding": 1}),
    ("depthwise", (1, 3, 5, 5), (3, 1, 3, 3), {"groups": 3}),
    ("one_by_one", (2, 3, 4, 4), (5, 3, 1, 1), {}),
    ("big_kernel_small_output", (2, 2, 6, 6), (3, 2, 5, 5), {}),
    ("full_width_rows", (2, 3, 4, 12), (4, 3, 3, 3), {"padding": 1}),
    ("full_width_dilated_groups", (1, 4, 4, 14), (2, 2, 2, 2), {"dilation": (1, 2), "groups": 2}),
]


@pytest.mark.parametrize(
    "input_shape, weight_shape, settings",
    [case[1:] for case in CONV_CASES],
    ids=[case[0] for case in CONV_CASES],
)
def test_conv2d_gradients(make_tensor, input_shape, weight_shape, settings):
    x, weight, bias = (
        make_tensor(*input_shape),
        make_tensor(*weight_shape),
        make_tensor(weight_shape[0]),
    )
    assert gradcheck(lambda a, w, b: ops.conv2d(a, w, b, **settings), [x, weight, bias])


@pytest.mark.parametrize("transposed", [True, False], ids=["transposed_conv", "col2im"])
@pytest.mark.parametrize(
    "settings", [{"padding": 1}, {"padding": (0, 1), "dilation": (1, 2)}, {"groups": 2}]
)
def test_both_input_gradient_routes_agree_with_finite_differences(
    make_tensor, monkeypatch, transposed, settings
):
    monkeypatch.setattr(conv, "_flipped_kernel_is_cheaper", lambda *args: transposed)
    x, weight = make_tensor(2, 4, 5, 5), make_tensor(4, 2 if "groups" in settings else 4, 3, 3)
    assert gradcheck(lambda a, w: ops.conv2d(a, w, **settings), [x, weight])


@pytest.mark.parametrize(
    "groups, rows, out_per_group", [(1, 27, 32), (1, 288, 32), (2, 6, 3), (3, 2, 5)]
)
def test_weight_gradient_is_grad_times_columns_transposed_in_either_orientation(
    rng, groups, rows, out_per_group
):
    # Both orientations (taller side as rows) must give grad @ columns^T per group.
    columns = rng.standard_normal((groups, rows, 40))
    grad = rng.standard_normal((groups, out_per_group, 40))
    expected = np.einsum("gol,gkl->gok", grad, columns)
    np.testing.assert_allclose(_weight_gradient(columns, grad), expected, rtol=1e-12, atol=1e-12)


def test_conv2d_without_bias_and_without_input_gradient(make_tensor):
    x = make_tensor(2, 3, 5, 5, requires_grad=False)
    weight = make_tensor(4, 3, 3, 3)
    output = ops.conv2d(x, weight, stride=2)
    output.sum().backward()
    assert x.grad is None and weight.grad.shape == weight.shape


@pytest.mark.parametrize(
    "input_shape, weight_shape, settings",
    [case[1:] for case in CONV_CASES],
    ids=[case[0] for case in CONV_CASES],
)
def test_conv2d_matches_torch(torch, compare_with_torch, rng, input_shape, weight_shape, settings):
    arrays = [
        rng.standard_normal(input_shape),
        rng.standard_normal(weight_shape),
        rng.standard_normal(weight_shape[0]),
    ]
    compare_with_torch(
        lambda x, w, b: ops.conv2d(x, w, b, **settings),
        lambda x, w, b: torch.nn.functional.conv2d(x, w, b, **settings),
        arrays,
    )


def test_conv2d_output_shape_and_dtype(rng):
    x = Tensor(rng.standard_normal((2, 3, 9, 8)), dtype=np.float32)
    weight = Tensor(rng.standard_normal((6, 3, 3, 2)), dtype=np.float32)
    output = ops.conv2d(x, weight, stride=(2, 3), padding=(1, 0), dilation=(2, 1))
    # OH = (9 + 2 - 2*2 - 1) // 2 + 1 = 4, OW = (8 - 1 - 1) // 3 + 1 = 3
    assert output.shape == (2, 6, 4, 3)
    assert output.dtype == np.float32


@pytest.mark.parametrize(
    "input_shape, weight_shape, settings, message",
    [
        (
            (2, 3, 5, 5),
            (4, 2, 3, 3),
            {},
            r"conv2d: input of shape \(2, 3, 5, 5\) has 3 channels "
            r"but the weight of shape \(4, 2, 3, 3\)",
        ),
        (
            (2, 4, 5, 5),
            (3, 2, 3, 3),
            {"groups": 2},
            r"conv2d: groups=2 must divide both the "
            r"input channels \(4\) and the output "
            r"channels \(3\)",
        ),
        (
            (1, 1, 3, 3),
            (1, 1, 5, 5),
            {"padding": 0},
            r"conv2d: kernel height 5 .* larger than "
            r"the padded input height 3",
        ),
        ((1, 1, 5, 5), (1, 1, 3, 3), {"dilation": 3}, r"dilated extent 7"),
        ((1, 5, 5), (1, 1, 3, 3), {}, r"conv2d: input must be 4-d"),
        ((1, 1, 5, 5), (1, 1, 3, 3), {"stride": 0}, r"conv2d: stride and dilation must be >= 1"),
        (
            (1, 1, 5, 5),
            (1, 1, 3, 3),
            {"stride": (1, 2, 3)},
            r"conv2d: stride must be an int or "
            r"a pair",
        ),
    ],
)
def test_conv2d_errors_name_the_op_and_shapes(input_shape, weight_shape, settings, message):
    x, weight = Tensor(np.zeros(input_shape)), Tensor(np.zeros(weight_shape))
    with pytest.raises(ValueError, match=message):
        ops.conv2d(x, weight, **settings)


def test_conv2d_bias_shape_error():
    with pytest.raises(ValueError, match=r"conv2d: bias must have shape \(4,\), got \(3,\)"):
        ops.conv2d(
            Tensor(np.zeros((1, 2, 4, 4))), Tensor(np.zeros((4, 2, 3, 3))), Tensor(np.zeros(3))
        )


@pytest.mark.parametrize("padding", [0, 1])
def test_conv2d_of_a_non_contiguous_input_equals_that_of_its_copy(rng, padding):
    base = rng.standard_normal((5, 4, 3, 2))
    view = Tensor(base, dtype=np.float64).permute(3, 2, 1, 0)[:, :, ::-1]  # strided, reversed
    copy = Tensor(np.ascontiguousarray(view.numpy()))
    weight = Tensor(rng.standard_normal((2, 3, 2, 2)))
    np.testing.assert_allclose(
        ops.conv2d(view, weight, padding=padding).numpy(),
        ops.conv2d(copy, weight, padding=padding).numpy(),
    )


def conv_results(op, arrays, **settings):
    """Output and the gradients of every input of ``op`` on float64 copies of ``arrays``."""
    tensors = [Tensor(a, requires_grad=True, dtype=np.float64) for a in arrays]
    output = op(*tensors, **settings)
    output.backward(np.random.default_rng(5).standard_normal(output.shape))
    return [output.numpy()] + [t.grad.numpy() for t in tensors]


@pytest.mark.parametrize(
    "op, shapes, settings",
    [
        (ops.conv2d, [(7, 4, 4, 12), (6, 4, 3, 3), (6,)], {"padding": 1}),  # flipped kernel
        (ops.conv2d, [(7, 4, 7, 6), (6, 2, 3, 3), (6,)], {"stride": 2, "groups": 2}),  # col2im
        (
            ops.conv_transpose2d,
            [(7, 4, 3, 4), (4, 3, 4, 4), (3,)],
            {"stride": 2, "padding": 1, "output_padding": 1},
        ),
    ],
    ids=["conv2d_flipped_kernel", "conv2d_col2im", "conv_transpose2d"],
)
@pytest.mark.parametrize("samples_per_tile", [1, 3])
def test_tiles_shared_among_threads_give_the_one_tile_result(
    monkeypatch, rng, op, shapes, settings, samples_per_tile
):
    # The batch of 7 splits into tiles of 1, or 3 + 3 + 1 (a smaller last tile reuses the
    # first elements of each thread's buffers); threads take tiles in any order and sum
    # their own weight gradients, so only the summation order may differ.
    arrays = [rng.standard_normal(shape) for shape in shapes]
    with backend.blas_threads(1):
        expected = conv_results(op, arrays, **settings)
    monkeypatch.setattr(conv, "tile_size", lambda *args: samples_per_tile)
    monkeypatch.setattr(conv, "MIN_THREADED_MULTIPLY_ADDS", 0)  # share even these tiny tiles
    with backend.blas_threads(2):
        tiled = conv_results(op, arrays, **settings)
        # The BLAS limit the threads ran under is given back.
        assert conv_tiles.worker_count() == 2
    for got, want in zip(tiled, expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_tile_size_keeps_small_batches_whole_and_splits_large_ones_for_every_worker(monkeypatch):
    monkeypatch.setattr(conv_tiles, "TILE_BYTES", 3000)
    monkeypatch.setattr(conv_tiles, "MIN_SPLIT_BYTES", 5000)
    assert conv_tiles.tile_size(4, 1000, workers=2, on_gpu=False) == 4  # 4000 bytes: whole
    assert conv_tiles.tile_size(64, 1000, workers=1, on_gpu=False) == 3  # 3000 // 1000
    assert conv_tiles.tile_size(64, 100, workers=2, on_gpu=False) == 16  # two tiles per worker
    assert conv_tiles.tile_size(64, 10_000, workers=2, on_gpu=False) == 1  # at least one
    assert conv_tiles.tile_size(64, 1000, workers=2, on_gpu=True) == 64  # a GPU takes all
    monkeypatch.setattr(conv_tiles, "MIN_COLUMNS", 1000)
    # 3 samples of 100 columns would be too narrow a GEMM: 10 samples make 1000 columns.
    assert conv_tiles.tile_size(64, 1000, 1, on_gpu=False, columns_per_sample=100) == 10


def test_an_error_in_a_tile_reaches_the_caller_and_blas_gets_its_threads_back():
    def work(start, stop, scratch):
        if start == 2:
            raise RuntimeError("tile 2 failed")

    with backend.blas_threads(2):
        with pytest.raises(RuntimeError, match="tile 2 failed"):
            conv_tiles.for_each_tile(6, 1, work)
        assert conv_tiles.worker_count() == 2


@pytest.mark.parametrize(
    "settings",
    [{"padding": 1}, {"padding": (0, 2), "dilation": (2, 2)}, {"groups": 2, "padding": (1, 0)}],
)
def test_the_three_column_layouts_give_the_same_convolution(monkeypatch, rng, settings):
    # Stride-1 convolutions take full-width or samples-last columns (by how much the
    # full-width ones add), strided ones sample-major rows; force each layout for the
    # forward and both gradients.
    arrays = [
        rng.standard_normal((3, 4, 5, 6)),
        rng.standard_normal((4, 2 if "groups" in settings else 4, 3, 3)),
    ]
    results = []
    for full_width, samples_last in ((True, False), (False, True), (False, False)):
        monkeypatch.setattr(conv, "_full_width", lambda *args, value=full_width: value)
        monkeypatch.setattr(conv, "_samples_last", lambda *args, value=samples_last: value)
        results.append(conv_results(ops.conv2d, arrays, **settings))
    for layouts in zip(*results, strict=True):
        for other in layouts[1:]:
            np.testing.assert_allclose(other, layouts[0], rtol=1e-12, atol=1e-12)


def test_a_single_tile_runs_with_blas_held_to_one_thread():
    # A woken BLAS thread spins for ~0.1 s after its work and takes a core from the tiles
    # of the ops that follow: the engine's ops never wake one (see conv_tiles).
    seen = []
    with backend.blas_threads(2):
        conv_tiles.for_each_tile(
            4, 4, lambda start, stop, scratch: seen.append(conv_tiles.worker_count())
        )
        assert conv_tiles.worker_count() == 2
    assert seen == [1]


def test_an_empty_batch_makes_no_tiles_at_any_thread_count():
    calls = []
    with backend.blas_threads(2):
        scratches = conv_tiles.for_each_tile(0, 1, lambda *tile: calls.append(tile))
    assert calls == [] and scratches == [{}]


def test_small_convolutions_keep_their_tiles_on_the_calling_thread(monkeypatch, rng, tile_calls):
    # Below MIN_THREADED_MULTIPLY_ADDS handing tiles to another thread costs more than it
    # saves; the tiles still run, with BLAS held to one thread.
    seen = tile_calls(conv, "threaded")
    x = Tensor(rng.standard_normal((4, 2, 6, 6)), requires_grad=True)
    weight = Tensor(rng.standard_normal((3, 2, 3, 3)), requires_grad=True)
    with backend.blas_threads(2):
        ops.conv2d(x, weight).sum().backward()
        monkeypatch.setattr(conv, "MIN_THREADED_MULTIPLY_ADDS", 0)
        ops.conv2d(x, weight).sum().backward()
    assert seen == [False] * 3 + [True] * 3  # forward, weight and input gradients


@pytest.mark.parametrize("width", [1, 7, 16, 1024, 5376])
def test_scratch_matrix_rows_start_an_odd_number_of_cache_lines_apart(width):
    # Rows a multiple of 4 KiB apart share cache sets and slow the GEMMs (see conv_tiles).
    scratch = {}
    matrix = conv_tiles.scratch_matrix(scratch, "columns", (2, 3, width), np.float32)
    assert matrix.shape == (2, 3, width) and matrix.strides[-1] == 4
    if width > 1:
        lines, remainder = divmod(matrix.strides[-2], conv_tiles.CACHE_LINE_BYTES)
        assert remainder == 0 and lines % 2 == 1 and matrix.strides[-2] >= 4 * width
    # A smaller matrix reuses the same buffer, again as a view of it.
    smaller = conv_tiles.scratch_matrix(scratch, "columns", (2, 2, width), np.float32)
    assert np.shares_memory(smaller, matrix)


def test_convolution_with_rows_a_page_apart_matches_the_padded_rows(monkeypatch, rng):
    # The column and gradient buffers are views with padded rows; the same GEMMs on plain
    # contiguous buffers must give the same numbers (forward and both gradients).
    arrays = [rng.standard_normal((8, 3, 6, 6)), rng.standard_normal((4, 3, 3, 3))]
    padded = conv_results(ops.conv2d, arrays, padding=1)

    def plain(scratch, name, shape, dtype, xp=np):
        return conv_tiles.scratch_array(scratch, name, shape, dtype, xp)

    monkeypatch.setattr(conv, "scratch_matrix", plain)
    for got, want in zip(padded, conv_results(ops.conv2d, arrays, padding=1), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_scratch_buffers_are_kept_per_thread_between_ops_and_rezeroed_on_request():
    first = conv_tiles.scratch_array({}, "kept-test", (4, 8), np.float32)
    first[...] = 7
    # A later op (a new scratch dict) in the same thread gets the same memory back ...
    again = conv_tiles.scratch_array({}, "kept-test", (2, 8), np.float32)
    assert np.shares_memory(first, again)
    # ... zeroed when it asks for zeros, though the last op left sevens there.
    zeroed = conv_tiles.scratch_array({}, "kept-test", (4, 8), np.float32, zeroed=True)
    assert np.shares_memory(first, zeroed) and not zeroed.any()
    # Another thread has buffers of its own.
    import threading

    other = []
    thread = threading.Thread(
        target=lambda: other.append(conv_tiles.scratch_array({}, "kept-test", (4, 8), np.float32))
    )
    thread.start()
    thread.join()
    assert not np.shares_memory(first, other[0])


def test_a_zeroed_buffer_grown_within_an_op_is_zeroed_past_its_first_size():
    # The first tile of an op lays the buffer out for its size and zeroes that much; a
    # larger tile later in the same op (same scratch dict) must find zeros past it too.
    conv_tiles.scratch_array({}, "grow-test", (16,), np.float32)[...] = 7  # an earlier op's
    scratch: dict = {}
    small = conv_tiles.scratch_array(scratch, "grow-test", (2, 4), np.float32, zeroed=True)
    small[...] = 1  # what the small tile wrote
    larger = conv_tiles.scratch_array(scratch, "grow-test", (3, 4), np.float32, zeroed=True)
    assert np.shares_memory(small, larger)
    np.testing.assert_array_equal(larger[:2], 1)  # the first tile's values stay
    np.testing.assert_array_equal(larger[2:], 0)


@pytest.mark.parametrize(
    "batch, size, workers, sizes",
    [
        (64, 14, 2, [11, 11, 11, 11, 10, 10]),  # 5 tiles of 14 -> 6, the larger ones first
        (64, 7, 2, [7, 7, 7, 7, 6, 6, 6, 6, 6, 6]),  # 10 tiles: already even for two threads
        (64, 16, 2, [16, 16, 16, 16]),
        (7, 3, 1, [3, 2, 2]),  # one thread: as many tiles as before, as equal as they can be
        (3, 1, 2, [1, 1, 1]),  # never more tiles than samples
        (5, 5, 2, [5]),  # one tile stays one tile
        (0, 4, 2, []),
    ],
)
def test_tiles_are_even_and_a_multiple_of_the_threads(batch, size, workers, sizes):
    tiles = conv_tiles._even_tiles(batch, size, workers)
    assert [stop - start for start, stop in tiles] == sizes
    assert all(stop == start for (_, stop), (start, _) in zip(tiles, tiles[1:], strict=False))
    assert not tiles or (tiles[0][0], tiles[-1][1]) == (0, batch)


@pytest.mark.parametrize("sizes", [(2, 3), (3, 2)])
@pytest.mark.parametrize(
    "input_shape, settings",
    [((5, 3, 4, 12), {"padding": 1}), ((5, 3, 7, 6), {"padding": 1, "stride": 2})],
    ids=["full_width", "strided"],
)
def test_tiles_of_different_sizes_in_either_order_give_the_one_tile_result(
    monkeypatch, rng, sizes, input_shape, settings
):
    # The zero border of a thread's padded frame must hold whichever tile comes first.
    arrays = [rng.standard_normal(input_shape), rng.standard_normal((4, 3, 3, 3))]
    expected = conv_results(ops.conv2d, arrays, **settings)
    first = sizes[0]
    monkeypatch.setattr(
        conv_tiles, "_even_tiles", lambda batch, size, workers: [(0, first), (first, batch)]
    )
    monkeypatch.setattr(conv, "tile_size", lambda *args: 3)
    for got, want in zip(conv_results(ops.conv2d, arrays, **settings), expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
