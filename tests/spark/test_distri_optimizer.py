"""DistriOptimizer equals LocalOptimizer on the same global batches, and fails clearly.

Every run here is a few dozen Spark jobs in local[2] on a tiny model; the reference is a
LocalOptimizer over ``DistriOptimizer.local_reference_dataset`` (the same batches, each share
drawn from its partition's own permutation).
"""

from __future__ import annotations

import numpy as np
import pytest
from blob_data import BATCH, CLASSES, FEATURES, blobs, classifier, flat, relative_error

from bigdl_py import nn
from bigdl_py.data import MiniBatch, Sample
from bigdl_py.optim import SGD, Adam, DistriOptimizer, Optimizer
from bigdl_py.spark import DistributedTrainingError
from bigdl_py.train import (
    EveryEpoch,
    LocalOptimizer,
    Loss,
    MaxEpoch,
    MaxIteration,
    NonFiniteLossError,
    SeveralIteration,
    Top1Accuracy,
    TrainingCallback,
    evaluate_batches,
    load_checkpoint,
)

pytestmark = pytest.mark.spark


METHODS = {
    "sgd_momentum": lambda: SGD(lr=0.1, momentum=0.9),
    "adam": lambda: Adam(lr=0.01),
}


def train_both(partitions, method, clip, iterations=20, **options):
    features, labels = blobs()
    distributed = DistriOptimizer(
        classifier(),
        (features, labels),
        nn.NLLLoss(),
        METHODS[method](),
        batch_size=BATCH,
        end_trigger=MaxIteration(iterations),
        num_partitions=partitions,
        progress=False,
        **options,
    )
    local = LocalOptimizer(
        classifier(),
        distributed.local_reference_dataset(features, labels),
        nn.NLLLoss(),
        METHODS[method](),
        batch_size=BATCH,
        end_trigger=MaxIteration(iterations),
        progress=False,
    )
    for optimizer in (distributed, local):
        if clip:
            optimizer.set_constant_gradient_clipping(-0.5, 0.5)
            optimizer.set_gradient_clipping_by_l2_norm(0.3)
    with distributed:
        distributed_model = distributed.optimize()
    return distributed, flat(distributed_model), flat(local.optimize())


@pytest.mark.parametrize("clip", [False, True], ids=["no_clip", "clip"])
@pytest.mark.parametrize("method", sorted(METHODS))
@pytest.mark.parametrize("partitions", [1, 2, 3, 4])
def test_equals_local_training_on_the_same_global_batches(spark, partitions, method, clip):
    _, distributed, local = train_both(partitions, method, clip)
    assert relative_error(distributed, local) <= 1e-5
    assert relative_error(distributed, flat(classifier())) > 1e-2  # it did train


def test_clipping_changes_the_result(spark):
    _, clipped, _ = train_both(2, "sgd_momentum", True, iterations=5)
    _, free, _ = train_both(2, "sgd_momentum", False, iterations=5)
    assert relative_error(clipped, free) > 1e-3


@pytest.mark.parametrize("update", ["sharded", "replicated", "one-task"])
def test_gradient_accumulation_equals_one_big_batch(spark, update):
    _, accumulated, local = train_both(
        2, "adam", False, iterations=8, gradient_accumulation=3, update=update
    )
    assert relative_error(accumulated, local) <= 1e-5


@pytest.mark.parametrize("update", ["sharded", "replicated"])
@pytest.mark.parametrize("wire_dtype, bound", [("float16", 2e-3), ("bfloat16", 2e-2)])
def test_half_precision_gradients_stay_close(spark, wire_dtype, bound, update):
    _, compressed, local = train_both(
        3, "sgd_momentum", False, iterations=10, wire_dtype=wire_dtype, update=update
    )
    error = relative_error(compressed, local)
    assert 0 < error <= bound


def test_rdd_of_samples_and_front_door(spark):
    features, labels = blobs()
    rdd = spark.sparkContext.parallelize(
        [Sample(f, int(y)) for f, y in zip(features, labels, strict=True)], 3
    )
    optimizer = Optimizer(
        classifier(),
        rdd,
        nn.NLLLoss(),
        Adam(lr=0.05),
        end_trigger=MaxEpoch(4),
        batch_size=32,
        progress=False,
    )
    assert isinstance(optimizer, DistriOptimizer)
    optimizer.set_validation(EveryEpoch(), (features, labels), [Top1Accuracy()])
    with optimizer:
        optimizer.optimize()
    assert optimizer.state.epoch == 4
    assert optimizer.last_validation[0].value > 0.9


def test_dataframe_with_array_column(spark):
    features, labels = blobs()
    frame = spark.createDataFrame(
        [(f.tolist(), int(y)) for f, y in zip(features, labels, strict=True)],
        "features array<float>, label long",
    ).repartition(2)
    with DistriOptimizer(
        classifier(),
        frame,
        nn.NLLLoss(),
        Adam(lr=0.05),
        batch_size=32,
        end_trigger=MaxEpoch(3),
        progress=False,
    ) as optimizer:
        optimizer.set_validation(EveryEpoch(), (features, labels), [Top1Accuracy()])
        optimizer.optimize()
    assert optimizer.last_validation[0].value > 0.9


def test_resume_from_a_checkpoint_is_exact(spark, tmp_path):
    features, labels = blobs()

    def optimizer(epochs, model=None):
        return DistriOptimizer(
            model or classifier(),
            (features, labels),
            nn.NLLLoss(),
            Adam(lr=0.01),
            batch_size=BATCH,
            end_trigger=MaxEpoch(epochs),
            num_partitions=3,
            progress=False,
        )

    with optimizer(2) as straight:
        expected = flat(straight.optimize())
    with optimizer(1) as first:
        first.set_checkpoint(str(tmp_path), EveryEpoch())
        first.optimize()
    checkpoint = load_checkpoint(str(tmp_path))
    assert checkpoint.metadata["optim_layout"]["sharded"]
    assert len(checkpoint.metadata["optim_layout"]["shards"]) == 3
    with nn.init.seeded(99):  # other initial weights: the checkpoint must replace them
        other = nn.Sequential(
            nn.Linear(FEATURES, 16), nn.Tanh(), nn.Linear(16, CLASSES), nn.LogSoftmax()
        )
    with optimizer(2, other) as resumed:
        resumed.resume_from(str(tmp_path))
        result = flat(resumed.optimize())
    assert relative_error(result, expected) <= 1e-6


def test_nonfinite_loss_stops_with_the_iteration_named(spark):
    features, labels = blobs()
    model = classifier()
    model[0].weight.data[0, 0] = np.nan  # every output, so the first loss, is NaN
    with DistriOptimizer(
        model,
        (features, labels),
        nn.NLLLoss(),
        SGD(lr=0.1),
        batch_size=BATCH,
        end_trigger=MaxIteration(5),
        num_partitions=2,
        progress=False,
    ) as optimizer:
        with pytest.raises(NonFiniteLossError, match=r"loss is nan at iteration 1 "):
            optimizer.optimize()
    assert np.isnan(flat(model)).sum() == 1  # the weights before the batch: not updated


def test_an_executor_error_reaches_the_callbacks_end_hook(spark):
    # The loop is LocalOptimizer's; the error here is Spark's own kind, raised by a task:
    # validation on an RDD runs on the executors, where a label outside the 3 classes fails.
    class EndRecorder(TrainingCallback):
        ended: list = []

        def on_train_end(self, optimizer, model, error):
            self.ended.append(error)

    features, labels = blobs()
    rows = [Sample(features[i], 7 if i == 5 else int(labels[i])) for i in range(40)]
    recorder = EndRecorder()
    with DistriOptimizer(
        classifier(),
        (features, labels),
        nn.NLLLoss(),
        SGD(lr=0.1),
        batch_size=BATCH,
        end_trigger=MaxIteration(2),
        num_partitions=2,
        progress=False,
    ) as optimizer:
        optimizer.set_validation(
            SeveralIteration(1), spark.sparkContext.parallelize(rows, 2), [Top1Accuracy()]
        )
        optimizer.add_callback(recorder)
        with pytest.raises(Exception, match="outside the 3 classes") as raised:
            optimizer.optimize()
    assert recorder.ended == [raised.value]


def test_validation_on_an_rdd_of_pairs_equals_a_local_evaluation(spark):
    # Training took (features, label) pairs; validation failed on the executors with
    # "'tuple' object has no attribute 'label'".
    features, labels = blobs()
    pairs = spark.sparkContext.parallelize(list(zip(features, labels, strict=True)), 2)
    with DistriOptimizer(
        classifier(),
        pairs,
        nn.NLLLoss(),
        SGD(lr=0.1),
        batch_size=BATCH,
        end_trigger=MaxIteration(2),
        num_partitions=2,
        progress=False,
    ) as optimizer:
        optimizer.set_validation(SeveralIteration(2), pairs, [Top1Accuracy(), Loss()])
        model = optimizer.optimize()
    expected = evaluate_batches(
        model, [MiniBatch(features, labels)], [Top1Accuracy(), Loss(nn.NLLLoss())]
    )
    accuracy, loss = optimizer.last_validation
    assert accuracy == expected[0]
    assert loss.value == pytest.approx(expected[1].value, rel=1e-5)


def test_nonfinite_batches_can_be_skipped(spark):
    features, labels = blobs()
    model = classifier()
    model[0].weight.data[0, 0] = np.nan
    with DistriOptimizer(
        model,
        (features, labels),
        nn.NLLLoss(),
        SGD(lr=0.1),
        batch_size=BATCH,
        end_trigger=MaxIteration(3),
        num_partitions=2,
        skip_nonfinite_batches=True,
        progress=False,
    ) as optimizer:
        optimizer.optimize()
    assert optimizer.state.skipped_batches == 3
    assert optimizer.state.iteration == 3


# --- bad input: a clear error on the driver naming the partition --------------------------------
def test_nan_in_a_partition_is_named(spark):
    features, labels = blobs()
    features[150, 3] = np.nan  # sample 50 of the second block
    blocks = [MiniBatch(features[:100], labels[:100]), MiniBatch(features[100:], labels[100:])]
    rdd = spark.sparkContext.parallelize(blocks, 2)
    with pytest.raises(ValueError, match=r"partition 1: feature array 0 of sample 50 .*NaN"):
        DistriOptimizer(
            classifier(),
            rdd,
            nn.NLLLoss(),
            SGD(lr=0.1),
            batch_size=BATCH,
            num_partitions=2,
            progress=False,
        )
    with pytest.raises(ValueError, match=r"sample 150 contains nan"):  # arrays: checked here
        DistriOptimizer(
            classifier(),
            (features, labels),
            nn.NLLLoss(),
            SGD(lr=0.1),
            batch_size=BATCH,
            num_partitions=2,
            progress=False,
        )


def test_empty_partition_is_named(spark):
    features, labels = blobs()
    rdd = spark.sparkContext.parallelize(
        [MiniBatch(features[:100], labels[:100]), MiniBatch(features[100:], labels[100:])], 3
    )
    with pytest.raises(ValueError, match=r"partitions \[\d\] of the training data are empty"):
        DistriOptimizer(
            classifier(),
            rdd,
            nn.NLLLoss(),
            SGD(lr=0.1),
            batch_size=BATCH,
            num_partitions=3,
            progress=False,
        )


def test_fewer_samples_than_partitions(spark):
    features, labels = blobs()
    with pytest.raises(ValueError, match="3 samples, fewer than the 4 partitions"):
        DistriOptimizer(
            classifier(),
            (features[:3], labels[:3]),
            nn.NLLLoss(),
            SGD(lr=0.1),
            batch_size=4,
            num_partitions=4,
            progress=False,
        )


def test_label_out_of_range_is_named_and_checkpoint_kept(spark, tmp_path):
    # Labels are checked before any Spark job (issue 16): a resumed run with a bad label is
    # refused naming it, and the good run's checkpoint is left as it was.
    features, labels = blobs()

    def optimizer_for(labels, end):
        return DistriOptimizer(
            classifier(),
            (features, labels),
            nn.NLLLoss(),
            SGD(lr=0.1),
            batch_size=BATCH,
            end_trigger=end,
            num_partitions=2,
            shuffle=False,
            progress=False,
        )

    with optimizer_for(labels, MaxIteration(2)) as optimizer:
        optimizer.set_checkpoint(str(tmp_path), MaxIteration(1))
        optimizer.optimize()
    before = sorted((p.name, p.stat().st_mtime_ns) for p in tmp_path.rglob("*"))
    bad = labels.copy()
    bad[120] = 7  # partition 1 of 2 holds rows 102..202
    with pytest.raises(ValueError, match=r"label.*7"):
        with optimizer_for(bad, MaxIteration(4)) as optimizer:
            optimizer.set_checkpoint(str(tmp_path), MaxIteration(1))
            optimizer.resume_from(str(tmp_path))
            optimizer.optimize()
    assert sorted((p.name, p.stat().st_mtime_ns) for p in tmp_path.rglob("*")) == before
    kept = load_checkpoint(str(tmp_path))
    assert kept.metadata["state"]["iteration"] == 2


def test_model_that_does_not_fit_the_samples_is_named(spark):
    features, labels = blobs()
    with nn.init.seeded(1):
        wrong = nn.Sequential(nn.Linear(FEATURES + 2, CLASSES), nn.LogSoftmax())
    with DistriOptimizer(
        wrong,
        (features, labels),
        nn.NLLLoss(),
        SGD(lr=0.1),
        batch_size=BATCH,
        end_trigger=MaxIteration(2),
        num_partitions=2,
        progress=False,
    ) as optimizer:
        with pytest.raises(DistributedTrainingError, match=r"partition \d, iteration 0.*\(10,\)"):
            optimizer.optimize()


def test_bad_settings_fail_before_any_job(spark):
    features, labels = blobs()
    arguments = (classifier(), (features, labels), nn.NLLLoss(), SGD(lr=0.1))
    with pytest.raises(ValueError, match="wire_dtype"):
        DistriOptimizer(*arguments, batch_size=BATCH, wire_dtype="int8")
    with pytest.raises(ValueError, match="num_partitions"):
        DistriOptimizer(*arguments, batch_size=BATCH, num_partitions=0)
    with pytest.raises(ValueError, match="gradient_accumulation"):
        DistriOptimizer(*arguments, batch_size=BATCH, gradient_accumulation=0)
    with pytest.raises(ValueError, match="smaller than the number of partitions"):
        DistriOptimizer(*arguments, batch_size=2, num_partitions=3)
