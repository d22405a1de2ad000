"""Parquet and Arrow IPC files: round trips, directories, external layouts, errors."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bigdl_py.data import (
    ArrayDataset,
    read_arrow,
    read_arrow_table,
    read_parquet,
    write_arrow,
    write_parquet,
)


@pytest.fixture
def images_and_labels(rng):
    return rng.random((12, 1, 5, 5)).astype(np.float32), rng.integers(0, 10, 12)


def test_parquet_round_trip_keeps_image_shape_and_label_type(tmp_path, images_and_labels):
    images, labels = images_and_labels
    path = tmp_path / "images.parquet"
    write_parquet(path, images, labels, row_group_size=5)
    assert pq.ParquetFile(path).metadata.num_row_groups == 3
    features, got_labels = read_parquet(path, "features", "label")
    np.testing.assert_array_equal(features, images)
    np.testing.assert_array_equal(got_labels, labels)
    assert got_labels.dtype == np.int64
    dataset = ArrayDataset(features, got_labels, batch_size=5, num_classes=10)
    assert [batch.size for batch in dataset.batches(0)] == [5, 5, 2]


def test_parquet_vectors_scalars_and_a_directory_of_files(tmp_path, rng):
    directory = tmp_path / "parts"
    directory.mkdir()
    vectors = rng.random((10, 3))
    write_parquet(directory / "part-0.parquet", vectors[:6], np.arange(6), "v")
    write_parquet(directory / "part-1.parquet", vectors[6:], np.arange(6, 10), "v")
    features, labels = read_parquet(directory, "v", "label", dtype=np.float64)
    order = np.argsort(labels)
    np.testing.assert_array_equal(features[order], vectors)
    np.testing.assert_array_equal(labels[order], np.arange(10))
    write_parquet(tmp_path / "scalar.parquet", vectors[:, 0], feature_columns="only")
    column, no_labels = read_parquet(tmp_path / "scalar.parquet", "only")
    assert column.shape == (10, 1) and no_labels is None
    everything, _ = read_parquet(directory)  # no label: features and label side by side
    assert everything.shape == (10, 4)
    with pytest.raises(ValueError, match="the only column is the label 'only'"):
        read_parquet(tmp_path / "scalar.parquet", label_column="only")


def test_parquet_written_by_other_tools_with_list_and_scalar_columns(tmp_path, rng):
    # The layout Spark writes: array<double> as a list column, several numeric columns.
    pixels = rng.random((4, 9))
    table = pa.table(
        {
            "pixels": pa.array(pixels.tolist(), pa.list_(pa.float64())),
            "x1": rng.random(4),
            "x2": rng.integers(0, 5, 4).astype(np.int32),
            "y": pa.array([0.5, 1.5, 2.5, 3.5]),
        }
    )
    pq.write_table(table, tmp_path / "spark.parquet")
    images, targets = read_parquet(
        tmp_path / "spark.parquet", "pixels", "y", feature_shape=(1, 3, 3)
    )
    np.testing.assert_allclose(images, pixels.reshape(4, 1, 3, 3).astype(np.float32))
    assert targets.dtype == np.float64
    tabular, _ = read_parquet(tmp_path / "spark.parquet", ["x1", "x2"])
    assert tabular.shape == (4, 2) and tabular.dtype == np.float32


def test_parquet_errors_name_the_path_and_the_columns(tmp_path, images_and_labels):
    path = tmp_path / "images.parquet"
    write_parquet(path, *images_and_labels)
    with pytest.raises(
        KeyError, match=r"no column\(s\) \['pixels'\]; its columns are \['features', 'label'\]"
    ):
        read_parquet(path, "pixels", "label")
    with pytest.raises(FileNotFoundError, match="no Parquet file or directory"):
        read_parquet(tmp_path / "missing.parquet", "features")


@pytest.mark.parametrize("stream", [False, True])
def test_arrow_ipc_round_trip_file_and_stream(tmp_path, images_and_labels, stream):
    images, labels = images_and_labels
    path = tmp_path / ("data.arrows" if stream else "data.arrow")
    write_arrow(path, images, labels, stream=stream)
    features, got_labels = read_arrow(path, "features", "label")
    np.testing.assert_array_equal(features, images)
    np.testing.assert_array_equal(got_labels, labels)
    assert read_arrow_table(path).num_rows == len(images)
    # Without feature_columns, every column but the label is a feature.
    default_features, _ = read_arrow(path, label_column="label")
    np.testing.assert_array_equal(default_features, images)


def test_arrow_file_is_memory_mapped_without_copying_features(tmp_path, rng):
    vectors = rng.random((100, 8)).astype(np.float32)
    path = tmp_path / "vectors.arrow"
    write_arrow(path, vectors)
    features, _ = read_arrow(path, "features")
    np.testing.assert_array_equal(features, vectors)
    assert not features.flags.writeable and not features.flags.owndata  # a view of the map


def test_arrow_errors(tmp_path):
    not_arrow = tmp_path / "notes.txt"
    not_arrow.write_text("hello, not arrow")
    with pytest.raises(ValueError, match="is not an Arrow IPC file or stream"):
        read_arrow(not_arrow, "features")
    with pytest.raises(FileNotFoundError, match="no Arrow IPC file"):
        read_arrow(tmp_path / "missing.arrow", "features")
    write_arrow(tmp_path / "ok.arrow", np.zeros((2, 2)))
    with pytest.raises(KeyError, match=r"no column\(s\) \['label'\]"):
        read_arrow(tmp_path / "ok.arrow", "features", "label")
