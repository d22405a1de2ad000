"""The owners' state store: its file format and its writes in the background."""

from __future__ import annotations

import os

import numpy as np
import pytest

from bigdl_py.optim import SGD, ConstantClipping, L2NormClipping
from bigdl_py.spark import owner_update
from bigdl_py.spark.owner_update import ShardStateStore


def adam_like_state(rng):
    return {
        "step": 7,
        "lr": 0.125,
        "amsgrad": False,
        "name": "adam",
        "exp_avg": rng.standard_normal(1000).astype(np.float32),
        "exp_avg_sq": rng.standard_normal((10, 3)),
        "counts": np.arange(5, dtype=np.int16),
        "empty": np.zeros(0, dtype=np.float32),
    }


def test_a_state_comes_back_with_its_values_dtypes_and_shapes(tmp_path, rng):
    store = ShardStateStore(str(tmp_path), "shard-3")
    state = adam_like_state(rng)
    store.save(4, state)

    loaded = store.load(4)

    assert loaded.keys() == state.keys()
    for key, value in state.items():
        if isinstance(value, np.ndarray):
            assert loaded[key].dtype == value.dtype and loaded[key].shape == value.shape
            np.testing.assert_array_equal(loaded[key], value)
        else:
            assert loaded[key] == value and type(loaded[key]) is type(value)
    assert store.load(3) is None


def test_a_state_holding_python_objects_is_refused(tmp_path):
    store = ShardStateStore(str(tmp_path), 0)
    with pytest.raises(ValueError, match="'history' holds Python objects"):
        store.save(0, {"history": [1, None]})
    assert os.listdir(tmp_path) == []


def test_a_cut_file_is_an_error_not_a_short_state(tmp_path, rng):
    store = ShardStateStore(str(tmp_path), 0)
    store.save(0, adam_like_state(rng))
    with open(store.path(0), "r+b") as handle:
        handle.truncate(os.path.getsize(store.path(0)) - 8)
    with pytest.raises(RuntimeError, match="cut short"):
        store.load(0)


def test_a_task_ends_only_after_its_background_writes(tmp_path, rng):
    store = ShardStateStore(str(tmp_path), 0)
    state = adam_like_state(rng)

    def task(partition, rows):
        owner_update.save_in_background(store, partition, state, None)
        yield from rows

    rows = list(owner_update.finishing_state_writes(task)(5, iter(["a", "b"])))

    assert rows == ["a", "b"]
    np.testing.assert_array_equal(store.load(5)["exp_avg"], state["exp_avg"])


def test_a_failed_background_write_fails_the_task(tmp_path):
    store = ShardStateStore(str(tmp_path / "missing-directory"), 0)

    def task(partition, rows):
        owner_update.save_in_background(store, partition, {"step": 1}, None)
        yield from rows

    with pytest.raises(FileNotFoundError):
        list(owner_update.finishing_state_writes(task)(0, iter([1])))


# --- the owner step every mode uses -------------------------------------------------------


def owner_spec(size, constant=None, l2=None):
    from bigdl_py.spark.replica import RunSpec

    return RunSpec(
        run_id="owner-step",
        model=None,
        criterion=None,
        optim_method=None,
        num_partitions=1,
        flat_size=size,
        batch_size=8,
        state_dir=None,
        constant_clipping=constant,
        l2_clipping=l2,
    )


def momentum_sgd_after_one_step(rng, size):
    """An SGD with momentum state, at iteration 3 of epoch 1."""
    method = SGD(lr=0.1, momentum=0.9)
    method.schedule_step(iteration=3, epoch=1)
    method.step(rng.standard_normal(size), rng.standard_normal(size))
    return method


def state_of(method):
    return {k: np.array(v, copy=True) for k, v in method.state_dict().items()}


def assert_same_state(method, before):
    after = method.state_dict()
    assert after.keys() == before.keys()
    for key, value in before.items():
        np.testing.assert_array_equal(after[key], value)


def test_the_owner_step_clips_scales_and_steps_as_the_local_loop(rng):
    size = 12
    constant, l2 = ConstantClipping(-0.4, 0.4), L2NormClipping(0.5)
    weights, gradient = rng.standard_normal(size), 3 * rng.standard_normal(size)
    local_method = momentum_sgd_after_one_step(np.random.default_rng(7), size)
    owner_method = momentum_sgd_after_one_step(np.random.default_rng(7), size)

    # LocalRunner's order: each clipping on the whole vector in place, then the rule.
    local_weights, local_gradient = weights.copy(), gradient.copy()
    constant.clip_(local_gradient)
    l2.clip_(local_gradient)
    local_method.schedule_step(iteration=4, epoch=1)
    local_method.step(local_weights, local_gradient)

    new = owner_update.owner_step(
        owner_spec(size, constant, l2),
        owner_method,
        weights,
        gradient.copy(),
        2.5,
        {"iteration": 4, "epoch": 1},
    )
    np.testing.assert_allclose(new, local_weights, rtol=1e-12)
    assert not np.shares_memory(new, weights)
    np.testing.assert_allclose(
        owner_method.state_dict()["momentum_buffer"], local_method.state_dict()["momentum_buffer"]
    )


def test_a_slice_owner_takes_the_drivers_global_norm_scale(rng):
    size, start = 10, 4
    weights, gradient = rng.standard_normal(6), rng.standard_normal(6)
    method = SGD(lr=0.1)
    spec = owner_spec(size, l2=L2NormClipping(0.5))
    new = owner_update.owner_step(
        spec,
        method,
        weights,
        gradient.copy(),
        1.0,
        {"iteration": 1, "epoch": 0},
        start=start,
        l2_scale=0.25,
    )
    np.testing.assert_allclose(new, weights - 0.1 * 0.25 * gradient)
    with pytest.raises(ValueError, match="needs the driver's global-norm scale"):
        owner_update.owner_step(
            spec, method, weights, gradient.copy(), 1.0, {"iteration": 2, "epoch": 0}, start=4
        )


@pytest.mark.parametrize(
    "loss_sum, gradient_value",
    [(float("nan"), 1.0), (float("inf"), 1.0), (2.0, float("nan"))],
    ids=["nan-loss", "inf-loss", "finite-loss-nan-norm"],
)
def test_a_nonfinite_loss_or_norm_keeps_weights_and_state_and_advances_the_schedule(
    rng, loss_sum, gradient_value
):
    size = 8
    method = momentum_sgd_after_one_step(rng, size)
    before = state_of(method)
    weights = rng.standard_normal(size)
    gradient = np.full(size, gradient_value)
    new = owner_update.owner_step(
        owner_spec(size, l2=L2NormClipping(1.0)),
        method,
        weights,
        gradient,
        loss_sum,
        {"iteration": 4, "epoch": 2},
    )
    np.testing.assert_array_equal(new, weights)
    assert (method.iteration, method.epoch) == (4, 2)
    before.update(iteration=np.array(4), epoch=np.array(2))
    assert_same_state(method, before)


def test_a_halted_chain_changes_nothing_not_even_the_gradient(rng):
    """Replicated and sharded skipped clipping on a halted chain, local SGD clipped and took
    the norm anyway: one owner step now does nothing at all there, in every mode."""
    size = 8
    method = momentum_sgd_after_one_step(rng, size)
    before = state_of(method)
    weights = rng.standard_normal(size)
    summed = np.zeros(size)  # a halted partition's gradient
    new = owner_update.owner_step(
        owner_spec(size, ConstantClipping(0.1, 0.2), L2NormClipping(1.0, error_if_nonfinite=True)),
        method,
        weights,
        summed,
        0.0,
        {"iteration": 9, "epoch": 5},
        halted=True,
    )
    np.testing.assert_array_equal(new, weights)
    np.testing.assert_array_equal(summed, np.zeros(size))  # not clipped to 0.1
    assert_same_state(method, before)  # nor its schedule moved


@pytest.mark.parametrize(
    "loss_sum, stop_after_nonfinite, stops",
    [
        (1.0, True, False),
        (float("nan"), True, True),
        (float("inf"), True, True),
        (float("nan"), False, False),
    ],
)
def test_only_a_nonfinite_loss_stops_a_chain(loss_sum, stop_after_nonfinite, stops):
    assert owner_update.stops_chain(loss_sum, stop_after_nonfinite) is stops
