"""DistriOptimizer(update=Pipeline(...)) on Spark: the same weights, running statistics and
validation as LocalOptimizer(micro_batches=R x M, seed=0); checkpoints of each stage's
slice and a bit-exact resume; replicas with recomputation under clipping; the errors.

The grid of stages and micro-batches runs in ``test_pipeline_ticks.py`` (the same tasks,
without Spark); these runs check what Spark adds: the shuffles between ticks, the driver's
side, the balanced cut measured on the data, checkpoints and validation.
"""

from __future__ import annotations

import numpy as np
import pytest
from blob_data import blobs, flat
from blob_data import pipeline_network as network

from bigdl_py import nn
from bigdl_py.optim import SGD, Adam
from bigdl_py.spark import DistriOptimizer, Pipeline
from bigdl_py.spark.modes import TrainingMode
from bigdl_py.spark.settings import Executors
from bigdl_py.train import (
    LocalOptimizer,
    Loss,
    MaxIteration,
    SeveralIteration,
    Top1Accuracy,
    list_checkpoints,
    load_checkpoint,
)

pytestmark = pytest.mark.spark

BATCH = 32


def local_run(distributed, features, labels, method, iterations, micro_batches, **options):
    validation = options.pop("validation", None)
    local = LocalOptimizer(
        network(features.dtype),
        distributed.local_reference_dataset(features, labels),
        nn.NLLLoss(),
        method,
        batch_size=BATCH,
        end_trigger=MaxIteration(iterations),
        progress=False,
        micro_batches=micro_batches,
        seed=0,
    )
    if validation is not None:
        local.set_validation(SeveralIteration(2), validation, [Top1Accuracy(), Loss()])
    for name, value in options.items():
        getattr(local, name)(*value)
    return local.optimize(), local


def test_a_pipeline_trains_validates_and_checkpoints_its_stages_as_the_local_loop(spark, tmp_path):
    features, labels = blobs()
    pairs = spark.sparkContext.parallelize(list(zip(features, labels, strict=True)), 2)

    def pipeline_run(end, resume=None):
        optimizer = DistriOptimizer(
            network(),
            (features, labels),
            nn.NLLLoss(),
            SGD(lr=0.1, momentum=0.9),
            batch_size=BATCH,
            end_trigger=MaxIteration(end),
            iterations_per_job=2,
            update=Pipeline(stages=2, micro_batches=4),
            progress=False,
        )
        if resume is None:
            optimizer.set_validation(SeveralIteration(2), pairs, [Top1Accuracy(), Loss()])
            optimizer.set_checkpoint(str(tmp_path), SeveralIteration(2))
        else:
            optimizer.resume_from(resume)
        return optimizer

    with pipeline_run(4) as distributed:
        trained = distributed.optimize()
        reports = distributed.runner.mode.last_reports
        layout = distributed.runner.mode.layout
    assert distributed.num_partitions == 2
    local, local_optimizer = local_run(
        distributed,
        features,
        labels,
        SGD(lr=0.1, momentum=0.9),
        4,
        4,
        validation=(features, labels),
    )
    assert np.abs(flat(trained) - flat(local)).max() <= 1e-5 * np.abs(flat(local)).max()
    for name, value in local.state_dict().items():  # BatchNorm's statistics too
        np.testing.assert_allclose(
            np.asarray(trained.state_dict()[name]), np.asarray(value), atol=1e-5, err_msg=name
        )
    accuracy, loss = distributed.last_validation
    assert accuracy.value == local_optimizer.last_validation[0].value
    assert loss.value == pytest.approx(local_optimizer.last_validation[1].value, rel=1e-5)

    # Each stage's optimizer state is its own slice: the checkpoint's shards, in partition
    # order, are the stages' slices (momentum: one value per weight).
    stage_sizes = [b - a for a, b in zip(layout.offsets, layout.offsets[1:], strict=False)]
    checkpoint = load_checkpoint(str(tmp_path))
    assert checkpoint.iteration == 4
    shards = checkpoint.metadata["optim_layout"]["shards"]
    assert len(shards) == 2
    momentum = [
        checkpoint.arrays[name].size
        for name in sorted(checkpoint.arrays)
        if name.startswith("optim/") and "momentum" in name
    ]
    assert sorted(momentum) == sorted(stage_sizes)
    # Each partition held its stage's parameters, gradients and momentum: no more.
    itemsize = np.dtype(np.float32).itemsize
    assert [report.memory.parameters for report in reports] == [s * itemsize for s in stage_sizes]
    assert [report.memory.optimizer for report in reports] == [s * itemsize for s in stage_sizes]
    assert all(len(report.ticks) == layout.plan.chain_ticks(2) for report in reports)

    # Resumed at iteration 2 (another run, new Python workers' caches): bit-exact.
    at_two = next(p for p in list_checkpoints(str(tmp_path)) if load_checkpoint(p).iteration == 2)
    with pipeline_run(4, resume=at_two) as resumed:
        again = resumed.optimize()
    for name, value in trained.state_dict().items():
        np.testing.assert_array_equal(np.asarray(again.state_dict()[name]), np.asarray(value))


def test_replicas_recompute_in_float64_under_both_clippings(spark):
    """Two pipelines of two stages (four partitions take turns on local[2]'s two threads),
    Adam, constant and global-norm clipping (the squares tick), recomputation."""
    features, labels = blobs()
    features = features.astype(np.float64)
    with DistriOptimizer(
        network(np.float64),
        (features, labels),
        nn.NLLLoss(),
        Adam(lr=0.01),
        batch_size=BATCH,
        end_trigger=MaxIteration(3),
        update=Pipeline(stages=2, micro_batches=2, replicas=2, split=[4], recompute=True),
        progress=False,
    ) as distributed:
        distributed.set_constant_gradient_clipping(-0.5, 0.5)
        distributed.set_gradient_clipping_by_l2_norm(0.3)
        trained = distributed.optimize()
    local, _ = local_run(
        distributed,
        features,
        labels,
        Adam(lr=0.01),
        3,
        4,
        set_constant_gradient_clipping=(-0.5, 0.5),
        set_gradient_clipping_by_l2_norm=(0.3,),
    )
    assert distributed.num_partitions == 4
    assert np.abs(flat(trained) - flat(local)).max() <= 1e-10 * np.abs(flat(local)).max()


# --- errors, before any data is cached (no Spark job) ----------------------------------------


def optimizer_for(model, update, batch_size=BATCH, **options):
    features, labels = blobs()
    return DistriOptimizer(
        model, (features, labels), nn.NLLLoss(), SGD(lr=0.1), batch_size, update=update, **options
    )


@pytest.mark.parametrize(
    "model, update, options, message",
    [
        (network(), Pipeline(stages=9), {}, "needs at least 9 layers to cut between; the model"),
        (network(), Pipeline(2, micro_batches=5), {}, "batch_size 32 is not a multiple of"),
        (network(), Pipeline(2, 4, replicas=3), {}, "replicas x micro_batches = 3 x 4"),
        (network(), Pipeline(2), {"num_partitions": 3}, "trains on 2 partitions"),
        (network(), Pipeline(2, split=[2, 3]), {}, "must name 1 cut points"),
        (nn.Linear(10, 3), Pipeline(2), {}, "cuts an nn.Sequential or a graph Model"),
    ],
)
def test_what_cannot_be_pipelined_is_named(spark, model, update, options, message):
    with pytest.raises(ValueError, match=message):
        optimizer_for(model, update, **options)


def test_a_graph_that_is_no_chain_is_named(spark):
    x = nn.Input(shape=(10,))
    branch = nn.LogSoftmax()(nn.Linear(10, 10)(nn.Tanh()(x)))
    model = nn.Model(x, nn.Add()(x, branch))  # the input lives to the last layer
    with pytest.raises(ValueError, match="needs at least 2 layers to cut between"):
        optimizer_for(model, Pipeline(2))


@pytest.mark.parametrize(
    "update, message",
    [
        ("pipeline:0", "stages must be a positive integer"),
        ("pipeline:2:0", "micro_batches must be a positive integer"),
        ("pipeline:2:2:2:2", "takes no such settings"),
    ],
)
def test_bad_settings_are_named(update, message):
    with pytest.raises(ValueError, match=message):
        optimizer_for(network(), update)


class _Setup:
    """What Pipeline.prepare reads of the loop's setup (no Spark)."""

    def __init__(self, executors):
        self.model = network()
        self.batch_size = BATCH
        self.training_set = type("TrainingSet", (), {"executors": executors})()
        self.training_set.data = type("Data", (), {"sc": None})()


class _Spec:
    gradient_accumulation = 1
    l2_clipping = None


def test_executors_without_a_shared_disk_or_too_few_slots_are_refused(monkeypatch):
    pipeline = Pipeline(stages=3)
    with pytest.raises(ValueError, match="BIGDL_PY_STATE_DIR"):
        pipeline.prepare(_Spec(), _Setup(Executors(shared_disk=False, local_mode=False)))
    monkeypatch.setattr("bigdl_py.spark.session.task_slots", lambda sc: 2)
    with pytest.raises(ValueError, match="needs 3 task slots, one a stage, and the cluster has 2"):
        pipeline.prepare(_Spec(), _Setup(Executors(shared_disk=True, local_mode=False)))
    spec = _Spec()
    spec.gradient_accumulation = 2
    with pytest.raises(ValueError, match="leave gradient_accumulation at 1"):
        pipeline.prepare(spec, _Setup(Executors(shared_disk=True, local_mode=True)))


def test_a_pipelines_checkpoint_resumes_in_any_mode():
    """Its shards follow the stages; another mode re-cuts them into its own slices."""
    pipeline = Pipeline(stages=2, split=[4])
    model = network()
    pipeline.plan(model, BATCH, False, [0, 4, 8])
    size = pipeline.layout.offsets[-1]
    whole = {"momentum": np.arange(size, dtype=np.float32), "step": 3}
    shards = TrainingMode().resume_states([whole], size, 2)  # balanced halves
    cut = pipeline.resume_states(shards, size, 2)
    stage = pipeline.layout.offsets[1]
    np.testing.assert_array_equal(cut[0]["momentum"], whole["momentum"][:stage])
    np.testing.assert_array_equal(cut[1]["momentum"], whole["momentum"][stage:])
    saved = [pipeline.checkpoint_state(cut[p], p, None) for p in (0, 1)]
    back = TrainingMode().resume_states(saved, size, 2)
    np.testing.assert_array_equal(
        np.concatenate([back[0]["momentum"], back[1]["momentum"]]), whole["momentum"]
    )
    assert back[0]["momentum"].size == (size + 1) // 2 and back[0]["step"] == 3  # balanced


def test_the_spark_ml_estimator_trains_a_pipeline(spark):
    from pyspark.ml.linalg import Vectors

    from bigdl_py.spark.ml import NNClassifier

    features, labels = blobs()
    rows = [(Vectors.dense(f.tolist()), float(y)) for f, y in zip(features, labels, strict=True)]
    frame = spark.createDataFrame(rows, ["features", "label"])
    classifier = (
        NNClassifier(network(), nn.NLLLoss())
        .setBatchSize(BATCH)
        .setEndWhen(MaxIteration(8))
        .setOptimMethod(Adam(lr=0.05))
        .setUpdateMode(Pipeline(stages=2, micro_batches=2))
    )
    assert classifier.getUpdateMode() == "pipeline:2:2:1"
    with pytest.raises(ValueError, match="updateMode: a Pipeline with split="):
        classifier.copy().setUpdateMode(Pipeline(2, split=[4]))
    predicted = classifier.fit(frame).transform(frame).select("label", "prediction").collect()
    accuracy = np.mean([row["label"] == row["prediction"] for row in predicted])
    assert accuracy > 0.9
