"""TransformerEncoderLayer and TransformerEncoder: finite differences, PyTorch parity, copies,
masks, save/load and errors.

The PyTorch checks load our ``state_dict`` into ``torch.nn.TransformerEncoder(Layer)`` with
``strict=True`` (so every name is PyTorch's) and compare outputs and gradients in float64 to
1e-5 relative. Dropout is 0 so both run the same function; PyTorch's modules stay in
training mode, where they never take their fused inference path.
"""

from __future__ import annotations

import numpy as np
import pytest

from bigdl_py import backend, nn
from bigdl_py.autograd import Tensor, gradcheck

F64 = np.float64
D_MODEL, HEADS, FEEDFORWARD, BATCH, STEPS = 4, 2, 6, 2, 3


def padding():
    mask = np.zeros((BATCH, STEPS), dtype=bool)
    mask[1, -1] = True
    return mask


def layer_kwargs(**overrides):
    return {"dim_feedforward": FEEDFORWARD, "dropout": 0.0, **overrides}


# (id, layer kwargs, number of layers (0: the layer alone), final norm, forward kwargs)
CASES = [
    ("layer_post_norm", layer_kwargs(), 0, False, {}),
    ("layer_pre_norm_gelu", layer_kwargs(norm_first=True, activation="gelu"), 0, False, {}),
    ("layer_batch_first_padding", layer_kwargs(batch_first=True), 0, False, {"pad": True}),
    ("layer_no_bias_causal", layer_kwargs(bias=False), 0, False, {"causal": True}),
    ("encoder_two_layers", layer_kwargs(), 2, False, {}),
    (
        "encoder_pre_norm_final_norm_masks",
        layer_kwargs(norm_first=True, batch_first=True),
        2,
        True,
        {"pad": True, "causal": True},
    ),
]
CASE_PARAMS = [pytest.param(*case[1:], id=case[0]) for case in CASES]


def build(kwargs, num_layers, final_norm):
    with nn.init.seeded(0):
        layer = nn.TransformerEncoderLayer(D_MODEL, HEADS, dtype=F64, **kwargs)
        if not num_layers:
            return layer
        norm = nn.LayerNorm(D_MODEL, dtype=F64) if final_norm else None
        return nn.TransformerEncoder(layer, num_layers, norm=norm)


def source(batch_first, seed=0):
    shape = (BATCH, STEPS, D_MODEL) if batch_first else (STEPS, BATCH, D_MODEL)
    return np.random.default_rng(seed).standard_normal(shape)


def call(module, x, options, mask_from=np.asarray):
    """Run ``module`` with the masks ``options`` asks for, in the right argument names."""
    kwargs = {}
    if options.get("pad"):
        kwargs["src_key_padding_mask"] = mask_from(padding())
    if options.get("causal"):
        # Ours and PyTorch's name the argument alike: ``src_mask`` of a layer, ``mask`` of
        # an encoder.
        layer_alone = type(module).__name__ == "TransformerEncoderLayer"
        mask_name = "src_mask" if layer_alone else "mask"
        kwargs[mask_name] = mask_from(np.triu(np.ones((STEPS, STEPS), dtype=bool), k=1))
    return module(x, **kwargs)


@pytest.mark.parametrize("kwargs, num_layers, final_norm, options", CASE_PARAMS)
def test_encoder_gradients_match_finite_differences(kwargs, num_layers, final_norm, options):
    module = build(kwargs, num_layers, final_norm)
    x = Tensor(source(kwargs.get("batch_first", False)), requires_grad=True, dtype=F64)
    assert gradcheck(lambda *_: call(module, x, options), [x, *module.parameters()])


@pytest.mark.parametrize("kwargs, num_layers, final_norm, options", CASE_PARAMS)
def test_encoder_matches_pytorch(torch, kwargs, num_layers, final_norm, options):
    ours = build(kwargs, num_layers, final_norm)
    their_layer = torch.nn.TransformerEncoderLayer(D_MODEL, HEADS, **kwargs)
    if num_layers:
        norm = torch.nn.LayerNorm(D_MODEL) if final_norm else None
        theirs = torch.nn.TransformerEncoder(
            their_layer, num_layers, norm=norm, enable_nested_tensor=False
        )
    else:
        theirs = their_layer
    theirs.double().train()
    state = {name: torch.from_numpy(value) for name, value in ours.state_dict().items()}
    theirs.load_state_dict(state, strict=True)
    assert [name for name, _ in ours.named_parameters()] == [
        name for name, _ in theirs.named_parameters()
    ]

    # Our GELU's erf is a fit good to about 1e-7 relative (float32 precision, see
    # autograd/ops/activation.py), so a GELU network matches to that absolute level.
    atol = 1e-7 if kwargs.get("activation") == "gelu" else 1e-12
    array = source(kwargs.get("batch_first", False))
    our_x = Tensor(array, requires_grad=True, dtype=F64)
    their_x = torch.tensor(array, requires_grad=True)
    our_output = call(ours, our_x, options)
    their_output = call(theirs, their_x, options, mask_from=torch.from_numpy)
    np.testing.assert_allclose(
        our_output.numpy(), their_output.detach().numpy(), rtol=1e-5, atol=atol
    )
    upstream = np.random.default_rng(1).standard_normal(our_output.shape)
    our_output.backward(upstream)
    their_output.backward(torch.from_numpy(upstream))
    np.testing.assert_allclose(our_x.grad.numpy(), their_x.grad.numpy(), rtol=1e-5, atol=atol)
    their_parameters = dict(theirs.named_parameters())
    for name, parameter in ours.named_parameters():
        np.testing.assert_allclose(
            parameter.grad.numpy(),
            their_parameters[name].grad.numpy(),
            rtol=1e-5,
            atol=atol,
            err_msg=f"gradient of {name}",
        )


@pytest.mark.gpu
@pytest.mark.skipif(not backend.cuda_available(), reason="needs CuPy and a CUDA device")
def test_encoder_on_cuda_matches_cpu():
    kwargs, options = layer_kwargs(norm_first=True, batch_first=True), {"pad": True, "causal": True}
    results = []
    for device in ("cpu", "cuda"):
        encoder = build(kwargs, 2, True).to(device)
        x = Tensor(source(True), requires_grad=True, dtype=F64, device=device)
        output = call(encoder, x, options)
        output.backward(np.random.default_rng(1).standard_normal(output.shape))
        gradients = [p.grad.numpy() for p in encoder.parameters()]
        results.append([output.numpy(), x.grad.numpy(), *gradients])
    for on_cpu, on_cuda in zip(*results, strict=True):
        np.testing.assert_allclose(on_cuda, on_cpu, rtol=1e-10, atol=1e-12)


def test_encoder_layers_are_independent_copies_of_the_given_layer():
    layer = nn.TransformerEncoderLayer(D_MODEL, HEADS, dim_feedforward=FEEDFORWARD)
    encoder = nn.TransformerEncoder(layer, 3)
    copies = list(encoder.layers)
    assert len(copies) == 3 and all(copy is not layer for copy in copies)
    for name, value in layer.state_dict().items():  # same starting weights, as in PyTorch
        for index in range(3):
            np.testing.assert_array_equal(encoder.state_dict()[f"layers.{index}.{name}"], value)
    ids = {id(p) for p in encoder.parameters()}
    assert len(ids) == 3 * len(list(layer.parameters()))
    assert not ids & {id(p) for p in layer.parameters()}
    assert encoder.norm is None
    # PyTorch's fast-path switches are accepted, so PyTorch code runs unchanged.
    assert len(nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).layers) == 2


def test_is_causal_equals_the_explicit_mask():
    encoder = build(layer_kwargs(batch_first=True), 2, False)
    x = Tensor(source(True), dtype=F64)
    explicit = encoder(x, mask=nn.generate_square_subsequent_mask(STEPS, dtype=F64))
    np.testing.assert_array_equal(encoder(x, is_causal=True).numpy(), explicit.numpy())
    # Causality: the first step's output does not depend on later steps.
    changed = source(True)
    changed[:, 1:] += 1.0
    first = encoder(Tensor(changed, dtype=F64), is_causal=True).numpy()[:, 0]
    np.testing.assert_allclose(first, explicit.numpy()[:, 0], rtol=1e-12)


def test_dropout_is_active_in_training_only():
    with nn.init.seeded(0):
        layer = nn.TransformerEncoderLayer(D_MODEL, HEADS, FEEDFORWARD, dropout=0.5)
    x = Tensor(source(False), dtype=np.float32)
    first, second = layer(x).numpy(), layer(x).numpy()
    assert not np.allclose(first, second)
    layer.eval()
    np.testing.assert_array_equal(layer(x).numpy(), layer(x).numpy())


def test_save_load_round_trip(tmp_path):
    with nn.init.seeded(0):
        layer = nn.TransformerEncoderLayer(
            D_MODEL, HEADS, FEEDFORWARD, activation="gelu", norm_first=True, batch_first=True
        )
        encoder = nn.TransformerEncoder(layer, 2, norm=nn.LayerNorm(D_MODEL)).eval()
    for parameter in encoder.parameters():  # the layers differ after training; so here
        parameter.data += np.random.default_rng(0).standard_normal(parameter.shape) * 0.1
    path = tmp_path / "encoder.bigdl"
    nn.save(encoder, path)
    loaded = nn.load(path)
    assert isinstance(loaded, nn.TransformerEncoder) and not loaded.training
    assert loaded.layers[1].activation == "gelu" and loaded.layers[1].norm_first
    x = Tensor(source(True), dtype=np.float32)
    np.testing.assert_array_equal(
        loaded(x, src_key_padding_mask=padding()).numpy(),
        encoder(x, src_key_padding_mask=padding()).numpy(),
    )


def test_square_subsequent_mask_is_pytorchs(torch):
    ours = nn.generate_square_subsequent_mask(5)
    theirs = torch.nn.Transformer.generate_square_subsequent_mask(5).numpy()
    np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize(
    "call_, error, message",
    [
        (
            lambda: nn.TransformerEncoderLayer(4, 2, activation="tanh"),
            ValueError,
            "activation must be one of",
        ),
        (lambda: nn.TransformerEncoderLayer(6, 4), ValueError, "embed_dim 6 is not divisible"),
        (lambda: nn.TransformerEncoderLayer(4, 2, dropout=-1), ValueError, "dropout must be"),
        (lambda: nn.TransformerEncoder(nn.Linear(2, 2), 0), ValueError, "num_layers must be"),
        (lambda: nn.TransformerEncoder("layer", 2), TypeError, "encoder_layer must be a Module"),
        (
            lambda: nn.TransformerEncoder(nn.Linear(2, 2), 2, norm="layer_norm"),
            TypeError,
            "norm must be a Module or None",
        ),
        (
            lambda: nn.TransformerEncoderLayer(4, 2)(Tensor(np.zeros((3, 2, 5)), dtype=np.float32)),
            ValueError,
            "query must have embed_dim=4 features",
        ),
    ],
    ids=["activation", "heads", "dropout", "num_layers", "layer_type", "norm_type", "width"],
)
def test_bad_settings_and_inputs_are_refused(call_, error, message):
    with pytest.raises(error, match=message):
        call_()


def test_encoder_classifier_learns_which_of_two_tokens_comes_first():
    """End to end with a loss and gradient descent: the encoder, mean-pooled, feeds a linear
    classifier that must tell which of two tokens came first (both are always present)."""
    rng = np.random.default_rng(0)
    steps, width = 4, 8
    labels = rng.integers(0, 2, 64)
    tokens = np.zeros((64, steps, width))
    first, second = np.where(labels[:, None] == 1, [2, 3], [3, 2]).T
    tokens[np.arange(64), 0, first] = 1.0
    tokens[np.arange(64), 1, second] = 1.0
    tokens[:, :, 4 : 4 + steps] += np.eye(steps)  # one-hot positions
    with nn.init.seeded(0):
        encoder = nn.TransformerEncoder(
            nn.TransformerEncoderLayer(width, 2, 16, dropout=0.0, batch_first=True, dtype=F64), 1
        )
        readout = nn.Linear(width, 2, dtype=F64)
    parameters = list(encoder.parameters()) + list(readout.parameters())
    loss_function = nn.CrossEntropyLoss()
    losses = []
    for _ in range(80):  # full-batch gradient descent
        encoded = encoder(Tensor(tokens, dtype=F64))
        loss = loss_function(readout(encoded.mean(axis=1)), labels)
        for parameter in parameters:
            parameter.grad = None
        loss.backward()
        for parameter in parameters:
            parameter.data -= 0.3 * parameter.grad.data
        losses.append(loss.item())
    assert losses[-1] < 0.2 * losses[0]
