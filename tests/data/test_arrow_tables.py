"""Column-wise conversion of Arrow tables and record batches to feature/label arrays."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from memory_checks import traced_peak

from bigdl_py.data import arrays_to_table, column_to_numpy, table_to_arrays


def list_column(matrix: np.ndarray) -> pa.ListArray:
    """A variable-size list column (Spark's array<float>) holding the rows of ``matrix``."""
    rows, width = matrix.shape
    offsets = pa.array(np.arange(0, rows * width + 1, width, dtype=np.int32))
    return pa.ListArray.from_arrays(offsets, pa.array(matrix.reshape(-1)))


def test_scalar_columns_are_stacked_into_one_vector_in_the_order_named(rng):
    a, b, c = rng.random(5), rng.integers(0, 9, 5), rng.random(5).astype(np.float32)
    table = pa.table({"a": a, "b": b, "c": c, "y": np.arange(5)})
    features, labels = table_to_arrays(table, ["c", "a", "b"], "y")
    assert features.shape == (5, 3) and features.dtype == np.float32
    np.testing.assert_allclose(features, np.stack([c, a, b], axis=1).astype(np.float32))
    np.testing.assert_array_equal(labels, np.arange(5))
    single, _ = table_to_arrays(table, "a")
    assert single.shape == (5, 1)
    flags = pa.table({"flag": [True, False, True]})
    np.testing.assert_array_equal(table_to_arrays(flags, "flag")[0], [[1.0], [0.0], [1.0]])


@pytest.mark.parametrize("kind", ["list", "large_list", "fixed_size_list"])
def test_list_columns_become_matrices_and_reshape_to_the_feature_shape(rng, kind):
    images = rng.random((6, 1, 4, 4)).astype(np.float32)
    flat = images.reshape(6, 16)
    if kind == "list":
        column = list_column(flat)
    elif kind == "large_list":
        column = list_column(flat).cast(pa.large_list(pa.float32()))
    else:
        column = pa.FixedSizeListArray.from_arrays(pa.array(flat.reshape(-1)), 16)
    table = pa.table({"pixels": column, "label": pa.array(np.arange(6), pa.int32())})
    features, labels = table_to_arrays(table, "pixels", "label")
    np.testing.assert_array_equal(features, flat)
    reshaped, _ = table_to_arrays(table, "pixels", feature_shape=(1, 4, 4))
    np.testing.assert_array_equal(reshaped, images)
    assert labels.dtype == np.int32  # labels keep their column type unless asked
    assert table_to_arrays(table, "pixels", "label", label_dtype=np.int64)[1].dtype == np.int64


def test_nested_lists_and_tensor_columns_keep_their_row_shape(rng):
    cube = rng.random((4, 2, 3)).astype(np.float32)
    nested = pa.array(cube.tolist(), pa.list_(pa.list_(pa.float32())))
    tensor = pa.FixedShapeTensorArray.from_numpy_ndarray(cube)
    table = pa.table({"nested": nested, "tensor": tensor})
    np.testing.assert_array_equal(table_to_arrays(table, "nested")[0], cube)
    np.testing.assert_array_equal(table_to_arrays(table, "tensor")[0], cube)


def test_several_inputs_and_mixed_columns(rng):
    table = pa.table(
        {
            "image": list_column(rng.random((3, 4))),
            "age": rng.random(3),
            "income": rng.random(3),
        }
    )
    (image, tabular), labels = table_to_arrays(
        table, [["image"], ["age", "income"]], feature_shape=[(2, 2), None]
    )
    assert image.shape == (3, 2, 2) and tabular.shape == (3, 2) and labels is None
    mixed, _ = table_to_arrays(table, ["age", "image"], dtype=None)
    assert mixed.shape == (3, 5) and mixed.dtype == np.float64
    np.testing.assert_array_equal(mixed[:, 0], table.column("age").to_numpy())


def test_ragged_list_rows_are_named():
    column = pa.array(
        [[1.0, 2.0, 3.0, 4.0]] * 3 + [[1.0, 2.0]] + [[0.0] * 4], pa.list_(pa.float32())
    )
    with pytest.raises(ValueError, match="column 'x' is ragged: row 3 has 2 values, row 0 has 4"):
        table_to_arrays(pa.table({"x": column}), "x")
    nested = pa.array([[[1.0, 2.0], [3.0, 4.0]], [[1.0, 2.0], [3.0]]])
    with pytest.raises(ValueError, match="row 1 has 1 values, row 0 has 2"):
        table_to_arrays(pa.table({"x": nested}), "x")


def test_row_numbers_in_errors_count_across_chunks_and_slices():
    good = pa.array([[1.0, 2.0]] * 4)
    bad = pa.array([[1.0, 2.0], [1.0, 2.0], [3.0]])
    table = pa.Table.from_arrays([pa.chunked_array([good, bad])], names=["x"])
    with pytest.raises(ValueError, match="row 6 has 1 values"):
        table_to_arrays(table, "x")
    sliced = pa.array([[9.0], [1.0, 2.0], [1.0, 2.0]]).slice(1)
    np.testing.assert_array_equal(table_to_arrays(pa.table({"x": sliced}), "x")[0], [[1, 2]] * 2)


def test_nulls_non_numeric_columns_and_missing_columns_are_refused():
    with pytest.raises(ValueError, match="column 'x' has a null at row 2"):
        table_to_arrays(pa.table({"x": [1.0, 2.0, None]}), "x")
    with pytest.raises(ValueError, match="column 'x' has a null at row 1"):
        table_to_arrays(pa.table({"x": [[1.0, 2.0], [3.0, None]]}), "x")
    with pytest.raises(TypeError, match="column 's' has Arrow type string"):
        table_to_arrays(pa.table({"s": ["a", "b"]}), "s")
    vector = pa.array([{"type": 1, "values": [1.0]}])
    with pytest.raises(TypeError, match="vector_to_array"):
        table_to_arrays(pa.table({"v": vector}), "v")
    with pytest.raises(KeyError, match=r"no column 'z'; the columns are \['x', 'y'\]"):
        table_to_arrays(pa.table({"x": [1.0], "y": [2.0]}), "x", "z")


def test_decimal_columns_are_read_as_doubles():
    import decimal

    values = [decimal.Decimal("1.25"), decimal.Decimal("-3.5")]
    table = pa.table({"d": pa.array(values, pa.decimal128(6, 2)), "y": [1, 0]})
    features, labels = table_to_arrays(table, ["d", "d"], "y", dtype=None)
    assert features.dtype == np.float64
    np.testing.assert_array_equal(features, [[1.25, 1.25], [-3.5, -3.5]])


def test_feature_shape_must_fit_the_row_width(rng):
    table = pa.table({"x": list_column(rng.random((2, 6)))})
    with pytest.raises(ValueError, match=r"feature_shape \(1, 2, 2\) needs 4 values per row.*6"):
        table_to_arrays(table, "x", feature_shape=(1, 2, 2))


def test_record_batches_and_multi_chunk_tables_convert_like_one_table(rng):
    matrix = rng.random((9, 3))
    table = pa.table({"x": list_column(matrix), "y": np.arange(9)})
    expected, expected_labels = table_to_arrays(table, "x", "y")
    chunked = pa.concat_tables([table.slice(0, 4), table.slice(4)])
    assert chunked.column("x").num_chunks == 2
    for data in (chunked, table.to_batches()[0]):
        features, labels = table_to_arrays(data, "x", "y")
        np.testing.assert_array_equal(features, expected)
        np.testing.assert_array_equal(labels, expected_labels)
    np.testing.assert_array_equal(column_to_numpy(table.to_batches()[0], "y"), np.arange(9))
    with pytest.raises(TypeError, match="expected a pyarrow Table or RecordBatch, got dict"):
        table_to_arrays({"x": matrix}, "x")


def test_fixed_size_list_of_the_target_dtype_is_converted_without_a_copy(rng):
    values = pa.array(rng.random(64 * 10).astype(np.float32))
    column = pa.FixedSizeListArray.from_arrays(values, 64)
    features, _ = table_to_arrays(pa.table({"x": column}), "x", feature_shape=(1, 8, 8))
    assert features.shape == (10, 1, 8, 8)
    # The result's memory is the Arrow values buffer itself: no row was ever visited.
    assert features.__array_interface__["data"][0] == values.buffers()[1].address


def test_large_list_columns_convert_without_a_python_object_per_row_or_value(rng):
    rows, width = 50_000, 32
    column = list_column(rng.random((rows, width)).astype(np.float32))
    table = pa.table({"x": column})
    with traced_peak() as columnar:
        features, _ = table_to_arrays(table, "x")
    with traced_peak() as per_row:
        column.to_pylist()
    assert features.shape == (rows, width)
    # Reading the values buffer costs at most a copy of it (6.4 MB); a Python float per
    # value costs several times that (54 MB here), so a per-row implementation cannot pass.
    assert columnar["bytes"] < 2 * features.nbytes < per_row["bytes"]


def test_arrays_to_table_is_the_inverse(rng):
    images = rng.random((5, 1, 3, 3)).astype(np.float32)
    vectors = rng.random((5, 4))
    scalars = rng.integers(0, 3, 5)
    labels = rng.random((5, 2)).astype(np.float32)
    table = arrays_to_table((images, vectors, scalars), labels, ["img", "vec", "num"], "target")
    assert table.schema.names == ["img", "vec", "num", "target"]
    (got_images, got_vectors, got_scalars), got_labels = table_to_arrays(
        table, [["img"], ["vec"], ["num"]], "target", dtype=None
    )
    np.testing.assert_array_equal(got_images, images)
    np.testing.assert_array_equal(got_vectors, vectors)
    np.testing.assert_array_equal(got_scalars.reshape(-1), scalars)
    np.testing.assert_array_equal(got_labels, labels)
    with pytest.raises(ValueError, match="clashes with a feature column"):
        arrays_to_table(vectors, scalars, "label", "label")
    with pytest.raises(ValueError, match="same number of rows"):
        arrays_to_table(vectors, scalars[:3])
