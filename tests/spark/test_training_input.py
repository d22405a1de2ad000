"""DistriOptimizer's training input is checked up front (issue 16, items 8, 13, 15, 16, 19)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from bigdl_py import nn
from bigdl_py.data import ArrayDataset, MiniBatch, Sample
from bigdl_py.spark.dataframe import prepare_training_input

pytestmark = pytest.mark.spark

CLASSES = 3


def _model():
    return nn.Sequential(nn.Linear(4, CLASSES), nn.LogSoftmax())


def _data(rng, rows=12):
    features = rng.normal(size=(rows, 4)).astype(np.float32)
    labels = rng.integers(0, CLASSES, rows)
    return features, labels


def _labels_of(rdd):
    labels = []
    for record in rdd.collect():
        if isinstance(record, MiniBatch):
            labels.extend(np.asarray(record.labels).tolist())
        elif isinstance(record, Sample):
            labels.append(record.label.item())
        else:
            labels.append(np.asarray(record[1]).item())
    return labels


def _dataframe(spark, features, labels, partitions=2, label_type="double"):
    rows = [(f.tolist(), float(y)) for f, y in zip(features, labels, strict=True)]
    schema = f"features array<float>, label {label_type}"
    if label_type == "long":
        rows = [(f, int(y)) for f, y in rows]
    return spark.createDataFrame(rows, schema).repartition(partitions)


def test_whole_number_double_labels_become_class_indices_everywhere(spark, sc, rng):
    features, labels = _data(rng)
    as_doubles = labels.astype(np.float64)
    criterion = nn.NLLLoss()
    arrays = prepare_training_input((features, as_doubles), sc, 2, _model(), criterion)
    assert arrays.labels.dtype == np.int64
    np.testing.assert_array_equal(arrays.labels, labels)
    frame = _dataframe(spark, features, labels)
    blocks = prepare_training_input(frame, sc, 2, _model(), criterion)
    assert sorted(_labels_of(blocks)) == sorted(labels.tolist())
    assert all(np.asarray(b.labels).dtype == np.int64 for b in blocks.collect())
    samples = sc.parallelize(
        [Sample(f, float(y)) for f, y in zip(features, labels, strict=True)], 2
    )
    records = prepare_training_input(samples, sc, 2, _model(), criterion)
    assert _labels_of(records) == labels.tolist()
    assert all(r.label.dtype == np.int64 for r in records.collect())


def test_regression_targets_pass_unchanged(sc, rng):
    features, _ = _data(rng)
    targets = rng.normal(size=(len(features), CLASSES))
    data = prepare_training_input((features, targets), sc, 2, _model(), nn.MSELoss())
    np.testing.assert_array_equal(data.labels, targets)


@pytest.mark.parametrize("bad", [1.5, 3.0, -1.0])
def test_fractional_or_out_of_range_labels_fail_up_front_for_arrays(sc, rng, bad):
    features, labels = _data(rng)
    labels = labels.astype(np.float64)
    labels[7] = bad
    with pytest.raises(ValueError, match=rf"{bad!r} at index 7|label {int(bad)} at index 7"):
        prepare_training_input((features, labels), sc, 2, _model(), nn.NLLLoss())


def test_ignore_index_labels_are_not_out_of_range(sc, rng):
    features, labels = _data(rng)
    labels[3] = -100
    data = prepare_training_input((features, labels), sc, 2, _model(), nn.NLLLoss())
    assert data.labels[3] == -100


def test_out_of_range_labels_fail_when_a_dataframe_or_rdd_is_cached(spark, sc, rng):
    features, labels = _data(rng)
    labels[5] = CLASSES + 4
    frame = _dataframe(spark, features, labels)
    blocks = prepare_training_input(frame, sc, 2, _model(), nn.NLLLoss())
    with pytest.raises(Exception, match=rf"label {CLASSES + 4} .*outside the model's {CLASSES}"):
        blocks.collect()
    pairs = sc.parallelize(list(zip(features, labels, strict=True)), 2)
    records = prepare_training_input(pairs, sc, 2, _model(), nn.CrossEntropyLoss())
    with pytest.raises(Exception, match=rf"label {CLASSES + 4} .*outside"):
        records.collect()


def test_empty_dataframe_and_empty_rdd_are_named(spark, sc):
    empty = spark.createDataFrame([], "features array<float>, label double")
    with pytest.raises(ValueError, match="training DataFrame has no rows"):
        prepare_training_input(empty, sc, 2, _model(), nn.NLLLoss())
    with pytest.raises(ValueError, match="training RDD holds no samples"):
        prepare_training_input(sc.parallelize([], 2), sc, 2, _model(), nn.NLLLoss())


def test_dataframe_with_more_partitions_than_rows_drops_empty_blocks(spark, sc, rng):
    features, labels = _data(rng, rows=3)
    frame = _dataframe(spark, features, labels, label_type="long")
    blocks = prepare_training_input(frame, sc, 6, _model(), nn.NLLLoss())
    sizes = blocks.glom().map(lambda part: sum(len(b.labels) for b in part)).collect()
    assert len(sizes) == 6 and sum(sizes) == 3
    assert all(len(b.labels) for b in blocks.collect())  # no zero-row MiniBatch left to stack


def test_rdd_of_python_lists_is_refused_by_name(sc, rng):
    features, labels = _data(rng)
    pairs = sc.parallelize([(f.tolist(), int(y)) for f, y in zip(features, labels, strict=True)], 2)
    with pytest.raises(TypeError, match="list of 4 numbers"):
        prepare_training_input(pairs, sc, 2, _model(), nn.NLLLoss())


def test_rdd_records_of_another_kind_are_refused(sc):
    with pytest.raises(TypeError, match="record 0: training records must be Samples"):
        prepare_training_input(sc.parallelize(["a", "b"], 2), sc, 2, _model(), nn.NLLLoss())


def test_skewed_rdd_partitions_are_named_and_rebalanced(sc, rng):
    features, labels = _data(rng, rows=30)
    skewed = sc.parallelize(list(zip(features, labels, strict=True)), 3).mapPartitionsWithIndex(
        lambda index, rows: list(rows)[:2] if index == 0 else rows
    )
    sizes = skewed.glom().map(len).collect()
    with pytest.warns(UserWarning, match=re.escape(f"hold {sizes} samples")):
        rebalanced = prepare_training_input(skewed, sc, 3, _model(), nn.NLLLoss())
    after = rebalanced.glom().map(len).collect()
    assert sum(after) == sum(sizes) and max(after) - min(after) < max(sizes) - min(sizes)


def test_even_rdd_partitions_are_left_alone(sc, rng):
    import warnings

    features, labels = _data(rng, rows=10)
    rdd = sc.parallelize([Sample(f, int(y)) for f, y in zip(features, labels, strict=True)], 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kept = prepare_training_input(rdd, sc, 3, _model(), nn.NLLLoss())
    assert kept.glom().map(len).collect() == rdd.glom().map(len).collect()


def test_array_dataset_labels_checked_against_the_model(sc, rng):
    features, labels = _data(rng)
    labels[0] = CLASSES
    with pytest.raises(ValueError, match="outside the model's 3 classes"):
        prepare_training_input(ArrayDataset(features, labels), sc, 2, _model(), nn.NLLLoss())


def test_skewed_dataframe_partitions_are_named_and_rebalanced(spark, sc, rng):
    features, labels = _data(rng, rows=30)
    rows = [(f.tolist(), int(y)) for f, y in zip(features, labels, strict=True)]
    skewed_rows = sc.parallelize(rows, 3).mapPartitionsWithIndex(
        lambda index, part: list(part)[:2] if index == 0 else part
    )
    frame = spark.createDataFrame(skewed_rows, "features array<float>, label long")
    sizes = frame.rdd.glom().map(len).collect()
    with pytest.warns(UserWarning, match=re.escape(f"DataFrame's partitions hold {sizes}")):
        blocks = prepare_training_input(frame, sc, 3, _model(), nn.NLLLoss())
    after = blocks.map(lambda batch: len(batch.labels)).collect()
    assert sum(after) == sum(sizes) and max(after) - min(after) < max(sizes) - min(sizes)


def test_distri_optimizer_trains_on_double_labels_and_refuses_bad_ones(spark, rng):
    from bigdl_py.optim import SGD
    from bigdl_py.spark.distri_optimizer import DistriOptimizer
    from bigdl_py.train import MaxIteration

    features, labels = _data(rng, rows=16)
    frame = _dataframe(spark, features, labels)  # labels as doubles, Spark ML's convention

    def optimizer(data):
        return DistriOptimizer(
            _model(),
            data,
            nn.NLLLoss(),
            SGD(lr=0.1),
            batch_size=8,
            end_trigger=MaxIteration(2),
            num_partitions=2,
            progress=False,
        )

    with optimizer(frame) as trained:
        trained.optimize()
    assert trained.state.iteration == 2
    labels[9] = CLASSES
    with pytest.raises(ValueError, match=rf"label {CLASSES} .*outside the model's {CLASSES}"):
        optimizer(_dataframe(spark, features, labels))
