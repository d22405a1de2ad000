"""StepGraph on the strict device, whose graphs are emulated: the capture records every
operation with the memory it used, a replay runs them again with the values they were
recorded with, as a GPU replays a CUDA graph's kernels. So a step whose replays would go
wrong on a GPU (a host value frozen into a kernel argument, state rebound to a new array)
goes wrong here too, a step a GPU cannot capture (a product on CuPy's own cuBLAS handle)
is refused here too, and the hooks that make replays right are checked without a GPU."""

from __future__ import annotations

import numpy as np
import pytest

from bigdl_py import backend, device_waits, step_graph
from bigdl_py.autograd.ops import cublas
from bigdl_py.step_graph import StepGraph


class Accumulator:
    """A step with device state updated in place, a host-filled scale and a host count."""

    def __init__(self, hooks: bool = True):
        xp = backend.STRICT.xp
        self.total = xp.zeros(3, dtype=np.float64)
        self.scale = xp.zeros((), dtype=np.float64)
        self.scale_value = 1.0
        self.calls = 0
        self.hooks = hooks

    def count(self) -> None:
        self.calls += 1

    def step(self, batch):
        if self.hooks:
            step_graph.each_step(self.count)
            step_graph.fill_each_step(self.scale, lambda: self.scale_value)
            self.total += batch * self.scale
        else:
            self.count()
            self.total += batch * self.scale_value  # a host value frozen in when captured
        return self.total.sum()


def run(graph, accumulator, batches, scales):
    results = []
    for batch, scale in zip(batches, scales, strict=True):
        accumulator.scale_value = scale
        results.append(float(graph.run(accumulator.step, [batch])))
    return results


BATCHES = [np.full(3, float(i + 1)) for i in range(6)]
SCALES = [1.0, 0.5, 0.25, 2.0, 3.0, 0.1]


def test_replays_follow_the_host_filled_scalars_and_repeat_the_host_effects():
    eager, captured = Accumulator(), Accumulator()
    expected = run(StepGraph("strict", enabled=False), eager, BATCHES, SCALES)
    graph = StepGraph("strict")
    assert run(graph, captured, BATCHES, SCALES) == expected
    assert graph.counts == {"captured": 1, "replayed": 4, "eager": 1}
    assert captured.calls == eager.calls == 6
    np.testing.assert_array_equal(captured.total.get(), eager.total.get())


def test_the_emulation_catches_a_host_value_frozen_into_a_captured_step():
    eager, captured = Accumulator(hooks=False), Accumulator(hooks=False)
    expected = run(StepGraph("strict", enabled=False), eager, BATCHES, SCALES)
    got = run(StepGraph("strict"), captured, BATCHES, SCALES)
    assert got[:2] == expected[:2]  # the warm-up and the capture's own run
    assert got[2:] != expected[2:]  # replays keep the captured scale, as on a GPU
    assert captured.calls == 2  # and the host count is not repeated


def test_the_emulation_catches_state_rebound_to_a_new_array():
    class Rebinding:
        def __init__(self):
            self.total = backend.STRICT.xp.zeros(3)

        def step(self, batch):
            self.total = self.total + batch  # a graph keeps writing the array of its capture
            return self.total

    eager, captured = Rebinding(), Rebinding()
    for batch in BATCHES:
        StepGraph("strict", enabled=False).run(eager.step, [batch])
    graph = StepGraph("strict")
    for batch in BATCHES:
        graph.run(captured.step, [batch])
    assert not np.array_equal(captured.total.get(), eager.total.get())


def test_a_host_to_device_copy_inside_the_step_runs_it_eagerly_and_says_why(caplog):
    restored = []

    def step(batch):
        offset = backend.to_device(np.ones(3), "strict")  # a copy a replay cannot repeat
        return batch + offset

    graph = StepGraph("strict", host_state=lambda: lambda: restored.append(True))
    results = [graph.run(step, [batch]).get() for batch in BATCHES]
    for result, batch in zip(results, BATCHES, strict=True):
        np.testing.assert_array_equal(result, batch + 1)
    assert graph.counts == {"captured": 0, "replayed": 0, "eager": 6}
    (reason,) = graph.refusals.values()
    assert "copying host data to the device cannot be replayed" in reason
    assert restored == [True]  # the host state was put back after the failed capture
    assert "cannot be captured in a CUDA graph" in caplog.text


WEIGHT = np.random.default_rng(5).standard_normal((3, 2))
# Products CuPy runs on its own cuBLAS handle, which it refuses to call during a capture.
CUPY_PRODUCTS = {
    "matmul": lambda xp, batch, weight: xp.matmul(batch[None], weight),
    "operator": lambda xp, batch, weight: batch[None] @ weight,
    "dot": lambda xp, batch, weight: xp.dot(batch, weight),
    "method_dot": lambda xp, batch, weight: batch.dot(weight),
    "tensordot": lambda xp, batch, weight: xp.tensordot(batch, weight, axes=1),
    "einsum": lambda xp, batch, weight: xp.einsum("i,ij->j", batch, weight),
    "inner": lambda xp, batch, weight: xp.inner(batch, weight.T),
}


@pytest.mark.parametrize("product", CUPY_PRODUCTS)
def test_a_product_on_cupys_own_cublas_handle_runs_the_step_eagerly(product):
    weight = backend.to_device(WEIGHT, "strict")

    def step(batch):
        return CUPY_PRODUCTS[product](backend.STRICT.xp, batch, weight).reshape(-1)

    graph = StepGraph("strict")
    for batch in BATCHES:
        np.testing.assert_allclose(graph.run(step, [batch]).get(), batch @ WEIGHT, rtol=1e-12)
    assert graph.counts == {"captured": 0, "replayed": 0, "eager": 6}
    (reason,) = graph.refusals.values()
    assert "on CuPy's own cuBLAS handle" in reason and "cublas.matmul" in reason


def test_the_same_product_through_the_packages_route_is_captured():
    weight = backend.to_device(WEIGHT, "strict")
    graph = StepGraph("strict")
    for batch in BATCHES:
        result = graph.run(lambda batch: cublas.matmul(batch, weight), [batch])
        np.testing.assert_allclose(result.get(), batch @ WEIGHT, rtol=1e-12)
    assert graph.counts == {"captured": 1, "replayed": 4, "eager": 1}
    assert not graph.refusals


def test_integer_products_take_cupys_own_kernels_and_are_captured():
    weight = backend.to_device(np.arange(6).reshape(3, 2), "strict")
    graph = StepGraph("strict")
    for batch in BATCHES:
        result = graph.run(lambda batch: batch.astype(np.int64) @ weight, [batch])
        np.testing.assert_array_equal(result.get(), batch.astype(np.int64) @ weight.get())
    assert graph.counts == {"captured": 1, "replayed": 4, "eager": 1}


def doubled(batch):
    return batch * 2


def test_each_new_signature_gets_its_own_graph_and_the_oldest_goes_first():
    graph = StepGraph("strict", max_graphs=2)
    shapes = [3, 3, 3, 2, 2, 2, 4, 4, 4, 3, 3]
    for size in shapes:
        result = graph.run(doubled, [np.arange(float(size))])
        np.testing.assert_array_equal(result.get(), 2 * np.arange(float(size)))
    # 3, 2 and 4 each warm up, capture and replay; 4 pushes 3's graph out, and 3 comes back
    # already warmed up: captured again at once.
    assert graph.counts == {"captured": 4, "replayed": 4, "eager": 3}
    assert graph.graphs_held() == 2
    for key in ("a", "a", "b", "b"):
        graph.run(doubled, [np.ones(3)], key=key)
    assert graph.counts["eager"] == 5  # each new key warms up first


def test_on_the_cpu_every_step_runs_eagerly():
    accumulator = Accumulator()
    accumulator.total = np.zeros(3)
    accumulator.scale = np.zeros(())
    graph = StepGraph("cpu")
    run(graph, accumulator, BATCHES, SCALES)
    assert not graph.enabled and accumulator.calls == 6


def test_the_environment_variable_turns_graphs_off(monkeypatch):
    monkeypatch.setenv(step_graph.SWITCH_VARIABLE, "0")
    assert not StepGraph("strict").enabled
    assert StepGraph("strict", enabled=True).enabled  # the argument wins
    monkeypatch.setenv(step_graph.SWITCH_VARIABLE, "1")
    assert StepGraph("strict").enabled


@pytest.mark.parametrize("argument", ["warmup_steps", "max_graphs"])
def test_counts_below_one_are_refused(argument):
    with pytest.raises(ValueError, match=f"{argument} must be >= 1, got 0"):
        StepGraph("strict", **{argument: 0})


def checked_step(batch):
    """A step checking its data on the device (as an embedding checks its ids)."""
    low, high = batch.min(), batch.max()
    device_waits.check(
        high > 5,
        lambda low, high: ValueError(f"values in [{float(low)}, {float(high)}]"),
        low,
        high,
    )
    return batch * 2


@pytest.mark.parametrize("bad", [0, 1, 4])  # the warm-up, the capture's own run, a replay
def test_a_failed_check_names_the_step_and_its_values_though_later_steps_replayed(bad):
    graph = StepGraph("strict")
    batches = [np.arange(3.0) + i for i in range(6)]
    batches[bad] = np.array([0.0, 9.0, 1.0])
    with device_waits.no_device_waits():
        for number, batch in enumerate(batches):
            device_waits.begin_step(f"step {number}")
            graph.run(checked_step, [batch])
    with pytest.raises(ValueError, match=rf"values in \[0.0, 9.0\] \[in step {bad}\]"):
        device_waits.raise_deferred_checks()
    # Read at the sync point, the record starts over: clean steps raise nothing.
    with device_waits.no_device_waits():
        for batch in batches[:bad]:
            graph.run(checked_step, [batch])
    device_waits.raise_deferred_checks()
    assert graph.counts["replayed"] >= 3
