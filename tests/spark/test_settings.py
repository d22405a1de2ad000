"""DistriOptimizer's Spark settings: checked when made, and the run planned from them and
the executors."""

from __future__ import annotations

import dataclasses

import pytest

from bigdl_py.spark import LocalSGD
from bigdl_py.spark.records import iterations_with_carried_rows
from bigdl_py.spark.settings import (
    DEFAULT_ITERATIONS_PER_JOB,
    Executors,
    SparkTrainingSettings,
    plan_run,
)

ONE_HOST = Executors(shared_disk=True, local_mode=False)
SEPARATE_HOSTS = Executors(shared_disk=False, local_mode=False)
LOCAL = Executors(shared_disk=True, local_mode=True)


@pytest.mark.parametrize(
    "setting, value, message",
    [
        ("gradient_accumulation", 0, "gradient_accumulation must be a positive integer"),
        ("gradient_accumulation", True, "gradient_accumulation must be a positive integer"),
        ("iterations_per_job", 0, "iterations_per_job must be an integer from 1 to 32"),
        ("iterations_per_job", 33, "iterations_per_job must be an integer from 1 to 32"),
        ("iterations_per_job", True, "iterations_per_job must be an integer from 1 to 32"),
        ("iterations_per_job", 2.5, "iterations_per_job must be an integer from 1 to 32"),
        ("update", "averaged", "update must be one of"),
        ("update", "local-sgd:x", "must be integers"),
        ("wire_dtype", "int8", "wire_dtype must be None"),
        ("device", "tpu", "unknown device 'tpu'"),
    ],
)
def test_a_bad_setting_is_named(setting, value, message):
    with pytest.raises(ValueError, match=message):
        SparkTrainingSettings(**{setting: value})


def test_settings_are_normalised_and_frozen():
    settings = SparkTrainingSettings(wire_dtype="float32", device="GPU", gradient_accumulation=2)
    assert (settings.wire_dtype, settings.device, settings.gradient_accumulation) == (
        None,
        "gpu",
        2,
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.update = "sharded"


LENET_SHARE_BYTES = 64 * (28 * 28 * 4 + 8)  # a half of a global batch of 128 Fashion-MNIST images


def plan(
    settings,
    executors,
    parameter_bytes=400_000,
    partitions=2,
    clipping=False,
    share_bytes=LENET_SHARE_BYTES,
):
    return plan_run(
        settings,
        executors,
        parameter_bytes=parameter_bytes,
        num_partitions=partitions,
        global_norm_clipping=clipping,
        share_bytes=share_bytes,
    )


def test_a_named_mode_chains_on_every_cluster():
    sharded = SparkTrainingSettings(update="sharded")
    chained = plan(sharded, ONE_HOST)
    assert (chained.mode.name, chained.iterations_per_job) == (
        "sharded",
        DEFAULT_ITERATIONS_PER_JOB,
    )
    # Without a shared disk too: the shares of the later iterations travel with the chain.
    assert plan(sharded, SEPARATE_HOSTS).iterations_per_job == DEFAULT_ITERATIONS_PER_JOB
    given = SparkTrainingSettings(update="replicated", iterations_per_job=5)
    assert plan(given, SEPARATE_HOSTS).iterations_per_job == 5
    assert plan(given, ONE_HOST).reason is None


def test_large_shares_shorten_the_chains_where_no_disk_is_shared():
    # 6 MB shares (ImageNet-sized images): two of them fit the 16 MB carried with a chain.
    assert iterations_with_carried_rows(6 << 20) == 3
    sharded = SparkTrainingSettings(update="sharded")
    assert plan(sharded, SEPARATE_HOSTS, share_bytes=6 << 20).iterations_per_job == 3
    assert plan(sharded, ONE_HOST, share_bytes=6 << 20).iterations_per_job == 8
    huge = plan(SparkTrainingSettings(), SEPARATE_HOSTS, share_bytes=40 << 20)
    assert (huge.mode.name, huge.iterations_per_job) == ("replicated", 1)


def test_each_run_gets_its_own_copy_of_a_mode_object():
    mode = LocalSGD(period=4, warmup_iterations=2)
    planned = plan(SparkTrainingSettings(update=mode), ONE_HOST).mode
    assert planned is not mode and repr(planned) == repr(mode)


def test_auto_plans_by_its_rule_and_says_why():
    auto = SparkTrainingSettings()
    local = plan(auto, LOCAL)
    assert local.mode.name == "one-task" and "local mode" in local.reason
    cluster = plan(auto, SEPARATE_HOSTS)
    assert (cluster.mode.name, cluster.iterations_per_job) == ("replicated", 16)
    assert "executors without a shared disk" in cluster.reason
    large = plan(auto, ONE_HOST, parameter_bytes=64 << 20)
    assert (large.mode.name, large.iterations_per_job) == ("sharded", 1)
