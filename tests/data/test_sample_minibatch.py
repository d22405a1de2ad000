"""Sample, MiniBatch and the rule that cuts a global batch into shares."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bigdl_py import backend
from bigdl_py.data import MiniBatch, Sample, split_bounds


def test_sample_holds_a_tuple_of_arrays_and_a_label_array():
    sample = Sample(np.zeros((28, 28)), 3)
    assert isinstance(sample.features, tuple) and len(sample.features) == 1
    assert sample.feature_shapes == ((28, 28),)
    assert isinstance(sample.label, np.ndarray) and sample.label.item() == 3


def test_sample_with_several_inputs_and_no_label():
    sample = Sample([np.ones(3), [1.0, 2.0]])
    assert sample.feature_shapes == ((3,), (2,))
    assert all(isinstance(array, np.ndarray) for array in sample.features)
    assert sample.label is None


def test_from_ndarray_is_the_constructor():
    features, label = np.arange(4.0), np.array([1.0, 0.0])
    sample = Sample.from_ndarray(features, label)
    np.testing.assert_array_equal(sample.features[0], features)
    np.testing.assert_array_equal(sample.label, label)


def test_from_samples_stacks_along_a_new_batch_axis(rng):
    samples = [Sample((rng.random((2, 3)), rng.random(4)), i) for i in range(5)]
    batch = MiniBatch.from_samples(samples)
    assert batch.size == len(batch) == 5
    assert [array.shape for array in batch.features] == [(5, 2, 3), (5, 4)]
    np.testing.assert_array_equal(batch.labels, np.arange(5))
    np.testing.assert_array_equal(batch.features[1][3], samples[3].features[1])
    assert batch.get_input() == batch.features and batch.get_target() is batch.labels


def test_from_samples_names_the_first_ragged_sample():
    samples = [Sample(np.zeros((28, 28)), 0) for _ in range(20)]
    samples[17] = Sample(np.zeros((28, 27)), 0)
    samples[18] = Sample(np.zeros((5, 5)), 0)
    with pytest.raises(ValueError) as error:
        MiniBatch.from_samples(samples)
    assert (
        str(error.value) == "ragged feature shapes: sample 17 has (28, 27), sample 0 has (28, 28)"
    )


def test_from_samples_refuses_a_mix_of_labelled_and_unlabelled_samples():
    samples = [Sample(np.zeros(2), 1), Sample(np.zeros(2), 1), Sample(np.zeros(2))]
    with pytest.raises(ValueError, match="sample 2 has label None"):
        MiniBatch.from_samples(samples)


def test_from_samples_refuses_ragged_labels_and_empty_lists():
    with pytest.raises(ValueError, match=r"ragged label shapes: sample 1 has \(2,\)"):
        MiniBatch.from_samples([Sample(np.zeros(2), [1.0]), Sample(np.zeros(2), [1.0, 2.0])])
    with pytest.raises(ValueError, match="empty"):
        MiniBatch.from_samples([])


def test_minibatch_refuses_arrays_of_different_batch_sizes():
    with pytest.raises(ValueError, match=r"first \(batch\) axis.*\(4, 2\).*\(3,\)"):
        MiniBatch(np.zeros((4, 2)), np.zeros(3))


def test_slice_gives_the_rows_and_checks_bounds(rng):
    batch = MiniBatch((rng.random((6, 2)), rng.random((6, 3))), np.arange(6))
    part = batch.slice(2, 5)
    np.testing.assert_array_equal(part.features[1], batch.features[1][2:5])
    np.testing.assert_array_equal(part.labels, [2, 3, 4])
    with pytest.raises(ValueError, match="outside a batch of 6"):
        batch.slice(4, 7)


@given(size=st.integers(0, 300), parts=st.integers(1, 40))
def test_split_bounds_cover_the_range_with_sizes_differing_by_at_most_one(size, parts):
    bounds = split_bounds(size, parts)
    sizes = [stop - start for start, stop in bounds]
    assert len(bounds) == parts
    assert sum(sizes) == size
    assert max(sizes) - min(sizes) <= 1
    assert bounds[0][0] == 0 and bounds[-1][1] == size
    starts = [start for start, _ in bounds[1:]]
    stops = [stop for _, stop in bounds[:-1]]
    assert starts == stops


def test_split_cuts_a_batch_into_shares_that_reassemble_it():
    batch = MiniBatch(np.arange(10.0)[:, None], np.arange(10))
    shares = batch.split(4)
    assert [share.size for share in shares] == [3, 3, 2, 2]
    np.testing.assert_array_equal(np.concatenate([share.labels for share in shares]), batch.labels)
    assert [share.size for share in batch.split(12)].count(0) == 2


@pytest.mark.parametrize("parts", [0, -1, 1.5, True])
def test_split_refuses_a_bad_number_of_shares(parts):
    with pytest.raises(ValueError, match="number of shares must be a positive integer"):
        MiniBatch(np.zeros((4, 1))).split(parts)


def test_to_cpu_keeps_values_and_to_samples_round_trips(rng):
    batch = MiniBatch((rng.random((3, 2)), rng.random((3, 1))), np.array([0, 1, 0]))
    moved = batch.to("cpu")
    np.testing.assert_array_equal(moved.features[0], batch.features[0])
    samples = batch.to_samples()
    again = MiniBatch.from_samples(samples)
    for original, rebuilt in zip(batch.features, again.features, strict=True):
        np.testing.assert_array_equal(original, rebuilt)
    np.testing.assert_array_equal(again.labels, batch.labels)


@pytest.mark.gpu
@pytest.mark.skipif(not backend.cuda_available(), reason="needs CuPy and a CUDA device")
def test_to_cuda_moves_every_array_and_back(rng):
    batch = MiniBatch((rng.random((3, 2)), rng.random((3, 1))), np.array([0, 1, 0]))
    on_gpu = batch.to("cuda:0")
    assert all(backend.is_cupy_array(array) for array in on_gpu.features)
    assert backend.is_cupy_array(on_gpu.labels)
    on_gpu.split(2)  # shares of device batches are device views
    back = on_gpu.to("cpu")
    np.testing.assert_array_equal(back.features[0], batch.features[0])
    np.testing.assert_array_equal(back.labels, batch.labels)
