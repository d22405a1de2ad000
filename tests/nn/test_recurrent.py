"""LSTM, GRU and RNN: finite differences, PyTorch parity, initialisation, dropout and errors.

The PyTorch checks copy our parameters into ``torch.nn.LSTM``/``GRU``/``RNN`` with
``load_state_dict(strict=True)`` (proving the names and shapes are PyTorch's), then compare
the output sequence, the final states and the gradients of the input, of the initial
states and of every parameter, in float64 to 1e-5 relative.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from bigdl_py import backend, nn
from bigdl_py.autograd import Tensor, gradcheck, ops

F64 = np.float64
INPUT_SIZE, HIDDEN_SIZE, BATCH, STEPS = 3, 2, 2, 3


def sequence(steps=STEPS, batch=BATCH, features=INPUT_SIZE, batch_first=True, seed=0):
    shape = (batch, steps, features) if batch_first else (steps, batch, features)
    return np.random.default_rng(seed).standard_normal(shape)


def initial_state(layers, batch=BATCH, hidden=HIDDEN_SIZE, seed=1):
    return np.random.default_rng(seed).standard_normal((layers, batch, hidden))


def state_rows(layer):
    """Rows of an initial state: one per layer and direction."""
    return layer.num_layers * (2 if layer.bidirectional else 1)


def flat_outputs(layer, x, states):
    """Every output of ``layer(x, states)`` (sequence and final states), as one 1-d tensor."""
    if isinstance(layer, nn.LSTM):
        hx = None if states is None else (states[0], states[1])
        output, (hidden, cell) = layer(x, hx)
        pieces = [output, hidden, cell]
    else:
        output, hidden = layer(x, None if states is None else states[0])
        pieces = [output, hidden]
    return ops.concatenate([ops.reshape(piece, (-1,)) for piece in pieces])


BATCH_FIRST = {"batch_first": True}
RECURRENT_CASES = [
    # No batch_first: PyTorch's default, time-major (T, N, F), given to PyTorch as is.
    pytest.param(nn.LSTM, {}, True, id="lstm_default_time_major"),
    pytest.param(nn.LSTM, {"num_layers": 2, **BATCH_FIRST}, True, id="lstm_2_layers"),
    pytest.param(nn.LSTM, {"num_layers": 2, "batch_first": False}, True, id="lstm_time_major"),
    pytest.param(nn.LSTM, {"bias": False, **BATCH_FIRST}, False, id="lstm_no_bias_zero_state"),
    pytest.param(nn.GRU, {}, True, id="gru_default_time_major"),
    pytest.param(nn.GRU, {"num_layers": 2, **BATCH_FIRST}, True, id="gru_2_layers"),
    pytest.param(nn.GRU, {"num_layers": 2, "batch_first": False}, True, id="gru_time_major"),
    pytest.param(nn.GRU, {"bias": False, **BATCH_FIRST}, False, id="gru_no_bias_zero_state"),
    pytest.param(nn.LSTM, {"bidirectional": True, **BATCH_FIRST}, True, id="lstm_bidirectional"),
    pytest.param(
        nn.LSTM,
        {"bidirectional": True, "num_layers": 2, "batch_first": False},
        True,
        id="lstm_bidirectional_2_layers_time_major",
    ),
    pytest.param(
        nn.GRU, {"bidirectional": True, **BATCH_FIRST}, False, id="gru_bidirectional_zero_state"
    ),
    pytest.param(
        nn.GRU,
        {"bidirectional": True, "num_layers": 2, **BATCH_FIRST},
        True,
        id="gru_bidirectional_2_layers",
    ),
    pytest.param(nn.RNN, {}, True, id="rnn_default_time_major"),
    pytest.param(nn.RNN, {"nonlinearity": "relu"}, True, id="rnn_relu_time_major"),
    pytest.param(nn.RNN, {"num_layers": 2, **BATCH_FIRST}, True, id="rnn_2_layers"),
    pytest.param(
        nn.RNN,
        {"num_layers": 2, "nonlinearity": "relu", **BATCH_FIRST},
        True,
        id="rnn_relu_2_layers",
    ),
    pytest.param(nn.RNN, {"bias": False, **BATCH_FIRST}, False, id="rnn_no_bias_zero_state"),
    pytest.param(
        nn.RNN,
        {"bidirectional": True, "num_layers": 2, "batch_first": False},
        True,
        id="rnn_bidirectional_2_layers_time_major",
    ),
    pytest.param(
        nn.RNN,
        {"bidirectional": True, "num_layers": 2, "nonlinearity": "relu", **BATCH_FIRST},
        True,
        id="rnn_relu_bidirectional_2_layers",
    ),
    pytest.param(
        nn.RNN,
        {"bidirectional": True, "nonlinearity": "relu", "bias": False},
        False,
        id="rnn_relu_bidirectional_no_bias_zero_state",
    ),
]


@pytest.mark.parametrize("layer_class, kwargs, with_state", RECURRENT_CASES)
def test_recurrent_gradients_match_finite_differences(layer_class, kwargs, with_state):
    layer = layer_class(INPUT_SIZE, HIDDEN_SIZE, dtype=F64, **kwargs)
    x = Tensor(sequence(batch_first=layer.batch_first), requires_grad=True, dtype=F64)
    states = None
    if with_state:
        count = 2 if layer_class is nn.LSTM else 1
        states = [
            Tensor(initial_state(state_rows(layer), seed=k), requires_grad=True, dtype=F64)
            for k in range(count)
        ]
    checked = [x] + (states or []) + list(layer.parameters())
    assert gradcheck(lambda *_: flat_outputs(layer, x, states), checked)


@pytest.mark.parametrize("layer_class, kwargs, with_state", RECURRENT_CASES)
def test_recurrent_matches_pytorch(torch, layer_class, kwargs, with_state):
    ours = layer_class(INPUT_SIZE, HIDDEN_SIZE, dtype=F64, **kwargs)
    # The same arguments, so a case that leaves batch_first out checks the defaults agree.
    theirs = getattr(torch.nn, layer_class.__name__)(INPUT_SIZE, HIDDEN_SIZE, **kwargs)
    theirs.double().load_state_dict({k: torch.from_numpy(v) for k, v in ours.state_dict().items()})

    arrays = [sequence(steps=5, batch=3, batch_first=ours.batch_first)]
    if with_state:
        count = 2 if layer_class is nn.LSTM else 1
        arrays += [initial_state(state_rows(ours), batch=3, seed=k) for k in range(count)]
    our_inputs = [Tensor(a, requires_grad=True, dtype=F64) for a in arrays]
    their_inputs = [torch.tensor(a, requires_grad=True) for a in arrays]

    our_outputs = flat_outputs(ours, our_inputs[0], our_inputs[1:] or None)
    if layer_class is nn.LSTM:
        hx = tuple(their_inputs[1:]) if with_state else None
        output, (hidden, cell) = theirs(their_inputs[0], hx)
        their_pieces = [output, hidden, cell]
    else:
        output, hidden = theirs(their_inputs[0], their_inputs[1] if with_state else None)
        their_pieces = [output, hidden]
    their_outputs = torch.cat([piece.reshape(-1) for piece in their_pieces])
    np.testing.assert_allclose(
        our_outputs.numpy(), their_outputs.detach().numpy(), rtol=1e-5, atol=1e-12
    )

    upstream = np.random.default_rng(2).standard_normal(our_outputs.shape)
    our_outputs.backward(upstream)
    their_outputs.backward(torch.from_numpy(upstream))
    names = ["input", "h_0", "c_0"]
    for name, mine, reference in zip(names, our_inputs, their_inputs, strict=False):
        np.testing.assert_allclose(
            mine.grad.numpy(),
            reference.grad.numpy(),
            rtol=1e-5,
            atol=1e-12,
            err_msg=f"gradient of {name}",
        )
    their_parameters = dict(theirs.named_parameters())
    assert [name for name, _ in ours.named_parameters()] == list(their_parameters)
    for name, parameter in ours.named_parameters():
        np.testing.assert_allclose(
            parameter.grad.numpy(),
            their_parameters[name].grad.numpy(),
            rtol=1e-5,
            atol=1e-12,
            err_msg=f"gradient of {name}",
        )


def test_long_sequence_matches_pytorch_and_needs_no_recursion(torch):
    steps = 1500
    ours = nn.GRU(2, 3, batch_first=True, dtype=F64)
    theirs = torch.nn.GRU(2, 3, batch_first=True).double()
    theirs.load_state_dict({k: torch.from_numpy(v) for k, v in ours.state_dict().items()})
    x = 0.5 * sequence(steps=steps, batch=2, features=2)
    our_x = Tensor(x, requires_grad=True, dtype=F64)
    their_x = torch.tensor(x, requires_grad=True)
    ours(our_x)[0].sum().backward()
    theirs(their_x)[0].sum().backward()
    np.testing.assert_allclose(our_x.grad.numpy(), their_x.grad.numpy(), rtol=1e-5, atol=1e-12)


# --- parameters and initialisation ----------------------------------------------------------
@pytest.mark.parametrize("layer_class, gates", [(nn.LSTM, 4), (nn.GRU, 3), (nn.RNN, 1)])
def test_parameters_have_pytorch_names_shapes_and_default_range(layer_class, gates):
    with nn.init.seeded(0):
        layer = layer_class(10, 20, num_layers=2)
    shapes = {name: parameter.shape for name, parameter in layer.named_parameters()}
    assert shapes == {
        "weight_ih_l0": (gates * 20, 10),
        "weight_hh_l0": (gates * 20, 20),
        "bias_ih_l0": (gates * 20,),
        "bias_hh_l0": (gates * 20,),
        "weight_ih_l1": (gates * 20, 20),
        "weight_hh_l1": (gates * 20, 20),
        "bias_ih_l1": (gates * 20,),
        "bias_hh_l1": (gates * 20,),
    }
    bound = 1 / math.sqrt(20)
    values = np.concatenate([p.numpy().reshape(-1) for p in layer.parameters()])
    assert values.min() >= -bound and values.max() <= bound
    # Thousands of uniform draws come close to both ends of the range.
    assert values.min() < -0.95 * bound and values.max() > 0.95 * bound
    assert all(p.dtype == np.float32 for p in layer.parameters())


def test_seeded_builds_are_identical():
    with nn.init.seeded(3):
        first = nn.LSTM(4, 5).state_dict()
    with nn.init.seeded(3):
        second = nn.LSTM(4, 5).state_dict()
    assert all(np.array_equal(first[name], second[name]) for name in first)


@pytest.mark.parametrize("layer_class", [nn.LSTM, nn.GRU, nn.RNN])
def test_float32_layer_keeps_float32_outputs_and_gradients(layer_class):
    layer = layer_class(INPUT_SIZE, HIDDEN_SIZE, batch_first=True)
    x = Tensor(sequence(), dtype=np.float32, requires_grad=True)
    output = layer(x)[0]
    output.sum().backward()
    assert output.dtype == np.float32 and output.shape == (BATCH, STEPS, HIDDEN_SIZE)
    assert x.grad.dtype == np.float32
    assert all(p.grad.dtype == np.float32 for p in layer.parameters())


@pytest.mark.parametrize("layer_class", [nn.LSTM, nn.GRU, nn.RNN])
def test_final_hidden_state_is_the_last_step_of_the_output(layer_class):
    layer = layer_class(INPUT_SIZE, HIDDEN_SIZE, num_layers=2, batch_first=False, dtype=F64)
    output, state = layer(Tensor(sequence(batch_first=False), dtype=F64))
    hidden = state[0] if layer_class is nn.LSTM else state
    assert output.shape == (STEPS, BATCH, HIDDEN_SIZE)
    assert hidden.shape == (2, BATCH, HIDDEN_SIZE)
    np.testing.assert_array_equal(hidden.numpy()[-1], output.numpy()[-1])


# --- bidirectional ---------------------------------------------------------------------------
@pytest.mark.parametrize("layer_class, gates", [(nn.LSTM, 4), (nn.GRU, 3), (nn.RNN, 1)])
def test_bidirectional_parameters_have_pytorchs_names_and_shapes(layer_class, gates):
    layer = layer_class(10, 20, num_layers=2, bidirectional=True, bias=False)
    shapes = {name: parameter.shape for name, parameter in layer.named_parameters()}
    assert list(shapes) == [
        "weight_ih_l0",
        "weight_hh_l0",
        "weight_ih_l0_reverse",
        "weight_hh_l0_reverse",
        "weight_ih_l1",
        "weight_hh_l1",
        "weight_ih_l1_reverse",
        "weight_hh_l1_reverse",
    ]
    assert shapes["weight_ih_l0_reverse"] == (gates * 20, 10)
    assert shapes["weight_ih_l1"] == shapes["weight_ih_l1_reverse"] == (gates * 20, 40)
    assert shapes["weight_hh_l1_reverse"] == (gates * 20, 20)


@pytest.mark.parametrize("layer_class", [nn.LSTM, nn.GRU, nn.RNN])
@pytest.mark.parametrize("batch_first", [True, False])
def test_bidirectional_final_states_are_the_ends_of_each_direction(layer_class, batch_first):
    layer = layer_class(
        INPUT_SIZE, HIDDEN_SIZE, num_layers=2, bidirectional=True, batch_first=batch_first
    )
    output, state = layer(Tensor(sequence(batch_first=batch_first), dtype=np.float32))
    hidden = (state[0] if layer_class is nn.LSTM else state).numpy()
    steps = output.numpy() if not batch_first else output.numpy().swapaxes(0, 1)
    assert steps.shape == (STEPS, BATCH, 2 * HIDDEN_SIZE)
    assert hidden.shape == (4, BATCH, HIDDEN_SIZE)
    # The last layer's forward direction ends at the last step, its reverse at the first.
    np.testing.assert_array_equal(hidden[2], steps[-1, :, :HIDDEN_SIZE])
    np.testing.assert_array_equal(hidden[3], steps[0, :, HIDDEN_SIZE:])


def test_reverse_direction_reads_the_sequence_back_to_front():
    """A bidirectional layer's reverse half is a forward layer run on the flipped sequence."""
    bidirectional = nn.GRU(INPUT_SIZE, HIDDEN_SIZE, bidirectional=True, batch_first=True, dtype=F64)
    reverse_only = nn.GRU(INPUT_SIZE, HIDDEN_SIZE, batch_first=True, dtype=F64)
    reverse_only.load_state_dict(
        {
            name.replace("_reverse", ""): value
            for name, value in bidirectional.state_dict().items()
            if name.endswith("_reverse")
        }
    )
    x = sequence()
    both, _ = bidirectional(Tensor(x, dtype=F64))
    flipped, _ = reverse_only(Tensor(x[:, ::-1].copy(), dtype=F64))
    np.testing.assert_allclose(both.numpy()[:, :, HIDDEN_SIZE:], flipped.numpy()[:, ::-1])


@pytest.mark.gpu
@pytest.mark.skipif(not backend.cuda_available(), reason="needs CuPy and a CUDA device")
@pytest.mark.parametrize("layer_class", [nn.LSTM, nn.GRU, nn.RNN])
def test_bidirectional_on_cuda_matches_cpu(layer_class):
    results = []
    for device in ("cpu", "cuda"):
        with nn.init.seeded(0):
            layer = layer_class(
                INPUT_SIZE, HIDDEN_SIZE, num_layers=2, bidirectional=True, batch_first=True
            )
        layer.to(device, dtype=F64)
        x = Tensor(sequence(), requires_grad=True, dtype=F64, device=device)
        output = flat_outputs(layer, x, None)
        output.backward(np.random.default_rng(1).standard_normal(output.shape))
        gradients = [p.grad.numpy() for p in layer.parameters()]
        results.append([output.numpy(), x.grad.numpy(), *gradients])
    for on_cpu, on_cuda in zip(*results, strict=True):
        np.testing.assert_allclose(on_cuda, on_cpu, rtol=1e-10, atol=1e-12)


def test_bidirectional_save_load_round_trip(tmp_path):
    layer = nn.LSTM(
        INPUT_SIZE, HIDDEN_SIZE, num_layers=2, bidirectional=True, dropout=0.25, batch_first=True
    )
    path = tmp_path / "bilstm.bigdl"
    nn.save(layer.eval(), path)
    loaded = nn.load(path)
    assert loaded.bidirectional and loaded.num_layers == 2 and loaded.dropout == 0.25
    x = Tensor(sequence(), dtype=np.float32)
    (output, (hidden, cell)), (loaded_output, (loaded_hidden, loaded_cell)) = layer(x), loaded(x)
    np.testing.assert_array_equal(loaded_output.numpy(), output.numpy())
    np.testing.assert_array_equal(loaded_hidden.numpy(), hidden.numpy())
    np.testing.assert_array_equal(loaded_cell.numpy(), cell.numpy())


@pytest.mark.parametrize("nonlinearity", ["tanh", "relu"])
def test_rnn_save_load_round_trip_keeps_the_nonlinearity(tmp_path, nonlinearity):
    layer = nn.RNN(INPUT_SIZE, HIDDEN_SIZE, 2, nonlinearity, bidirectional=True, dropout=0.25)
    path = tmp_path / "rnn.bigdl"
    nn.save(layer.eval(), path)
    loaded = nn.load(path)
    assert isinstance(loaded, nn.RNN) and loaded.nonlinearity == nonlinearity
    assert loaded.bidirectional and loaded.num_layers == 2 and loaded.dropout == 0.25
    assert loaded.batch_first is False
    x = Tensor(sequence(batch_first=False), dtype=np.float32)
    (output, hidden), (loaded_output, loaded_hidden) = layer(x), loaded(x)
    np.testing.assert_array_equal(loaded_output.numpy(), output.numpy())
    np.testing.assert_array_equal(loaded_hidden.numpy(), hidden.numpy())


def test_rnn_relu_differs_from_tanh_and_is_never_negative():
    """The nonlinearity reaches the recurrence (a relu layer run as tanh would pass the
    shape checks)."""
    with nn.init.seeded(0):
        relu = nn.RNN(INPUT_SIZE, HIDDEN_SIZE, nonlinearity="relu", dtype=F64)
    tanh = nn.RNN(INPUT_SIZE, HIDDEN_SIZE, dtype=F64)
    tanh.load_state_dict(relu.state_dict())
    x = Tensor(3 * sequence(steps=6, batch_first=False), dtype=F64)
    relu_output, tanh_output = relu(x)[0].numpy(), tanh(x)[0].numpy()
    assert relu_output.min() >= 0 and (relu_output == 0).any() and (relu_output > 1).any()
    assert tanh_output.min() < 0 and np.abs(tanh_output).max() < 1


# --- dropout between layers -----------------------------------------------------------------
def test_dropout_acts_between_layers_in_training_only():
    with nn.init.seeded(0):
        dropped = nn.LSTM(
            INPUT_SIZE, HIDDEN_SIZE, num_layers=2, dropout=0.5, batch_first=True, dtype=F64
        )
    with nn.init.seeded(0):
        plain = nn.LSTM(INPUT_SIZE, HIDDEN_SIZE, num_layers=2, batch_first=True, dtype=F64)
    x = Tensor(sequence(), dtype=F64)
    ops.manual_seed(0)
    assert not np.allclose(dropped(x)[0].numpy(), plain(x)[0].numpy())
    dropped.eval()
    np.testing.assert_array_equal(dropped(x)[0].numpy(), plain(x)[0].numpy())


# --- errors ---------------------------------------------------------------------------------
def float32_zeros(*shape) -> Tensor:
    return Tensor(np.zeros(shape), dtype=np.float32)


@pytest.mark.parametrize(
    "call, error, message",
    [
        (
            lambda: nn.LSTM(3, 2)(Tensor(np.zeros((2, 4, 5)))),
            ValueError,
            r"LSTM\(3, 2\): expects \(T, N, input_size\) input with input_size=3, got shape",
        ),
        (
            lambda: nn.GRU(3, 2, batch_first=True)(Tensor(np.zeros((4, 3)))),
            ValueError,
            r"expects \(N, T, input_size\) input",
        ),
        (lambda: nn.GRU(3, 2)(Tensor(np.zeros((0, 2, 3)))), ValueError, "sequence is empty"),
        (
            lambda: nn.GRU(3, 2, batch_first=True)(Tensor(np.zeros((2, 0, 3)))),
            ValueError,
            "sequence is empty",
        ),
        (
            lambda: nn.GRU(3, 2)(Tensor(np.zeros((2, 4, 3)), dtype=F64)),
            TypeError,
            "input dtype float64 differs from the parameters' float32",
        ),
        (
            lambda: nn.GRU(3, 2, num_layers=2, batch_first=True)(
                float32_zeros(2, 4, 3), np.zeros((1, 2, 2))
            ),
            ValueError,
            r"initial hidden state h_0 must have shape .* \(2, 2, 2\), got \(1, 2, 2\)",
        ),
        (
            lambda: nn.LSTM(3, 2)(float32_zeros(2, 4, 3), np.zeros((1, 2, 2))),
            TypeError,
            r"hx must be a pair \(h_0, c_0\)",
        ),
        (
            lambda: nn.GRU(3, 2, batch_first=True)(float32_zeros(2, 4, 3), np.zeros((1, 2, 2))),
            TypeError,
            "initial hidden state h_0 has dtype float64 but the parameters are float32",
        ),
        (
            lambda: nn.LSTM(3, 2, bidirectional=True, batch_first=True)(
                float32_zeros(2, 4, 3), (float32_zeros(1, 2, 2), float32_zeros(1, 2, 2))
            ),
            ValueError,
            r"h_0 must have shape \(num_layers \* 2, N, hidden_size\) = \(2, 2, 2\), got \(1,",
        ),
        (lambda: nn.LSTM(3, 0), ValueError, "hidden_size must be a positive integer"),
        (lambda: nn.GRU(3, 2, dropout=1.5), ValueError, "dropout must be a number in"),
        (
            lambda: nn.RNN(3, 2, nonlinearity="sigmoid"),
            ValueError,
            r"RNN: nonlinearity must be one of \('tanh', 'relu'\), got 'sigmoid'",
        ),
        (
            lambda: nn.RNN(3, 2, 1, True),  # PyTorch's order: the 4th argument is nonlinearity
            ValueError,
            "RNN: nonlinearity must be one of .* got True",
        ),
        (
            lambda: nn.RNN(3, 2, batch_first=True)(float32_zeros(2, 4, 5)),
            ValueError,
            r"RNN\(3, 2, batch_first=True\): expects \(N, T, input_size\) input",
        ),
    ],
    ids=[
        "feature_size",
        "rank",
        "empty_time_major",
        "empty_batch_first",
        "dtype",
        "state_shape",
        "lstm_state_pair",
        "state_dtype",
        "bidirectional_state_shape",
        "hidden_size",
        "dropout",
        "rnn_nonlinearity",
        "rnn_arguments_in_pytorchs_order",
        "rnn_feature_size",
    ],
)
def test_bad_inputs_and_settings_are_refused_with_a_clear_message(call, error, message):
    with pytest.raises(error, match=message):
        call()


# --- with a loss, end to end ------------------------------------------------------------------
# A plain RNN's loss is chaotic at the gated layers' step size (it fell, then jumped back
# after ~110 steps, in PyTorch too, each run with its own last bits): it takes a smaller one.
@pytest.mark.parametrize("layer_class, step_size", [(nn.LSTM, 0.5), (nn.GRU, 0.5), (nn.RNN, 0.1)])
def test_recurrent_layer_with_cross_entropy_learns_the_sign_of_a_sequence_sum(
    layer_class, step_size
):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 8, 1))
    labels = (x.sum(axis=(1, 2)) > 0).astype(int)
    with nn.init.seeded(0):
        recurrent = layer_class(1, 8, batch_first=True, dtype=F64)
    readout = nn.Parameter(0.1 * rng.standard_normal((2, 8)))
    parameters = list(recurrent.parameters()) + [readout]
    loss_function = nn.CrossEntropyLoss()
    losses = []
    for _ in range(120):  # full-batch gradient descent
        output, _ = recurrent(Tensor(x, dtype=F64))
        loss = loss_function(ops.linear(output[:, -1], readout), labels)
        for parameter in parameters:
            parameter.grad = None
        loss.backward()
        for parameter in parameters:
            parameter.data -= step_size * parameter.grad.data
        losses.append(loss.item())
    assert losses[-1] < 0.4 * losses[0]


@pytest.mark.parametrize("layer_class", [nn.LSTM, nn.GRU, nn.RNN])
@pytest.mark.parametrize("batch_first", [True, False])
def test_bidirectional_layer_is_the_same_with_one_loop_or_a_thread_per_direction(
    layer_class, batch_first
):
    # One BLAS thread runs both directions in one loop; two run a thread per direction.
    layer = layer_class(5, 4, num_layers=2, batch_first=batch_first, bidirectional=True, dtype=F64)
    x = sequence(steps=6, batch=3, features=5, batch_first=batch_first)
    results = []
    for threads in (1, 2):
        with backend.blas_threads(threads):
            layer.zero_grad()
            our_x = Tensor(x, requires_grad=True, dtype=F64)
            output, final = layer(our_x)
            hidden = final[0] if layer_class is nn.LSTM else final
            (0.3 * output.sum() + (hidden * hidden).sum()).backward()
            grads = [our_x.grad.numpy()] + [p.grad.numpy() for p in layer.parameters()]
            results.append([output.numpy()] + [np.array(g, copy=True) for g in grads])
    for one_loop, threaded in zip(*results, strict=True):
        np.testing.assert_allclose(one_loop, threaded, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("layer_class", [nn.LSTM, nn.GRU, nn.RNN])
def test_reusing_buffers_keeps_each_pending_backward_right(layer_class):
    # The layers reuse their large buffers once a backward has released them; two forward
    # passes whose backward is still to come must not share any.
    layer = layer_class(3, 4, bidirectional=True, batch_first=True, dtype=F64)
    inputs = [sequence(steps=5, batch=2, seed=seed) for seed in (0, 1)]

    def gradients(pending_together: bool) -> list:
        xs = [Tensor(x, requires_grad=True, dtype=F64) for x in inputs]
        results = []
        outputs = [layer(x)[0] for x in xs] if pending_together else []
        for k, x in enumerate(xs):
            layer.zero_grad()
            output = outputs[k] if pending_together else layer(x)[0]
            (output * output).sum().backward()
            results += [x.grad.numpy()] + [np.array(p.grad.numpy()) for p in layer.parameters()]
        return results

    one_at_a_time = gradients(pending_together=False)
    for _ in range(2):  # the second round runs on reused buffers
        for expected, got in zip(one_at_a_time, gradients(pending_together=True), strict=True):
            # A shared buffer would garble a gradient; the products' thread split (which
            # can change with the machine's load) only moves the last bits.
            np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-14)
