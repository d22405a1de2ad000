"""Training modes as objects: float64 models in every mode, ``update="auto"``'s choice, and
``LocalSGD`` against references written without Spark.
"""

from __future__ import annotations

import copy
import logging

import numpy as np
import pytest
from blob_data import (
    BATCH,
    blob_optimizer,
    blobs,
    classifier,
    first_iterations,
    flat,
    relative_error,
)

from bigdl_py import nn
from bigdl_py.autograd.tensor import Tensor
from bigdl_py.optim import SGD, Adam
from bigdl_py.optim.flat_parameters import FlatParameters
from bigdl_py.optim.sharding import all_slice_bounds
from bigdl_py.spark import LocalSGD
from bigdl_py.spark.modes import resolve_mode
from bigdl_py.spark.modes.auto import choose_mode
from bigdl_py.train import EveryEpoch, LocalOptimizer, MaxIteration

# --- no Spark: the mode registry and the automatic choice ------------------------------------


def test_modes_are_registered_by_name_and_unknown_names_are_refused():
    assert resolve_mode("sharded").name == "sharded"
    assert resolve_mode("replicated").name == "replicated"
    assert isinstance(resolve_mode("local-sgd"), LocalSGD)
    mode = LocalSGD(period=4)
    assert resolve_mode(mode) is mode
    with pytest.raises(ValueError, match="update must be one of"):
        resolve_mode("averaged")


@pytest.mark.parametrize(
    "period, warmup", [(0, 0), (-1, 0), (2.5, 0), (True, 0), (4, -1), (4, 1.5)]
)
def test_local_sgd_refuses_bad_settings(period, warmup):
    with pytest.raises(ValueError, match="LocalSGD: (period|warmup_iterations)"):
        LocalSGD(period=period, warmup_iterations=warmup)


def test_local_sgd_rounds_end_every_period_after_warmup_and_at_the_chains_end():
    mode = LocalSGD(period=3, warmup_iterations=2)
    # iterations 2..9: averaging after 4 and 7 ((t + 1 - 2) % 3 == 0), and after 9 (the end)
    assert mode.rounds(2, 8) == [(0, 3), (3, 6), (6, 8)]
    assert mode.steps_to_run(0, 8) <= 2  # warm-up never shares a job with local rounds


def test_local_sgd_without_chaining_runs_one_round_per_job():
    # Executors without a shared disk (one iteration per job requested): a job that starts
    # mid-round, after one that ended at an epoch, stops at that round's end, so no job has
    # two round stages (the second could run on a host without the first one's state).
    mode = LocalSGD(period=4)
    assert mode.iterations_per_call(1, None) == 4
    assert mode.steps_to_run(7, 4) == 1  # iteration 7 ends the round 4..7
    assert mode.steps_to_run(8, 4) == 4
    warm = LocalSGD(period=4, warmup_iterations=2)
    warm.iterations_per_call(1, None)
    assert warm.steps_to_run(3, 4) == 3  # rounds 2..5, 6..9
    chained = LocalSGD(period=4)
    chained.iterations_per_call(16, None)
    assert chained.steps_to_run(7, 16) == 16  # a shared disk: whole chains of rounds


def test_checkpoint_states_move_between_modes_and_partition_counts():
    """Slices (sharded, replicated) are joined and re-cut; local SGD's whole per-partition
    states are kept as they are for the same count, else averaged into one."""
    momentum = np.arange(10, dtype=np.float32)
    slices = [{"momentum": momentum[a:b], "step": 3} for a, b in all_slice_bounds(10, 2)]
    three = resolve_mode("sharded").resume_states(slices, 10, 3)
    np.testing.assert_array_equal(np.concatenate([s["momentum"] for s in three]), momentum)
    assert [len(s["momentum"]) for s in three] == [4, 3, 3]
    local = LocalSGD(period=2)
    replicated = local.resume_states(slices, 10, 2)
    assert all(np.array_equal(s["momentum"], momentum) for s in replicated)
    own = [{"momentum": momentum + j, "step": 3} for j in range(2)]
    assert local.resume_states(own, 10, 2)[1]["momentum"][0] == 1  # each keeps its own
    averaged = resolve_mode("replicated").resume_states(own, 10, 2)
    np.testing.assert_allclose(np.concatenate([s["momentum"] for s in averaged]), momentum + 0.5)


def test_auto_picks_replicated_for_small_models_and_sharded_for_large_ones():
    lenet = choose_mode(89_000, 2, shared_disk=True, global_norm_clipping=False)
    assert (lenet.update, lenet.iterations_per_job) == ("replicated", 16)
    assert (
        lenet.reason
        == "update: replicated, 16 iterations per job: 0.09 MB of parameters, 2 partitions"
    )
    big = choose_mode(64 << 20, 2, shared_disk=True, global_norm_clipping=True)
    assert (big.update, big.iterations_per_job) == ("sharded", 1)
    # Without a shared disk the rows travel with the chain: LeNet's shares chain as well.
    apart = choose_mode(89_000, 2, False, False, share_bytes=64 * 3144)
    assert apart.iterations_per_job == 16
    assert choose_mode(89_000, 2, False, False, share_bytes=12 << 20).iterations_per_job == 2
    given = choose_mode(
        89_000, 4, shared_disk=True, global_norm_clipping=False, iterations_per_job=4
    )
    assert given.iterations_per_job == 4
    # The threshold counts what one partition receives: N whole gradients.
    assert choose_mode(5 << 20, 2, True, False).update == "replicated"
    assert choose_mode(5 << 20, 4, True, False).update == "sharded"


def test_auto_picks_one_task_in_local_mode_whatever_the_model():
    sizes = ((89_000, 128), (1 << 20, 128), (4 << 20, 64), (16 << 20, 64), (45 << 20, 4))
    for parameter_bytes, per_job in sizes:
        choice = choose_mode(parameter_bytes, 2, True, False, local_mode=True)
        assert (choice.update, choice.iterations_per_job) == ("one-task", per_job)
    assert choose_mode(89_000, 2, True, True, local_mode=True).update == "one-task"
    assert choose_mode(89_000, 2, True, False, 200, local_mode=True).iterations_per_job == 200
    assert choose_mode(89_000, 2, True, False, local_mode=True).reason == (
        "update: one-task, 128 iterations per job: local mode, 2 partitions on one machine "
        "train in one task (0.09 MB of parameters)"
    )


# --- on Spark ------------------------------------------------------------------------------------


def double_blobs():
    features, labels = blobs()
    return features.astype(np.float64), labels


def double_classifier():
    return classifier().double()


@pytest.mark.spark
@pytest.mark.parametrize(
    "update, per_job, clip",
    [
        ("sharded", 1, False),
        ("sharded", 1, True),
        ("sharded", 4, False),
        ("replicated", 4, True),
        ("one-task", 4, True),
    ],
)
def test_float64_models_train_in_every_mode_as_locally(spark, update, per_job, clip):
    """The one-iteration path, the two-job clipped path and chains all keep float64."""
    features, labels = double_blobs()
    distributed = DistriOptimizer_(
        double_classifier(), (features, labels), update=update, iterations_per_job=per_job
    )
    local = LocalOptimizer(
        double_classifier(),
        distributed.local_reference_dataset(features, labels),
        nn.NLLLoss(),
        Adam(lr=0.01),
        batch_size=BATCH,
        end_trigger=MaxIteration(10),
        progress=False,
    )
    for optimizer in (distributed, local):
        if clip:
            optimizer.set_constant_gradient_clipping(-0.5, 0.5)
            optimizer.set_gradient_clipping_by_l2_norm(0.3)
    with distributed:
        trained = distributed.optimize()
    assert all(p.data.dtype == np.float64 for p in trained.parameters())
    expected = flat(local.optimize())
    assert relative_error(flat(trained), expected) <= 1e-10
    assert relative_error(flat(trained), flat(double_classifier())) > 1e-2


def DistriOptimizer_(model, data, method=None, **options):  # noqa: N802 (reads as the class)
    from bigdl_py.spark import DistriOptimizer

    options = {
        "batch_size": BATCH,
        "end_trigger": MaxIteration(10),
        "num_partitions": 3,
        "progress": False,
        **options,
    }
    return DistriOptimizer(model, data, nn.NLLLoss(), method or Adam(lr=0.01), **options)


@pytest.mark.spark
def test_auto_is_the_default_and_logs_its_choice_once(spark, caplog):
    with caplog.at_level(logging.INFO, logger="bigdl_py.spark"):
        with blob_optimizer(Adam(lr=0.01), end_trigger=MaxIteration(3), num_partitions=2) as run:
            run.optimize()
            assert run.runner.mode.name == "one-task"  # the tests' session is local[2]
    choices = [r.getMessage() for r in caplog.records if r.getMessage().startswith("update:")]
    assert choices == [
        "update: one-task, 128 iterations per job: local mode, 2 partitions on one machine "
        "train in one task (0.00 MB of parameters)"
    ]


@pytest.mark.spark
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_one_task_trains_the_global_batches_of_the_exact_modes(spark, dtype):
    """One task per job trains the 3 partitions' shares on 2 threads (partitions 0-1, then
    2): LocalOptimizer over the planned batches and the replicated update's weights to float
    rounding, and one Spark job per chain (10 iterations: an epoch of 7 batches, then 3)."""
    features, labels = blobs()
    features = features.astype(dtype)

    def run(update):
        model = classifier().to(dtype=dtype)
        method = SGD(lr=0.1, momentum=0.9, weight_decay=1e-3)
        optimizer = DistriOptimizer_(model, (features, labels), method, update=update)
        jobs = []
        run_iterations = optimizer.runner.run_iterations

        def recorded(steps, stop_after_nonfinite):
            jobs.append(len(steps))
            return run_iterations(steps, stop_after_nonfinite)

        optimizer.runner.run_iterations = recorded
        with optimizer:
            return flat(optimizer.optimize()), optimizer, jobs

    one, optimizer, jobs = run("one-task")
    local = LocalOptimizer(
        classifier().to(dtype=dtype),
        optimizer.local_reference_dataset(features, labels),
        nn.NLLLoss(),
        SGD(lr=0.1, momentum=0.9, weight_decay=1e-3),
        batch_size=BATCH,
        end_trigger=MaxIteration(10),
        progress=False,
    )
    tolerance = 1e-6 if dtype == np.float32 else 1e-12
    assert relative_error(one, flat(local.optimize())) <= tolerance
    replicated, _, _ = run("replicated")
    assert relative_error(one, replicated) <= tolerance
    assert relative_error(one, flat(classifier())) > 1e-2
    assert jobs == [7, 3]  # an epoch's end ends a job; nothing else does


@pytest.mark.spark
def test_one_task_draws_each_partitions_dropout_stream_on_its_thread(spark):
    """Two partitions on two threads: each replica draws partition j's dropout masks (its
    own generator in its own thread), so the weights are the replicated update's."""
    features, labels = blobs()

    def dropout_classifier():
        with nn.init.seeded(1):
            return nn.Sequential(
                nn.Linear(10, 16), nn.Tanh(), nn.Dropout(0.3), nn.Linear(16, 3), nn.LogSoftmax()
            )

    def run(update):
        with DistriOptimizer_(
            dropout_classifier(), (features, labels), SGD(lr=0.1), update=update, num_partitions=2
        ) as optimizer:
            return flat(optimizer.optimize())

    one_task, replicated = run("one-task"), run("replicated")
    assert relative_error(one_task, replicated) <= 1e-6
    assert relative_error(one_task, flat(dropout_classifier())) > 1e-2


@pytest.mark.spark
def test_one_task_trains_the_same_on_threads_as_in_processes(spark):
    """device="auto" (a GPU where a task has one; the CPU here) keeps the second replica on
    a thread of the task, device="cpu" forks it a process: the same weights, to float32
    rounding (a thread and a forked process may split BLAS's work differently)."""
    features, labels = blobs()

    def run(device):
        with DistriOptimizer_(
            classifier(), (features, labels), update="one-task", num_partitions=2, device=device
        ) as optimizer:
            return flat(optimizer.optimize())

    in_processes, on_threads = run("cpu"), run("auto")
    assert relative_error(in_processes, on_threads) <= 1e-6
    assert relative_error(in_processes, flat(classifier())) > 1e-2


@pytest.mark.spark
def test_one_task_needs_executors_that_share_a_disk():
    from bigdl_py.spark.modes.one_task import OneTask
    from bigdl_py.spark.replica import RunSpec

    spec = RunSpec("run", None, None, None, 2, 10, 8, None, carry_state=True)
    with pytest.raises(ValueError, match="one-task.*share a disk"):
        OneTask().iterations_per_call(8, spec)


def test_one_task_jobs_are_shorter_for_large_models():
    from bigdl_py.spark.modes.one_task import OneTask
    from bigdl_py.spark.replica import RunSpec

    def per_call(parameters, requested):
        return OneTask().iterations_per_call(
            requested, RunSpec("run", None, None, None, 2, parameters, 8, None)
        )

    assert per_call(89_000 // 4, 8) == 128  # a small model: 128 a job at least
    assert per_call(1_100_000, 8) == 64  # the CIFAR CNN (4.4 MB): 64
    assert per_call(11_200_000, 4) == 4  # ResNet-18: seconds an iteration
    assert per_call(11_200_000, 8) == 8  # a longer chain asked for is kept


def test_partitions_in_order_gathers_rows_across_partitions():
    from bigdl_py.spark.modes.one_task import PartitionsInOrder

    parts = [np.arange(6).reshape(3, 2), np.arange(6, 10).reshape(2, 2)]
    joined = PartitionsInOrder(parts)
    assert joined.shape == (5, 2) and len(joined) == 5
    indices = np.array([4, 0, 3, 2])
    np.testing.assert_array_equal(joined[indices], np.concatenate(parts)[indices])


@pytest.mark.spark
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_local_sgd_with_period_1_equals_synchronous_sgd(spark, dtype):
    """4 partitions: shares of 8/8/7/7, so the average's weights b_j / B matter."""
    features, labels = blobs()
    features = features.astype(dtype)

    def run(update):
        model = classifier().to(dtype=dtype)
        method = SGD(lr=0.1, momentum=0.9, weight_decay=1e-3)
        with DistriOptimizer_(
            model,
            (features, labels),
            method,
            update=update,
            num_partitions=4,
            iterations_per_job=5,
            end_trigger=MaxIteration(9),  # jobs of 1-5, 6-7 (the epoch's end) and 8-9
        ) as optimizer:
            return flat(optimizer.optimize())

    local_sgd, synchronous = run(LocalSGD(period=1)), run("replicated")
    assert relative_error(local_sgd, synchronous) <= 1e-5
    assert relative_error(synchronous, flat(classifier())) > 1e-2


def local_sgd_reference(model, method, features, labels, plan, iterations, period, warmup):
    """Post-local SGD in plain NumPy steps: exact SGD for ``warmup`` iterations, then every
    partition steps its own copy with its own optimizer on its own share, and the copies are
    averaged (weighted by share) every ``period`` iterations and at every epoch's end."""
    flat_parameters = FlatParameters(model)
    criterion = nn.NLLLoss()
    count = plan.num_partitions
    bounds = all_slice_bounds(len(labels), count)
    data = [(features[a:b], labels[a:b]) for a, b in bounds]
    fractions = np.array(plan.share_sizes, dtype=np.float64) / plan.batch_size

    def gradient(weights, partition, indices):
        flat_parameters.load(weights)
        flat_parameters.zero_grad()
        x, y = data[partition]
        criterion(model(Tensor(np.asarray(x[indices]))), np.asarray(y[indices])).backward()
        return np.array(flat_parameters.gradients)

    weights = [np.array(flat_parameters.weights) for _ in range(count)]
    methods = [method]
    for iteration in range(iterations):
        epoch = plan.epoch_of(iteration)
        shares = plan.shares(iteration)
        if iteration < warmup:
            summed = sum(fractions[j] * gradient(weights[0], j, shares[j]) for j in range(count))
            methods[0].schedule_step(iteration=iteration, epoch=epoch)
            methods[0].step(weights[0], summed.astype(weights[0].dtype))
            weights = [weights[0].copy() for _ in range(count)]
            continue
        if len(methods) == 1:  # the end of warm-up: every partition its own state
            methods = [copy.deepcopy(method) for _ in range(count)]
        for j in range(count):
            grad = gradient(weights[j], j, shares[j])
            methods[j].schedule_step(iteration=iteration, epoch=epoch)
            methods[j].step(weights[j], grad)
        boundary = (iteration + 1 - warmup) % period == 0
        epoch_end = (iteration + 1) % plan.iterations_per_epoch == 0
        if boundary or epoch_end or iteration == iterations - 1:
            average = sum(fractions[j] * weights[j] for j in range(count))
            weights = [average.astype(weights[0].dtype) for _ in range(count)]
    return weights[0]


@pytest.mark.spark
def test_local_sgd_equals_per_shard_steps_plus_averaging(spark):
    features, labels = blobs()
    mode = LocalSGD(period=3, warmup_iterations=2)
    with DistriOptimizer_(
        classifier(),
        (features, labels),
        Adam(lr=0.01),
        update=mode,
        num_partitions=4,
        iterations_per_job=8,
        end_trigger=MaxIteration(17),
    ) as optimizer:
        result = flat(optimizer.optimize())
        plan = optimizer.training_set.plan
    expected = local_sgd_reference(
        classifier(), Adam(lr=0.01), features, labels, plan, 17, period=3, warmup=2
    )
    assert relative_error(result, expected) <= 1e-5
    assert relative_error(result, flat(classifier())) > 1e-2


@pytest.mark.spark
def test_local_sgd_checkpoints_resume_bit_exactly(spark, tmp_path):
    """Checkpoints come at averaging boundaries (every epoch of 7 iterations here) and hold
    every partition's own optimizer state."""

    def optimizer(end):
        return blob_optimizer(
            Adam(lr=0.01),
            end_trigger=end,
            num_partitions=3,
            update=LocalSGD(period=2, warmup_iterations=3),
            iterations_per_job=4,
        )

    with optimizer(MaxIteration(21)) as straight:
        straight.set_checkpoint(str(tmp_path), EveryEpoch())  # the two newest: 14 and 21
        expected = flat(straight.optimize())
    with optimizer(MaxIteration(21)) as resumed:
        resumed.resume_from(str(tmp_path / "checkpoint-00000014.json"))
        firsts = first_iterations(resumed)
        result = flat(resumed.optimize())
    assert firsts[0] == 14  # it went on from the checkpoint
    np.testing.assert_array_equal(result, expected)
