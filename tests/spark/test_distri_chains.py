"""Several iterations per Spark job, and the replicated update, against the one-job-per-
iteration sharded path and LocalOptimizer.

A chain must be invisible in the results: the same weights, the validation and checkpoints
at the same iterations, a non-finite loss stopping at the same batch with the weights of
the batch before it, checkpoints that resume across update modes.
"""

from __future__ import annotations

import numpy as np
import pytest
from blob_data import (
    BATCH,
    blob_optimizer,
    blobs,
    classifier,
    flat,
    relative_error,
    shuffle_files,
    wait_until_deleted,
)

from bigdl_py import nn
from bigdl_py.optim import SGD, Adam, DistriOptimizer
from bigdl_py.spark.owner_update import ShardStateStore
from bigdl_py.train import (
    EveryEpoch,
    LocalOptimizer,
    MaxEpoch,
    MaxIteration,
    MinLoss,
    NonFiniteLossError,
    SeveralIteration,
    Top1Accuracy,
    load_checkpoint,
)

pytestmark = pytest.mark.spark


def record_calls(optimizer):
    """The iteration numbers each run_iterations call took, and when validation ran."""
    calls, validated = [], []
    runner = optimizer.runner
    run_iterations, evaluate = runner.run_iterations, runner.evaluate

    def recorded_run(steps, stop_after_nonfinite):
        calls.append([step.iteration + 1 for step in steps])
        return run_iterations(steps, stop_after_nonfinite)

    def recorded_evaluate(*arguments, **options):
        validated.append(optimizer.state.iteration)
        return evaluate(*arguments, **options)

    runner.run_iterations, runner.evaluate = recorded_run, recorded_evaluate
    return calls, validated


@pytest.mark.parametrize("update", ["sharded", "replicated", "one-task"])
@pytest.mark.parametrize(
    "partitions, method, clip", [(3, "adam", False), (2, "sgd", True), (1, "sgd", False)]
)
def test_chains_equal_local_training_with_triggers_in_place(
    spark, tmp_path, update, partitions, method, clip
):
    features, labels = blobs()
    make_method = {
        "adam": lambda: Adam(lr=0.01),
        "sgd": lambda: SGD(lr=0.1, momentum=0.9),
    }[method]
    distributed = DistriOptimizer(
        classifier(),
        (features, labels),
        nn.NLLLoss(),
        make_method(),
        batch_size=BATCH,
        end_trigger=MaxIteration(15),
        num_partitions=partitions,
        iterations_per_job=8,
        update=update,
        progress=False,
    )
    local = LocalOptimizer(
        classifier(),
        distributed.local_reference_dataset(features, labels),
        nn.NLLLoss(),
        make_method(),
        batch_size=BATCH,
        end_trigger=MaxIteration(15),
        progress=False,
    )
    for optimizer in (distributed, local):
        optimizer.set_validation(SeveralIteration(6), (features, labels), [Top1Accuracy()])
        if clip:
            optimizer.set_constant_gradient_clipping(-0.5, 0.5)
            optimizer.set_gradient_clipping_by_l2_norm(0.3)
    distributed.set_checkpoint(str(tmp_path), SeveralIteration(5))
    calls, validated = record_calls(distributed)
    with distributed:
        result = flat(distributed.optimize())
    assert relative_error(result, flat(local.optimize())) <= 1e-5
    assert validated == [6, 12]
    assert load_checkpoint(str(tmp_path)).iteration == 15
    assert [i for call in calls for i in call] == list(range(1, 16))
    if clip and update == "sharded":  # the global norm takes a job of its own
        assert all(len(call) == 1 for call in calls)
    else:  # chains, ending where a trigger fires or an epoch ends (7 batches per epoch)
        assert max(len(call) for call in calls) > 1
        assert {call[-1] for call in calls} == {5, 6, 7, 10, 12, 14, 15}


@pytest.mark.parametrize("update, iterations_per_job", [("sharded", 1), ("replicated", 8)])
def test_each_jobs_shuffle_files_are_deleted_after_it(
    spark, monkeypatch, update, iterations_per_job
):
    """Without the deletion a chain of 8 leaves 2 x 8 x 2 files per partition pair until
    the driver JVM's garbage collector runs (a minute or more): thousands in long runs."""
    from bigdl_py.spark import collectives

    sc = spark.sparkContext
    before = shuffle_files(sc)
    seen_before_deletion: list[set[str]] = []
    delete = collectives.delete_shuffle_files

    def delete_and_record(rdd):
        seen_before_deletion.append(shuffle_files(sc) - before)
        delete(rdd)

    monkeypatch.setattr(collectives, "delete_shuffle_files", delete_and_record)
    with blob_optimizer(
        SGD(lr=0.1),
        end_trigger=MaxIteration(16),
        num_partitions=2,
        iterations_per_job=iterations_per_job,
        update=update,
    ) as optimizer:
        optimizer.optimize()
    # one job per iteration, or chains ending at the epoch ends (7 batches) and at 16
    jobs = {1: 16, 8: 3}[iterations_per_job]
    assert len(seen_before_deletion) == jobs
    written = set().union(*seen_before_deletion)
    # every shuffle stage: 2 map tasks, each writing a data and an index file at least
    assert len({path for path in written if path.endswith(".data")}) >= 2 * jobs
    assert wait_until_deleted(written) == set()


def diverging_run(update, iterations_per_job, skip=False):
    """SGD with a learning rate of 1e37: iteration 1 is finite, its step overflows the
    weights, and iteration 2's loss is infinite — the second iteration of a chain."""
    return blob_optimizer(
        SGD(lr=1e37, momentum=0.9),
        end_trigger=MaxIteration(6),
        num_partitions=2,
        iterations_per_job=iterations_per_job,
        update=update,
        skip_nonfinite_batches=skip,
    )


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("update", ["sharded", "replicated", "one-task"])
def test_nonfinite_loss_inside_a_chain_stops_at_that_batch(spark, update):
    weights = {}
    for iterations_per_job in (1, 8):
        with diverging_run(update, iterations_per_job) as optimizer:
            with pytest.raises(NonFiniteLossError, match=r"loss is (nan|inf) at iteration 2 "):
                optimizer.optimize()
            assert optimizer.state.iteration == 1
            weights[iterations_per_job] = flat(optimizer.model)
    assert np.isfinite(weights[8]).all()  # the weights after iteration 1, not after 2
    np.testing.assert_array_equal(weights[8], weights[1])


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("update", ["sharded", "replicated", "one-task"])
def test_skipped_nonfinite_batches_inside_a_chain(spark, update):
    with diverging_run(update, 1, skip=True) as one_by_one:
        expected = flat(one_by_one.optimize())
    with diverging_run(update, 8, skip=True) as chained:
        result = flat(chained.optimize())
    assert chained.state.skipped_batches == one_by_one.state.skipped_batches >= 1
    np.testing.assert_array_equal(result, expected)


def test_a_loss_reading_trigger_runs_one_iteration_per_job(spark):
    optimizer = blob_optimizer(
        SGD(lr=0.1), end_trigger=MaxIteration(4) | MinLoss(1e-9), num_partitions=2
    )
    calls, _ = record_calls(optimizer)
    with optimizer:
        optimizer.optimize()
    assert calls == [[1], [2], [3], [4]]


@pytest.mark.parametrize(
    "first, then",
    [
        ("sharded", "replicated"),
        ("replicated", "sharded"),
        ("one-task", "sharded"),
        ("replicated", "one-task"),
    ],
)
def test_checkpoints_resume_across_update_modes(spark, tmp_path, first, then):
    def optimizer(update, epochs):
        return blob_optimizer(
            Adam(lr=0.01), end_trigger=MaxEpoch(epochs), num_partitions=3, update=update
        )

    with optimizer(first, 2) as straight:  # its first epoch's checkpoint is resumed below
        straight.set_checkpoint(str(tmp_path), EveryEpoch())
        expected = flat(straight.optimize())
    first_epoch = load_checkpoint(str(min(tmp_path.glob("checkpoint-*.json"))))  # 0-padded
    assert 2 * first_epoch.iteration == straight.state.iteration  # the end of epoch 1 of 2
    shards = first_epoch.metadata["optim_layout"]["shards"]
    assert len(shards) == 3  # one layout, whichever update wrote it
    with optimizer(then, 2) as resumed:
        resumed.resume_from(first_epoch.path)
        calls, _ = record_calls(resumed)
        result = flat(resumed.optimize())
    assert calls[0][0] == first_epoch.iteration + 1  # it went on from the checkpoint
    assert relative_error(result, expected) <= 1e-6


def test_bad_chain_settings_fail_before_any_job(spark):
    features, labels = blobs()
    arguments = (classifier(), (features, labels), nn.NLLLoss(), SGD(lr=0.1))
    for value in (0, 33, True, 2.5):
        with pytest.raises(ValueError, match="iterations_per_job"):
            DistriOptimizer(*arguments, batch_size=BATCH, iterations_per_job=value)
    with pytest.raises(ValueError, match="update must be"):
        DistriOptimizer(*arguments, batch_size=BATCH, update="averaged")


def test_state_files_are_kept_from_a_chains_start(tmp_path):
    store = ShardStateStore(str(tmp_path), 0)
    for iteration in range(6):
        store.save(iteration, {"step": np.int64(iteration)}, retain_from=1)
    assert [store.load(i) is not None for i in range(6)] == [False] + [True] * 5
    store.save(6, {"step": np.int64(6)})  # the next single iteration: back to two files
    assert [store.load(i) is not None for i in range(7)] == [False] * 5 + [True] * 2


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("update", ["sharded", "replicated", "one-task", "local-sgd:4"])
def test_an_update_skipped_for_a_nonfinite_norm_stops_no_chain(spark, update):
    """Every mode's owner step skips an update whose global-norm scale is not finite, and
    only a non-finite loss stops a chain, as the driver judges iterations by their loss.
    (One-task stopped its chain after such a skip too, ending each job after one iteration.)

    A model at exactly 0 under the loss mean(sqrt(|output|)): the loss is 0, its gradient
    NaN (sqrt's slope is infinite at 0, |x|'s 0), so the L2 norm is NaN in every iteration."""
    features = np.random.default_rng(0).standard_normal((64, 4)).astype(np.float32)
    labels = np.zeros(64, dtype=np.int64)
    model = nn.Linear(4, 1)
    for parameter in model.parameters():
        parameter.data[...] = 0

    def sqrt_loss(output, labels):
        return output.abs().sqrt().mean()

    optimizer = DistriOptimizer(
        model,
        (features, labels),
        sqrt_loss,
        SGD(lr=0.1),
        batch_size=16,
        end_trigger=MaxIteration(8),
        num_partitions=2,
        iterations_per_job=8,
        update=update,
        progress=False,
    )
    optimizer.set_gradient_clipping_by_l2_norm(1.0)
    runner, taken = optimizer.runner, []
    run_iterations = runner.run_iterations

    def recorded(steps, stop_after_nonfinite):
        results = run_iterations(steps, stop_after_nonfinite)
        taken.append((len(steps), len(results)))
        return results

    runner.run_iterations = recorded
    with optimizer:
        optimizer.optimize()
    assert optimizer.state.iteration == 8 and optimizer.state.loss == 0.0
    if update == "sharded":  # the global norm takes it a job per iteration
        assert taken == [(1, 1)] * 8
    else:  # chains ending at the epochs' ends (4 batches an epoch)
        assert taken == [(4, 4), (4, 4)]
    assert not np.any(flat(optimizer.model))  # no update was applied
