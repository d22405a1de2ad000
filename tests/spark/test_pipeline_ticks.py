"""The pipeline's ticks, run in this process (``pipeline_ticks.py``), equal
``LocalOptimizer(micro_batches=R x M, seed=0)`` on the same global batches: GPipe's grid of
stages and micro-batches, with BatchNorm (per micro-batch) and dropout (the same masks),
float32 and float64, recomputation, replicas, clipping, a graph model, a stage without
parameters, workers that forget everything between ticks (every backward runs its forward
again) and ticks that find the gradient sums before them gone (every backward replays the
ones before it)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from blob_data import blobs, flat
from blob_data import pipeline_network as network
from pipeline_ticks import local_reference, run_ticks

from bigdl_py import nn
from bigdl_py.optim import SGD, Adam, ConstantClipping, L2NormClipping
from bigdl_py.spark import Pipeline

BATCH = 32


def compare(pipeline, model, tmp_path, *, dtype=np.float32, tolerance=1e-5, **options):
    """Emulated ticks against the local loop: weights, running statistics, losses."""
    features, labels = blobs()
    features = features.astype(dtype)
    method = options.pop("method", SGD(lr=0.1, momentum=0.9))
    iterations = options.pop("iterations", 3)
    clippings = options.pop("clippings", {})
    emulated = run_ticks(
        model,
        features,
        labels,
        nn.NLLLoss(),
        method,
        pipeline,
        batch_size=BATCH,
        iterations=iterations,
        state_dir=str(tmp_path),
        iterations_per_job=options.pop("iterations_per_job", 2),
        **clippings,
        **options,
    )
    setters = []
    if "constant_clipping" in clippings:
        low, high = (
            clippings["constant_clipping"].min_value,
            clippings["constant_clipping"].max_value,
        )
        setters.append(lambda o: o.set_constant_gradient_clipping(low, high))
    if "l2_clipping" in clippings:
        norm = clippings["l2_clipping"].max_norm
        setters.append(lambda o: o.set_gradient_clipping_by_l2_norm(norm))
    local = local_reference(
        model,
        features,
        labels,
        nn.NLLLoss(),
        method,
        emulated,
        pipeline,
        iterations=iterations,
        clippings=setters,
    )
    scale = np.abs(flat(local)).max()
    assert np.abs(emulated.weights - flat(local)).max() <= tolerance * scale
    assert np.abs(emulated.weights - flat(model)).max() > 1e-3  # it trained
    assert len(emulated.losses) == iterations and np.all(np.isfinite(emulated.losses))
    if pipeline.replicas == 1:  # the running statistics are replica 0's, local's are all's
        for name, value in local.named_buffers():
            np.testing.assert_allclose(
                emulated.buffers[name], np.asarray(value.data), rtol=tolerance, atol=tolerance
            )
    return emulated


@pytest.mark.parametrize("stages, micro_batches", list(itertools.product((2, 3, 4), (1, 2, 4, 8))))
def test_gpipes_grid_equals_the_local_loop(stages, micro_batches, tmp_path):
    compare(Pipeline(stages, micro_batches), network(), tmp_path)


def test_float64_with_recomputation_and_forgetful_workers(tmp_path):
    """Every task finds an empty worker cache: its stage's layers come from the broadcast,
    its weights from the file, every backward runs its forward again; to 1e-10 in float64."""
    pipeline = Pipeline(3, 4, recompute=True)
    compare(pipeline, network(np.float64), tmp_path, dtype=np.float64, tolerance=1e-10, forget=True)


def test_lost_gradient_sums_are_replayed_from_the_inputs_and_gradients(tmp_path):
    """As a tick Spark runs again after losing an executor: the sum of the micro-batches
    before it is gone, and it runs their backward passes again from the files of what came."""
    compare(
        Pipeline(2, 4),
        network(np.float64),
        tmp_path,
        dtype=np.float64,
        tolerance=1e-10,
        lose_sums=True,
    )


def test_replicas_sum_their_gradients_under_both_clippings(tmp_path):
    emulated = compare(
        Pipeline(2, 2, replicas=2),
        network(),
        tmp_path,
        method=Adam(lr=0.01),
        clippings={
            "constant_clipping": ConstantClipping(-0.5, 0.5),
            "l2_clipping": L2NormClipping(0.3),
        },
        forget=True,
    )
    assert [report.memory.stage for report in emulated.reports] == [0, 0, 1, 1]


def test_a_graph_model_and_a_stage_without_parameters(tmp_path):
    with nn.init.seeded(2):
        x = nn.Input(shape=(10,))
        h = nn.Tanh()(nn.Linear(10, 16)(x))
        block = nn.Add()(h, nn.Linear(16, 16)(nn.BatchNorm1d(16)(h)))  # no cut inside
        y = nn.LogSoftmax()(nn.Linear(16, 3)(nn.ReLU()(block)))
        model = nn.Model(x, y)
    # Segments: Linear | Tanh | BatchNorm-Linear-Add | ReLU | Linear | LogSoftmax; stage 1
    # holds the Tanh alone.
    compare(Pipeline(4, 2, split=[1, 2, 4]), model, tmp_path)


def test_chains_of_one_iteration_and_wire_compression_of_nothing(tmp_path):
    """One iteration a job: every chain starts from the driver's slices and statistics."""
    compare(Pipeline(2, 4), network(), tmp_path, iterations_per_job=1, iterations=2)


@pytest.mark.gpu
def test_the_stages_on_a_gpu(tmp_path):
    """Each stage's layers on the task's GPU (cuda:0 here), the weights and gradients
    copied there and back: the local loop's weights to float32 rounding across kernels."""
    from bigdl_py import backend

    if not backend.cuda_available():
        pytest.skip("needs CuPy and a CUDA device")
    compare(Pipeline(2, 2), network(), tmp_path, tolerance=1e-4, device="gpu")
