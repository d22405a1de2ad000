"""Batch transforms: what each does, reproducibility, and skipping in evaluation."""

from __future__ import annotations

import numpy as np
import pytest

from bigdl_py import backend
from bigdl_py.data import (
    BatchRandom,
    Compose,
    Normalize,
    RandomCrop,
    RandomHorizontalFlip,
    ToFloat,
)


@pytest.fixture
def images(rng):
    return rng.random((64, 3, 10, 12)).astype(np.float32)


def test_to_float_scales_bytes_to_unit_range():
    batch = np.array([[0, 51, 255]], dtype=np.uint8)
    result = ToFloat()(batch)
    assert result.dtype == np.float32
    np.testing.assert_allclose(result, batch / 255.0, rtol=1e-6)
    assert ToFloat(scale=2.0, dtype=np.float64)(batch).dtype == np.float64


def test_normalize_per_channel_standardises_each_channel(rng):
    batch = rng.normal([1.0, -2.0, 5.0], [0.5, 3.0, 2.0], (500, 6, 6, 3))
    batch = np.ascontiguousarray(batch.transpose(0, 3, 1, 2)).astype(np.float32)
    mean = batch.mean(axis=(0, 2, 3))
    std = batch.std(axis=(0, 2, 3))
    result = Normalize(mean.tolist(), std.tolist())(batch)
    assert result.dtype == np.float32 and result.shape == batch.shape
    np.testing.assert_allclose(result.mean(axis=(0, 2, 3)), 0.0, atol=1e-4)
    np.testing.assert_allclose(result.std(axis=(0, 2, 3)), 1.0, atol=1e-4)
    np.testing.assert_allclose(
        result, (batch - mean[None, :, None, None]) / std[None, :, None, None], rtol=1e-5
    )


def test_normalize_with_one_value_and_integer_input():
    batch = np.full((2, 1, 2, 2), 4, dtype=np.uint8)
    result = Normalize(2.0, 0.5)(batch)
    assert result.dtype == np.float32
    np.testing.assert_array_equal(result, np.full(batch.shape, 4.0))


def test_normalize_refuses_bad_statistics_and_wrong_channel_counts(images):
    with pytest.raises(ValueError, match="every std must be > 0"):
        Normalize([0.5, 0.5], [0.2, 0.0])
    with pytest.raises(ValueError, match="mean has 2 channels but std has 3"):
        Normalize([0.5, 0.5], [1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match=r"2 channels but the batch of shape \(64, 3, 10, 12\)"):
        Normalize([0.5, 0.5], [1.0, 1.0])(images)


def test_random_crop_with_padding_keeps_the_shape_and_cuts_windows_of_the_padded_image(images):
    crop = RandomCrop((10, 12), padding=2)
    result = crop(images, rng=0)
    assert result.shape == images.shape and result.dtype == images.dtype
    padded = np.pad(images, ((0, 0), (0, 0), (2, 2), (2, 2)))
    offsets = set()
    for index in range(len(images)):
        matches = [
            (top, left)
            for top in range(5)
            for left in range(5)
            if np.array_equal(result[index], padded[index, :, top : top + 10, left : left + 12])
        ]
        assert matches, f"sample {index} is not a window of its padded image"
        offsets.add(matches[0])
    assert len(offsets) > 10  # offsets are drawn per sample, not once per batch


def test_random_crop_smaller_than_the_image_and_without_channel_axis(rng):
    batch = rng.integers(0, 255, (8, 9, 9), dtype=np.uint8)
    result = RandomCrop(5)(batch, rng=1)
    assert result.shape == (8, 5, 5) and result.dtype == np.uint8
    for index in range(len(batch)):
        assert any(
            np.array_equal(result[index], batch[index, top : top + 5, left : left + 5])
            for top in range(5)
            for left in range(5)
        )
    with pytest.raises(ValueError, match=r"crop \(12, 12\) is larger than the padded images"):
        RandomCrop(12, padding=1)(batch, rng=1)
    with pytest.raises(ValueError, match=r"expected an image batch.*got shape \(8, 81\)"):
        RandomCrop(5)(batch.reshape(8, 81), rng=1)


def test_random_horizontal_flip_mirrors_some_samples_and_keeps_the_rest(images):
    result = RandomHorizontalFlip(p=0.5)(images, rng=3)
    flipped = (result == images[..., ::-1]).all(axis=(1, 2, 3))
    kept = (result == images).all(axis=(1, 2, 3))
    assert np.all(flipped ^ kept)
    assert 16 < flipped.sum() < 48
    np.testing.assert_array_equal(RandomHorizontalFlip(p=1.0)(images), images[..., ::-1])
    np.testing.assert_array_equal(RandomHorizontalFlip(p=0.0)(images), images)
    with pytest.raises(ValueError, match=r"p must be in \[0, 1\], got 1.5"):
        RandomHorizontalFlip(1.5)


def test_the_same_rng_gives_the_same_augmentation(images):
    augment = Compose([RandomCrop(10, padding=3), RandomHorizontalFlip()])
    crop_only = RandomCrop(10, padding=3)
    first = augment(images[:, :, :, :10], rng=BatchRandom.for_batch(4, 2, 7, len(images)))
    second = augment(images[:, :, :, :10], rng=BatchRandom.for_batch(4, 2, 7, len(images)))
    other_batch = augment(images[:, :, :, :10], rng=BatchRandom.for_batch(4, 2, 8, len(images)))
    np.testing.assert_array_equal(first, second)
    assert not np.array_equal(first, other_batch)
    assert not np.array_equal(crop_only(images, rng=1), crop_only(images, rng=2))


def test_shares_of_a_batch_get_the_rows_of_the_whole_batch_draws(images):
    augment = Compose([RandomCrop((10, 12), padding=2), RandomHorizontalFlip()])
    whole = augment(images, rng=BatchRandom.for_batch(1, 0, 3, len(images)))
    share = augment(images[10:30], rng=BatchRandom.for_batch(1, 0, 3, len(images), 10, 30))
    np.testing.assert_array_equal(share, whole[10:30])
    with pytest.raises(ValueError, match="draws are for a share of 20 samples"):
        augment(images[:5], rng=BatchRandom.for_batch(1, 0, 3, len(images), 10, 30))


def test_compose_applies_in_order_and_skips_training_only_steps_in_evaluation():
    batch = np.arange(8, dtype=np.uint8).reshape(2, 1, 1, 4)
    pipeline = Compose([ToFloat(scale=1.0), RandomHorizontalFlip(p=1.0), Normalize(1.0, 2.0)])
    np.testing.assert_allclose(pipeline(batch), (batch[..., ::-1] - 1.0) / 2.0)
    np.testing.assert_allclose(pipeline(batch, augment=False), (batch - 1.0) / 2.0)
    with pytest.raises(TypeError, match=r"item 1 \(int\) is not a Transform"):
        Compose([ToFloat(), 3])


@pytest.mark.gpu
@pytest.mark.skipif(not backend.cuda_available(), reason="needs CuPy and a CUDA device")
def test_transforms_give_the_same_result_on_cupy_batches(images):
    pipeline = Compose(
        [RandomCrop((10, 12), padding=2), RandomHorizontalFlip(), Normalize([0.1, 0.2, 0.3], 2.0)]
    )
    on_host = pipeline(images, rng=BatchRandom.for_batch(0, 1, 2, len(images)))
    on_device = pipeline(
        backend.to_device(images, "cuda:0"), rng=BatchRandom.for_batch(0, 1, 2, len(images))
    )
    assert backend.is_cupy_array(on_device)
    np.testing.assert_allclose(backend.as_numpy(on_device), on_host, rtol=1e-6)
