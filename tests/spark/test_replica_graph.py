"""A replica's pieces on a device, captured in a (CUDA) graph and replayed, give the
gradients and summed losses of eager pieces: on the strict device, whose graphs are
emulated (``bigdl_py.step_graph``), over iterations that reload the weights, zero the
gradient and reseed dropout in place before the replays."""

from __future__ import annotations

import numpy as np
import pytest
from test_replica_device_waits import BATCH, replica

from bigdl_py import backend, nn, step_graph
from bigdl_py.autograd.ops import cudnn
from bigdl_py.spark.replica import forward_backward


def gradients(made, micro_batches, iterations=4):
    rng = np.random.default_rng(5)
    base = backend.as_numpy(made.flat.weights).copy()
    results = []
    for iteration in range(iterations):
        weights = base + rng.normal(0, 0.1, base.shape).astype(np.float32)
        shuffled = np.random.default_rng(iteration).permutation(BATCH)
        gradient, loss_sum, count = forward_backward(
            made, weights, shuffled, BATCH, iteration, micro_batches
        )
        results.append((backend.as_numpy(gradient).copy(), loss_sum, count))
    return results


@pytest.mark.parametrize("micro_batches", [1, 4])  # 4 pieces: 8, 8, 7, 7 samples
def test_replayed_pieces_give_the_gradients_of_eager_ones(tmp_path, monkeypatch, micro_batches):
    runs = {}
    for graphs in ("1", "0"):
        monkeypatch.setenv(step_graph.SWITCH_VARIABLE, graphs)
        folder = tmp_path / graphs
        folder.mkdir()
        made = replica(folder, nn.NLLLoss(), device="strict")
        runs[graphs] = gradients(made, micro_batches)
        if graphs == "1":
            counts = made.step_graph.counts
            assert counts["replayed"] > 0 and not made.step_graph.refusals
    for (captured, captured_loss, _), (eager, eager_loss, _) in zip(
        runs["1"], runs["0"], strict=True
    ):
        np.testing.assert_allclose(captured, eager, rtol=1e-6, atol=1e-8)
        assert captured_loss == pytest.approx(eager_loss, rel=1e-6)


def test_a_route_switch_gives_the_pieces_a_new_graph(tmp_path, monkeypatch):
    """A graph captured with cuDNN's routes on would replay them after the switch."""
    monkeypatch.setenv(step_graph.SWITCH_VARIABLE, "1")
    monkeypatch.delenv(cudnn.SWITCH_VARIABLE, raising=False)
    made = replica(tmp_path, nn.NLLLoss(), device="strict")
    gradients(made, 1, iterations=2)  # a warm-up and a capture
    monkeypatch.setenv(cudnn.SWITCH_VARIABLE, "0")
    gradients(made, 1, iterations=2)
    assert made.step_graph.counts == {"captured": 2, "replayed": 0, "eager": 2}
