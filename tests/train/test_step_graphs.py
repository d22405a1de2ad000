"""LocalOptimizer's training step captured in a (CUDA) graph and replayed gives the weights
of plain training.

Without a GPU the graphs are those of the strict device (``bigdl_py.step_graph``): a
replay runs the captured operations again on the memory and with the values of the
capture, so a step that would replay wrongly on a GPU trains differently here. Replayed
training must equal eager training on the same device exactly (the same operations on the
same data), and the host's training within float32 rounding.
"""

from __future__ import annotations

import copy
import importlib
import os
import sys

import numpy as np
import pytest
from train_models import make_blobs, make_classifier

from bigdl_py import backend, kernels, nn
from bigdl_py.autograd import ops
from bigdl_py.autograd.ops import cublas, cudnn
from bigdl_py.data import ArrayDataset
from bigdl_py.optim import SGD, Adam, Step
from bigdl_py.train import LocalOptimizer, MaxEpoch, MaxIteration, SeveralIteration
from bigdl_py.train.callbacks import TrainingCallback

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "bench")


def engine_models():
    sys.path.insert(0, BENCH)  # bench/ is not a package
    try:
        return importlib.import_module("engine_models")
    finally:
        sys.path.remove(BENCH)


def lenet5():
    models = engine_models()
    with nn.init.seeded(0):
        return models.build(nn, models.LENET5)


def images(samples: int = 70):
    rng = np.random.default_rng(3)
    features = rng.standard_normal((samples, 1, 28, 28)).astype(np.float32)
    return features, rng.integers(0, 10, samples)


def train(device, optim_method, cuda_graphs, epochs=3, model=None, data=None, **options):
    """LeNet-5 on 70 images in batches of 16 (the last one 6): 15 iterations."""
    features, labels = data or images()
    optimizer = LocalOptimizer(
        (model or lenet5()).to(device),
        ArrayDataset(features, labels, shuffle=True, seed=1),
        nn.NLLLoss(),
        copy.deepcopy(optim_method),
        batch_size=16,
        end_trigger=MaxEpoch(epochs),
        progress=False,
        cuda_graphs=cuda_graphs,
        **options,
    )
    optimizer.optimize()
    return optimizer


def weights(optimizer):
    return {name: np.array(value) for name, value in optimizer.model.state_dict().items()}


def assert_same(first, second, exact=True):
    for name, value in first.items():
        if exact:
            np.testing.assert_array_equal(second[name], value, err_msg=name)
        else:
            np.testing.assert_allclose(second[name], value, rtol=2e-4, atol=2e-5, err_msg=name)


METHODS = {
    "sgd-momentum": SGD(lr=0.05, momentum=0.9, weight_decay=1e-4),
    "adam-schedule": Adam(lr=2e-3, schedule=Step(step_size=4, gamma=0.5)),
}


@pytest.mark.parametrize("method", list(METHODS))
def test_replayed_training_gives_the_weights_of_eager_training(method):
    captured = train("strict", METHODS[method], cuda_graphs=True)
    eager = train("strict", METHODS[method], cuda_graphs=False)
    # A graph for the batches of 16 and one for the last batch of 6 (its first run in the
    # first epoch is its warm-up): the other 11 iterations replayed.
    assert captured.runner.step_graph.counts == {"captured": 2, "replayed": 11, "eager": 2}
    assert not captured.runner.step_graph.refusals
    assert_same(weights(eager), weights(captured))
    assert captured.state.loss == eager.state.loss
    assert captured.optim_method.state_dict()["step"] == 15
    host = train("cpu", METHODS[method], cuda_graphs=True)
    assert_same(weights(host), weights(captured), exact=False)


LOSSES = {"nll": nn.NLLLoss, "cross_entropy": nn.CrossEntropyLoss, "mse": nn.MSELoss}


BENCH_MODELS = ["lenet", "mlp", "cnn", "ncf", "transformer", "bilstm", "resnet18"]
ON_A_GPU = [
    pytest.mark.gpu,
    pytest.mark.skipif(not backend.cuda_available(), reason="needs CuPy and a CUDA device"),
]


@pytest.mark.parametrize("key", BENCH_MODELS)
@pytest.mark.parametrize(
    "device", ["strict", pytest.param("cuda", marks=ON_A_GPU)], ids=["strict", "gpu"]
)
def test_every_bench_models_step_is_captured_and_replays_as_it_runs_eagerly(key, device):
    spec = engine_models().MODELS[key]
    features, labels = spec.batch(0)
    samples = 9 if key == "resnet18" else 24
    features, labels = features[:samples], labels[:samples]
    if key in ("transformer", "bilstm"):
        features = np.maximum(features[:, :16], 1)  # short sequences, no all-padding one
    runs = []
    for graphs in (True, False):
        ops.manual_seed(0)  # the same dropout masks
        with nn.init.seeded(0):
            model = spec.build().to(device)
        optimizer = LocalOptimizer(
            model,
            ArrayDataset(features, labels, shuffle=False),
            LOSSES[spec.loss](),
            Adam(lr=1e-3),
            batch_size=samples // 3,
            end_trigger=MaxIteration(5),
            progress=False,
            cuda_graphs=graphs,
        )
        optimizer.optimize()
        runs.append(optimizer)
    graph = runs[0].runner.step_graph
    assert not graph.refusals, graph.refusals
    assert graph.counts == {"captured": 1, "replayed": 3, "eager": 1}
    # On a GPU the same kernels may add in another order (atomics in scatters and cuDNN).
    assert_same(weights(runs[1]), weights(runs[0]), exact=device == "strict")


class _SequenceClassifier(nn.Module):
    """A recurrent layer (two layers deep) classifying from the mean of its output
    sequence, so that every step's output has a gradient."""

    def __init__(self, cell, bidirectional, **options):
        super().__init__()
        layer = {"lstm": nn.LSTM, "gru": nn.GRU, "rnn": nn.RNN}[cell]
        self.recurrent = layer(
            6, 5, num_layers=2, batch_first=True, bidirectional=bidirectional, **options
        )
        self.fc = nn.Linear(5 * (2 if bidirectional else 1), 3)
        self.log_softmax = nn.LogSoftmax()

    def forward(self, x):
        output, _ = self.recurrent(x)
        return self.log_softmax(self.fc(ops.mean(output, axis=1)))


def _convolutions():
    """Conv2d in groups (conv_device's GEMMs), batch norm with a cumulative running average
    (its factor a device scalar: the unfused route, norm.py's sums), a transposed
    convolution (conv.py's im2col route, gemm_pieces' products), group norm."""
    return nn.Sequential(
        nn.Conv2d(2, 4, 3, padding=1, groups=2), nn.BatchNorm2d(4, momentum=None), nn.ReLU(),
        nn.ConvTranspose2d(4, 2, 3, stride=2), nn.GroupNorm(2, 2), nn.ReLU(), nn.Flatten(),
        nn.Linear(2 * 13 * 13, 3), nn.LogSoftmax(),
    )  # fmt: skip


# Models whose device products ran outside the package's cuBLAS route before: each step's
# products must be on the route for its capture (CuPy cannot capture its own).
DEVICE_PRODUCT_MODELS = {
    "lstm": (lambda: _SequenceClassifier("lstm", bidirectional=True), (7, 6)),
    "gru": (lambda: _SequenceClassifier("gru", bidirectional=True), (7, 6)),
    "rnn_tanh": (lambda: _SequenceClassifier("rnn", bidirectional=False), (7, 6)),
    "rnn_relu": (
        lambda: _SequenceClassifier("rnn", bidirectional=True, nonlinearity="relu"),
        (7, 6),
    ),
    "convolutions": (_convolutions, (2, 6, 6)),
}


@pytest.mark.parametrize("key", DEVICE_PRODUCT_MODELS)
def test_recurrences_and_convolutions_are_captured_with_their_products_on_our_route(key):
    """LSTM/GRU/RNN layers where cuDNN does not run (its fallback recurrence), conv2d on a
    device (conv_device), ConvTranspose2d (conv.py's im2col route), unfused batch norm
    and group norm: captured with nothing refused, replayed as they run eagerly."""
    build, shape = DEVICE_PRODUCT_MODELS[key]
    rng = np.random.default_rng(4)
    features = rng.standard_normal((18, *shape)).astype(np.float32)
    labels = rng.integers(0, 3, 18)
    runs = []
    for graphs in (True, False):
        with nn.init.seeded(0):
            model = build().to("strict")
        optimizer = LocalOptimizer(
            model,
            ArrayDataset(features, labels, shuffle=False),
            nn.NLLLoss(),
            Adam(lr=1e-2),
            batch_size=6,
            end_trigger=MaxIteration(5),
            progress=False,
            cuda_graphs=graphs,
        )
        optimizer.optimize()
        runs.append(optimizer)
    graph = runs[0].runner.step_graph
    assert not graph.refusals, graph.refusals
    assert graph.counts == {"captured": 1, "replayed": 3, "eager": 1}
    assert_same(weights(runs[1]), weights(runs[0]))


class _Switch(TrainingCallback):
    """Changes the training after iteration ``at`` as a user's callback might."""

    def __init__(self, at: int, change):
        self.at, self.change = at, change

    def on_iteration_end(self, state, loss, throughput, learning_rate):
        if state.iteration == self.at:
            self.change()


def train_with(change_of, cuda_graphs):
    model = make_classifier(dropout=0.0)
    model.to("strict")
    features, labels = make_blobs(samples=96)
    optimizer = LocalOptimizer(
        model,
        ArrayDataset(features, labels, batch_size=16, shuffle=False),
        nn.NLLLoss(),
        SGD(lr=0.1, momentum=0.9),
        end_trigger=MaxIteration(12),
        progress=False,
        cuda_graphs=cuda_graphs,
    )
    optimizer.add_callback(_Switch(5, change_of(optimizer)))
    optimizer.optimize()
    return optimizer


@pytest.mark.parametrize(
    "change_of",
    [
        lambda optimizer: lambda: setattr(optimizer.optim_method, "momentum", 0.5),
        lambda optimizer: lambda: optimizer.model[0].weight.requires_grad_(False),
        lambda optimizer: lambda: optimizer.model[1].eval(),
    ],
    ids=["hyperparameter", "frozen-parameter", "module-in-eval"],
)
def test_a_change_of_hyperparameter_or_mode_makes_a_new_graph(change_of):
    captured = train_with(change_of, cuda_graphs=True)
    eager = train_with(change_of, cuda_graphs=False)
    counts = captured.runner.step_graph.counts
    assert counts["captured"] == 2 and counts["eager"] == 2  # one warm-up + capture each
    assert_same(weights(eager), weights(captured))


# Route switches turned off after iteration 6 (as a user might between runs in a process);
# the refusal the new signature's capture gets on the strict device, if any.
ROUTE_SWITCHES = {
    # cuDNN takes no strict-device arrays: the same launches, but a signature of its own
    "cudnn": (cudnn.SWITCH_VARIABLE, None),
    # products on CuPy's handle, which no graph captures: the rest of training is eager
    "cublas": (cublas.SWITCH_VARIABLE, "on CuPy's own cuBLAS handle"),
    # composed operations: the optimizer's update reads the host's learning rate
    "fused_kernels": (kernels.SWITCH_VARIABLE, "update without a fused kernel"),
}


@pytest.mark.parametrize("switch", ROUTE_SWITCHES)
def test_a_route_switch_makes_a_new_graph(monkeypatch, switch):
    """A graph captured with a route on would replay it after the switch turned it off."""
    variable, refusal = ROUTE_SWITCHES[switch]

    def change_of(_optimizer):
        return lambda: monkeypatch.setenv(variable, "0")

    monkeypatch.delenv(variable, raising=False)
    captured = train_with(change_of, cuda_graphs=True)
    monkeypatch.delenv(variable)
    eager = train_with(change_of, cuda_graphs=False)
    graph = captured.runner.step_graph
    if refusal is None:
        assert graph.counts == {"captured": 2, "replayed": 8, "eager": 2}
        assert not graph.refusals
    else:  # iterations 2-6 captured and replayed, then all eager
        assert graph.counts == {"captured": 1, "replayed": 4, "eager": 7}
        (reason,) = graph.refusals.values()
        assert refusal in reason
    assert_same(weights(eager), weights(captured))


def test_a_resumed_run_captures_again_and_continues_as_an_eager_one(tmp_path):
    runs = {}
    for graphs in (True, False):
        folder = tmp_path / str(graphs)
        first = train("strict", METHODS["adam-schedule"], graphs, epochs=1)
        first.set_checkpoint(folder, SeveralIteration(5))
        first.set_end_when(MaxEpoch(2))
        first.optimize()
        resumed = LocalOptimizer(
            lenet5().to("strict"),
            ArrayDataset(*images(), shuffle=True, seed=1),
            nn.NLLLoss(),
            copy.deepcopy(METHODS["adam-schedule"]),
            batch_size=16,
            end_trigger=MaxEpoch(3),
            progress=False,
            cuda_graphs=graphs,
        )
        resumed.resume_from(folder)
        resumed.optimize()
        runs[graphs] = resumed
    assert runs[True].runner.step_graph.counts["replayed"] > 0
    assert_same(weights(runs[False]), weights(runs[True]))


@pytest.mark.parametrize("skip", [False, True])
def test_a_nan_loss_in_a_replayed_step_is_handled_as_in_an_eager_one(skip):
    from bigdl_py.train import NonFiniteLossError

    features, labels = make_blobs(samples=100)
    features[85, 2] = np.nan  # batch 5 of 5: a replay in the first epoch
    runs = []
    for graphs in (True, False):
        optimizer = LocalOptimizer(
            make_classifier().to("strict"),
            ArrayDataset(features, labels, batch_size=20, shuffle=False, check_finite=False),
            nn.NLLLoss(),
            Adam(lr=0.05),
            end_trigger=MaxEpoch(2),
            progress=False,
            skip_nonfinite_batches=skip,
            cuda_graphs=graphs,
        )
        if skip:
            optimizer.optimize()
            assert optimizer.state.skipped_batches == 2
        else:
            with pytest.raises(NonFiniteLossError, match=r"iteration 5 \(epoch 1, batch 5"):
                optimizer.optimize()
        runs.append(optimizer)
    assert runs[0].runner.step_graph.counts["replayed"] > 0
    assert_same(weights(runs[1]), weights(runs[0]))


def test_an_id_outside_the_embedding_in_a_replayed_step_names_that_iteration():
    features = np.random.default_rng(0).integers(0, 50, size=(40, 6))
    labels = np.arange(40) % 2
    features[29, 3] = 50  # batch 8 of 10: a replay
    model = nn.Sequential(nn.Embedding(50, 4), nn.Flatten(), nn.Linear(24, 2))
    optimizer = LocalOptimizer(
        model.to("strict"),
        ArrayDataset(features, labels, batch_size=4, shuffle=False),
        nn.CrossEntropyLoss(),
        SGD(lr=0.1),
        end_trigger=MaxEpoch(1),
        progress=False,
    )
    with pytest.raises(IndexError, match=r"got min 0 and max 50 \[in iteration 8 \(epoch 1"):
        optimizer.optimize()
    assert optimizer.runner.step_graph.counts["replayed"] >= 5


def test_a_step_that_cannot_be_captured_trains_eagerly_with_the_same_weights():
    # A layer with its own seeded generator draws its dropout masks on the host and copies
    # them to the device: no graph can replay that.
    def build():
        with nn.init.seeded(0):
            return nn.Sequential(
                nn.Linear(8, 16), nn.Tanh(), nn.Dropout(0.3, seed=4), nn.Linear(16, 3),
                nn.LogSoftmax(),
            )  # fmt: skip

    features, labels = make_blobs(samples=60)
    runs = []
    for graphs in (True, False):
        optimizer = LocalOptimizer(
            build().to("strict"),
            ArrayDataset(features, labels, batch_size=20, shuffle=False),
            nn.NLLLoss(),
            SGD(lr=0.1),
            end_trigger=MaxEpoch(2),
            progress=False,
            cuda_graphs=graphs,
        )
        optimizer.optimize()
        runs.append(optimizer)
    graph = runs[0].runner.step_graph
    assert graph.counts == {"captured": 0, "replayed": 0, "eager": 6}
    (reason,) = graph.refusals.values()
    assert "copying host data to the device" in reason
    assert_same(weights(runs[1]), weights(runs[0]))


def test_cuda_graphs_must_be_a_bool():
    with pytest.raises(TypeError, match="cuda_graphs must be True, False or None, got 'yes'"):
        LocalOptimizer(make_classifier(), make_blobs(), nn.NLLLoss(), SGD(), cuda_graphs="yes")


@pytest.mark.parametrize("method", list(METHODS))
@pytest.mark.gpu
@pytest.mark.skipif(not backend.cuda_available(), reason="needs CuPy and a CUDA device")
def test_gpu_captured_training_matches_eager_training(method):
    captured = train("cuda", METHODS[method], cuda_graphs=True)
    eager = train("cuda", METHODS[method], cuda_graphs=False)
    graph = captured.runner.step_graph
    assert not graph.refusals, graph.refusals
    assert graph.counts == {"captured": 2, "replayed": 11, "eager": 2}
    # The same kernels on the same data, replayed or launched one by one (cuDNN's and the
    # scatters' atomics may add in another order).
    assert_same(weights(eager), weights(captured), exact=False)
    assert captured.state.loss == pytest.approx(eager.state.loss, rel=1e-4)
