"""ArrayDataset: validation, batch composition (shuffle, last batch), subsets and splits."""

from __future__ import annotations

import numpy as np
import pytest

from bigdl_py.data import (
    ArrayDataset,
    Normalize,
    RandomCrop,
    RandomHorizontalFlip,
    Sample,
    split_bounds,
    validation,
)


def labelled_dataset(count: int = 10, **options) -> ArrayDataset:
    """Features whose values encode the sample index, labels = index (so batches are easy
    to trace back to samples)."""
    features = np.repeat(np.arange(count, dtype=np.float32)[:, None], 3, axis=1)
    return ArrayDataset(features, np.arange(count), **options)


# --- batch composition ------------------------------------------------------------------
def test_last_partial_batch_is_kept_by_default():
    dataset = labelled_dataset(10, batch_size=4)
    sizes = [batch.size for batch in dataset.batches(epoch=0)]
    assert sizes == [4, 4, 2]
    assert dataset.num_batches() == 3 and len(dataset) == 10


def test_drop_last_drops_the_partial_batch():
    dataset = labelled_dataset(10, batch_size=4, drop_last=True)
    assert [batch.size for batch in dataset.batches(0)] == [4, 4]
    assert dataset.num_batches() == 2
    assert dataset.num_batches(batch_size=5) == 2
    assert list(labelled_dataset(3, batch_size=4, drop_last=True).batches(0)) == []


def test_each_epoch_visits_every_sample_once():
    dataset = labelled_dataset(23, batch_size=5)
    for epoch in range(3):
        seen = np.concatenate([batch.labels for batch in dataset.batches(epoch)])
        assert sorted(seen.tolist()) == list(range(23))


def test_shuffle_is_a_pure_function_of_seed_and_epoch():
    first, second = labelled_dataset(50, seed=7), labelled_dataset(50, seed=7)
    # Consume epochs 0..2 of the first dataset; the second starts cold at epoch 3, like a
    # run resumed from a checkpoint.
    for epoch in range(3):
        list(first.batches(epoch))
    resumed = [batch.labels for batch in second.batches(3)]
    uninterrupted = [batch.labels for batch in first.batches(3)]
    for expected, got in zip(uninterrupted, resumed, strict=True):
        np.testing.assert_array_equal(expected, got)
    np.testing.assert_array_equal(first.permutation(3), second.permutation(3))


def test_epochs_and_seeds_give_different_orders():
    dataset = labelled_dataset(50, seed=7)
    orders = {tuple(dataset.permutation(epoch)) for epoch in range(5)}
    assert len(orders) == 5
    other_seed = labelled_dataset(50, seed=8)
    assert not np.array_equal(dataset.permutation(0), other_seed.permutation(0))


def test_without_shuffle_the_order_is_the_stored_order():
    dataset = labelled_dataset(9, batch_size=4, shuffle=False)
    np.testing.assert_array_equal(dataset.permutation(5), np.arange(9))
    np.testing.assert_array_equal(next(iter(dataset.batches(5))).labels, [0, 1, 2, 3])


def test_global_batch_indices_define_the_batches():
    dataset = labelled_dataset(11, batch_size=3, seed=3)
    indices = dataset.global_batch_indices(epoch=2)
    batches = list(dataset.batches(epoch=2))
    assert len(indices) == len(batches) == dataset.num_batches()
    for index_array, batch in zip(indices, batches, strict=True):
        np.testing.assert_array_equal(batch.labels, index_array)
        np.testing.assert_array_equal(batch.features[0][:, 0], index_array)
    assert [len(part) for part in dataset.global_batch_indices(2, batch_size=5)] == [5, 5, 1]


def test_a_share_of_a_global_batch_equals_those_rows_of_the_whole_batch():
    # What a distributed trainer relies on: each partition builds its rows of a global
    # batch (random transforms included) and the shares reassemble the local batch.
    rng = np.random.default_rng(0)
    images = rng.random((40, 1, 8, 8)).astype(np.float32)
    transforms = [RandomCrop(8, padding=2), RandomHorizontalFlip(), Normalize(0.5, 0.25)]
    dataset = ArrayDataset(images, np.arange(40), batch_size=16, seed=5, transforms=transforms)
    whole = dataset.batch(epoch=1, batch_index=1)
    np.testing.assert_array_equal(whole.features[0], list(dataset.batches(1))[1].features[0])
    shares = [
        dataset.batch(epoch=1, batch_index=1, start=start, stop=stop)
        for start, stop in split_bounds(whole.size, 3)
    ]
    np.testing.assert_array_equal(
        np.concatenate([share.features[0] for share in shares]), whole.features[0]
    )
    np.testing.assert_array_equal(np.concatenate([share.labels for share in shares]), whole.labels)
    with pytest.raises(IndexError, match="epoch 1 has 3 batches"):
        dataset.batch(epoch=1, batch_index=3)


def test_train_flag_and_augment_argument_control_training_only_transforms():
    images = np.arange(2 * 4 * 4, dtype=np.float32).reshape(2, 1, 4, 4)
    transforms = [RandomHorizontalFlip(p=1.0), Normalize(1.0, 2.0)]
    training = ArrayDataset(images, batch_size=2, shuffle=False, transforms=transforms)
    evaluation = training.with_options(train=False)
    flipped = next(training.batches(0)).features[0]
    plain = next(evaluation.batches(0)).features[0]
    np.testing.assert_allclose(plain, (images - 1.0) / 2.0)
    np.testing.assert_allclose(flipped, (images[..., ::-1] - 1.0) / 2.0)
    np.testing.assert_allclose(next(training.batches(0, augment=False)).features[0], plain)
    assert evaluation.features[0] is training.features[0]  # with_options shares the arrays


def test_transforms_touch_only_the_first_input():
    first, second = np.ones((4, 2), np.float32), np.ones((4, 3), np.float32)
    dataset = ArrayDataset((first, second), batch_size=4, transforms=Normalize(1.0, 1.0))
    batch = next(dataset.batches(0))
    assert len(batch.features) == 2 and batch.labels is None
    np.testing.assert_array_equal(batch.features[0], np.zeros((4, 2)))
    np.testing.assert_array_equal(batch.features[1], second)
    assert dataset.num_inputs == 2 and dataset.feature_shapes == ((2,), (3,))


# --- validation -------------------------------------------------------------------------
def test_lengths_must_match():
    with pytest.raises(ValueError, match="features has 5, labels has 4"):
        ArrayDataset(np.zeros((5, 2)), np.zeros(4))


def test_non_finite_features_are_refused_naming_sample_and_array():
    second = np.zeros((6, 2))
    second[4, 1] = np.nan
    second[5, 0] = np.inf
    with pytest.raises(ValueError, match=r"features\[1\] holds non-finite values: sample 4 "):
        ArrayDataset((np.zeros((6, 3)), second), np.zeros(6, np.int64))
    inf_labels = np.zeros(6)
    inf_labels[2] = -np.inf
    with pytest.raises(ValueError, match="labels holds non-finite values: sample 2 contains -inf"):
        ArrayDataset(np.zeros((6, 3)), inf_labels)
    assert len(ArrayDataset((np.zeros((6, 3)), second), check_finite=False)) == 6


def test_non_finite_search_counts_samples_across_its_blocks(monkeypatch):
    monkeypatch.setattr(validation, "_FINITE_CHECK_VALUES", 8)  # blocks of 2 samples
    features = np.zeros((50, 3), np.float32)
    features[37, 2] = np.nan
    with pytest.raises(ValueError, match="sample 37 contains nan"):
        ArrayDataset(features)


def test_labels_outside_the_classes_are_refused_naming_label_and_index():
    labels = np.array([0, 3, 9, 10, 2, -1])
    with pytest.raises(ValueError, match=r"label 10 at index 3 is outside the classes \[0, 10\)"):
        ArrayDataset(np.zeros((6, 1)), labels, num_classes=10)
    with pytest.raises(ValueError, match="label 1.5 at index 1"):
        ArrayDataset(np.zeros((2, 1)), np.array([1.0, 1.5]), num_classes=3)
    with pytest.raises(ValueError, match="no labels"):
        ArrayDataset(np.zeros((2, 1)), num_classes=3)


def test_labels_keep_the_dtype_they_were_given():
    for dtype in (np.int32, np.int64, np.float32, np.float64):
        dataset = ArrayDataset(np.zeros((4, 1)), np.zeros(4, dtype), batch_size=2)
        assert next(dataset.batches(0)).labels.dtype == dtype


def test_non_numeric_arrays_and_bad_options_are_refused():
    with pytest.raises(TypeError, match="labels must be a numeric"):
        ArrayDataset(np.zeros((2, 1)), np.array(["cat", "dog"]))
    with pytest.raises(TypeError, match="list of non-arrays"):
        ArrayDataset([[1.0, 2.0], [3.0, 4.0]], [0, 1])
    with pytest.raises(ValueError, match="batch_size must be >= 1, got 0"):
        labelled_dataset(batch_size=0)
    with pytest.raises(ValueError, match="seed must be a non-negative integer"):
        labelled_dataset(seed=-1)
    with pytest.raises(ValueError, match="epoch must be a non-negative integer"):
        labelled_dataset().permutation(-2)
    with pytest.raises(TypeError, match="unknown ArrayDataset option 'batchsize'"):
        labelled_dataset().with_options(batchsize=3)


# --- samples, subsets, splits -----------------------------------------------------------
def test_samples_iteration_and_round_trip_through_samples():
    dataset = labelled_dataset(5)
    sample = dataset.sample(3)
    assert isinstance(sample, Sample) and sample.label.item() == 3
    assert [s.label.item() for s in dataset] == [0, 1, 2, 3, 4]
    rebuilt = ArrayDataset.from_samples(dataset.to_samples(), batch_size=2)
    np.testing.assert_array_equal(rebuilt.features[0], dataset.features[0])
    np.testing.assert_array_equal(rebuilt.labels, dataset.labels)
    assert rebuilt.batch_size == 2
    with pytest.raises(IndexError, match="out of range for 5 samples"):
        dataset.sample(5)


def test_split_is_a_disjoint_reproducible_partition():
    dataset = labelled_dataset(100, batch_size=8, transforms=RandomHorizontalFlip())
    train, validation = dataset.split(0.8, seed=1)
    assert (len(train), len(validation)) == (80, 20)
    together = np.concatenate([train.labels, validation.labels])
    assert sorted(together.tolist()) == list(range(100))
    assert train.train and train.shuffle and train.batch_size == 8
    assert not validation.train and not validation.shuffle
    again, _ = dataset.split(0.8, seed=1)
    np.testing.assert_array_equal(again.labels, train.labels)
    other, _ = dataset.split(0.8, seed=2)
    assert not np.array_equal(other.labels, train.labels)
    with pytest.raises(ValueError, match="leaves an empty part"):
        labelled_dataset(3).split(0.1)


def test_subset_copies_the_chosen_samples():
    dataset = labelled_dataset(10)
    subset = dataset.subset([7, 2, 2])
    np.testing.assert_array_equal(subset.labels, [7, 2, 2])
    assert len(subset) == 3 and len(dataset) == 10
    with pytest.raises(IndexError, match="out of range for 10 samples"):
        dataset.subset([10])
