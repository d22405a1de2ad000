"""Fashion-MNIST: the real files when installed, and the search path and its errors."""

from __future__ import annotations

import numpy as np
import pytest

from bigdl_py.data import (
    FASHION_MNIST_MEAN,
    FASHION_MNIST_STD,
    ArrayDataset,
    fashion_mnist,
    fashion_mnist_raw,
    find_fashion_mnist,
    write_idx,
)
from bigdl_py.data import fashion as fashion_module
from bigdl_py.data.fashion import DATA_ENVIRONMENT_VARIABLE


@pytest.fixture(scope="module")
def train_split(fashion_mnist_dir):
    return fashion_mnist("train", directory=fashion_mnist_dir)


def test_raw_splits_have_the_published_sizes_and_balanced_classes(fashion_mnist_dir):
    for split, count in (("train", 60000), ("test", 10000)):
        images, labels = fashion_mnist_raw(split, directory=fashion_mnist_dir)
        assert images.shape == (count, 28, 28) and images.dtype == np.uint8
        assert labels.shape == (count,) and labels.dtype == np.int64
        assert labels.min() == 0 and labels.max() == 9
        # Fashion-MNIST is balanced: every class has a tenth of each split.
        np.testing.assert_array_equal(np.bincount(labels), np.full(10, count // 10))


def test_normalised_training_set_has_zero_mean_and_unit_std(train_split):
    features, labels = train_split
    assert features.shape == (60000, 1, 28, 28) and features.dtype == np.float32
    assert labels.dtype == np.int64
    # The published statistics are rounded to 4 digits, hence the tolerance.
    assert abs(float(features.mean(dtype=np.float64))) < 2e-3
    assert abs(float(features.std(dtype=np.float64)) - 1.0) < 2e-3
    dataset = ArrayDataset(features, labels, batch_size=256, num_classes=10)
    assert dataset.num_batches() == 235


def test_unnormalised_test_split_is_in_unit_range(fashion_mnist_dir):
    features, labels = fashion_mnist("test", directory=fashion_mnist_dir, normalize=False)
    assert features.shape == (10000, 1, 28, 28) and len(labels) == 10000
    assert features.min() == 0.0 and features.max() == 1.0
    normalised, _ = fashion_mnist("test", directory=fashion_mnist_dir)
    np.testing.assert_allclose(
        normalised, (features - FASHION_MNIST_MEAN) / FASHION_MNIST_STD, rtol=1e-5, atol=1e-5
    )


def write_fake_split(directory, prefix, count):
    directory.mkdir(parents=True, exist_ok=True)
    images = np.arange(count * 784, dtype=np.int64).reshape(count, 28, 28) % 256
    write_idx(directory / f"{prefix}-images-idx3-ubyte.gz", images.astype(np.uint8))
    write_idx(directory / f"{prefix}-labels-idx1-ubyte.gz", np.arange(count, dtype=np.uint8) % 10)


def test_missing_files_list_every_place_searched_and_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv(DATA_ENVIRONMENT_VARIABLE, str(tmp_path / "data-root"))
    # Hide the Debian copy this machine may have installed.
    monkeypatch.setattr(fashion_module, "DEBIAN_DIRECTORY", str(tmp_path / "debian"))
    with pytest.raises(FileNotFoundError) as error:
        find_fashion_mnist("test", directory=None)
    message = str(error.value)
    searched = [
        tmp_path / "data-root" / "fashion-mnist",
        tmp_path / "data-root",
        tmp_path / "debian",
    ]
    assert "Looked in:\n" + "".join(f"  {place}\n" for place in searched) in message
    assert "apt-get install dataset-fashion-mnist" in message and "--data DIR" in message
    with pytest.raises(FileNotFoundError, match=f"Looked in:\n  {tmp_path}\nInstall"):
        fashion_mnist("train", directory=tmp_path)


def test_environment_variable_directory_is_used(tmp_path, monkeypatch):
    write_fake_split(tmp_path / "fashion-mnist", "t10k", 20)
    monkeypatch.setenv(DATA_ENVIRONMENT_VARIABLE, str(tmp_path))
    assert find_fashion_mnist("test") == str(tmp_path / "fashion-mnist")
    features, labels = fashion_mnist("test")
    assert features.shape == (20, 1, 28, 28)
    np.testing.assert_array_equal(labels, np.arange(20) % 10)


def test_explicit_directory_is_the_only_place_searched(tmp_path, monkeypatch):
    write_fake_split(tmp_path / "env", "t10k", 5)
    write_fake_split(tmp_path / "mine", "t10k", 3)
    monkeypatch.setenv(DATA_ENVIRONMENT_VARIABLE, str(tmp_path / "env"))
    images, _ = fashion_mnist_raw("test", directory=tmp_path / "mine")
    assert len(images) == 3
    with pytest.raises(FileNotFoundError):
        fashion_mnist_raw("train", directory=tmp_path / "mine")
