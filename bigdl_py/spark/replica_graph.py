"""A replica's forward-backward of one piece, on a device, as a step a CUDA graph replays.

``replica.forward_backward`` hands each piece of its share here when the replica is on a
device and trains with its criterion (not a custom training step): the forward, the loss
and the backward of the piece, weighted by its share of the global batch, run through the
replica's :class:`~bigdl_py.step_graph.StepGraph`: eagerly for the first iteration of each
piece size, then captured and replayed (``docs/gpu.md``). The weights, the zeroed gradient
and the reseeded dropout stream are written in place before it, so a replay reads them;
the gradient accumulates into the flat vector as the eager pieces' does. The labels go to
the device with the features (the criterion checks them there; a bad one is reported at
the replica's sync point, naming the partition). ``BIGDL_PY_CUDA_GRAPHS=0`` on the
executors runs every piece eagerly.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from bigdl_py import device_waits
from bigdl_py.autograd.tensor import Tensor
from bigdl_py.step_graph import StepGraph
from bigdl_py.train.rng import load_model_rng_state, model_rng_state
from bigdl_py.train.route_settings import route_settings


def captures(replica: Any) -> bool:
    """Whether the replica's pieces go through its StepGraph: it trains with its criterion
    and graphs are on (``BIGDL_PY_CUDA_GRAPHS``) for its device."""
    return replica.training_step is None and _graph(replica).enabled


def piece_loss_sum(replica: Any, piece: np.ndarray, labels: np.ndarray, weight: float) -> Any:
    """Back-propagate ``weight`` x the mean loss of the samples ``piece`` into the replica's
    gradient; return their summed loss (a 0-d device array of its own)."""
    graph = _graph(replica)
    count = len(piece)

    def step(*arrays: Any) -> Any:
        inputs = (Tensor(array, _copy=False) for array in arrays[:-1])
        loss = replica.criterion(replica.model(*inputs), Tensor(arrays[-1], _copy=False))
        (loss * weight).backward()
        return loss.data * count

    features = [np.asarray(array[piece]) for array in replica.features]
    key = (weight, tuple(module.training for module in replica.model.modules()), route_settings())
    with device_waits.no_device_waits():
        # A replay's output is overwritten by the next piece of this size: a copy is kept.
        return graph.run(step, [*features, labels], key).copy()


def _graph(replica: Any) -> StepGraph:
    """The replica's StepGraph, made on first use (the replica lives across tasks)."""
    graph = getattr(replica, "step_graph", None)
    if graph is None:
        graph = replica.step_graph = StepGraph(replica.device, host_state=_host_state(replica))
    return graph


def _host_state(replica: Any):
    def snapshot():
        saved = model_rng_state(replica.model)
        return lambda: load_model_rng_state(replica.model, saved)

    return snapshot
