"""MultiheadAttention: finite differences, PyTorch parity, masks, initialisation, errors.

The PyTorch check copies our parameters into ``torch.nn.MultiheadAttention`` with
``load_state_dict(strict=True)`` (proving the names and shapes are PyTorch's), then compares
the output, the attention weights and the gradients of every input and parameter, in
float64 to 1e-5 relative.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from bigdl_py import backend, nn
from bigdl_py.autograd import Tensor, gradcheck, ops

F64 = np.float64
EMBED, HEADS, BATCH, TARGET, SOURCE = 4, 2, 2, 3, 4


def causal(target=TARGET, source=SOURCE):
    return np.triu(np.ones((target, source), dtype=bool), k=1)


def padding(batch=BATCH, source=SOURCE):
    """A bool key-padding mask leaving every sample at least one key."""
    mask = np.zeros((batch, source), dtype=bool)
    mask[0, -1] = True
    mask[-1, -2:] = True
    return mask


def float_mask(shape, seed=5):
    return np.random.default_rng(seed).standard_normal(shape)


# (id, constructor kwargs, input kind, forward kwargs). Input kinds: "self" (one tensor is
# query, key and value), "cross" (query of TARGET steps, key and value of SOURCE steps),
# "unbatched" (cross, without the batch axis).
CASES = [
    ("self_attention", {}, "self", {}),
    ("self_attention_batch_first", {"batch_first": True}, "self", {}),
    ("cross_attention", {}, "cross", {}),
    ("cross_attention_batch_first", {"batch_first": True}, "cross", {}),
    ("no_bias", {"bias": False}, "cross", {}),
    ("kdim_vdim", {"kdim": 3, "vdim": 5, "batch_first": True}, "cross", {}),
    ("weights_per_head", {}, "cross", {"average_attn_weights": False}),
    ("no_weights", {}, "cross", {"need_weights": False}),
    (
        "no_weights_both_masks",
        {"batch_first": True},
        "cross",
        {"need_weights": False, "attn_mask": causal(), "key_padding_mask": padding()},
    ),
    ("no_weights_causal", {}, "self_square", {"need_weights": False, "is_causal": True}),
    (
        "no_weights_kdim_vdim_unbatched",
        {"kdim": 3, "vdim": 5},
        "unbatched",
        {"need_weights": False},
    ),
    ("bool_attn_mask", {}, "cross", {"attn_mask": causal()}),
    ("float_attn_mask", {}, "cross", {"attn_mask": float_mask((TARGET, SOURCE))}),
    (
        "attn_mask_per_head",
        {"batch_first": True},
        "cross",
        {"attn_mask": float_mask((BATCH * HEADS, TARGET, SOURCE))},
    ),
    ("bool_key_padding_mask", {}, "cross", {"key_padding_mask": padding()}),
    ("float_key_padding_mask", {}, "cross", {"key_padding_mask": float_mask((BATCH, SOURCE))}),
    (
        "both_masks",
        {"batch_first": True},
        "cross",
        {"attn_mask": causal(), "key_padding_mask": padding(), "average_attn_weights": False},
    ),
    ("causal_self_attention", {}, "self_square", {"is_causal": True}),
    ("unbatched", {}, "unbatched", {"key_padding_mask": padding()[0]}),
]


def make_inputs(kind, layer, seed=0):
    """Float64 arrays for query, key and value (one array for self-attention)."""
    rng = np.random.default_rng(seed)
    if kind in ("self", "self_square"):
        steps = SOURCE if kind == "self" else TARGET
        shape = (BATCH, steps, EMBED) if layer.batch_first else (steps, BATCH, EMBED)
        return [rng.standard_normal(shape)]
    shapes = []
    for steps, width in ((TARGET, EMBED), (SOURCE, layer.kdim), (SOURCE, layer.vdim)):
        if kind == "unbatched":
            shapes.append((steps, width))
        elif layer.batch_first:
            shapes.append((BATCH, steps, width))
        else:
            shapes.append((steps, BATCH, width))
    return [rng.standard_normal(shape) for shape in shapes]


def run(layer, inputs, forward_kwargs):
    """``layer(query, key, value, ...)`` with one tensor repeated for self-attention."""
    query, key, value = inputs if len(inputs) == 3 else inputs * 3
    return layer(query, key, value, **forward_kwargs)


def flat(output, weights):
    pieces = [output] if weights is None else [output, weights]
    return ops.concatenate([ops.reshape(piece, (-1,)) for piece in pieces])


def build(kwargs):
    with nn.init.seeded(0):
        return nn.MultiheadAttention(EMBED, HEADS, dtype=F64, **kwargs)


@pytest.mark.parametrize(
    "kwargs, kind, forward_kwargs", [pytest.param(*case[1:], id=case[0]) for case in CASES]
)
def test_attention_gradients_match_finite_differences(kwargs, kind, forward_kwargs):
    layer = build(kwargs)
    inputs = [Tensor(a, requires_grad=True, dtype=F64) for a in make_inputs(kind, layer)]
    checked = inputs + list(layer.parameters())
    assert gradcheck(lambda *_: flat(*run(layer, inputs, forward_kwargs)), checked)


@pytest.mark.parametrize(
    "kwargs, kind, forward_kwargs", [pytest.param(*case[1:], id=case[0]) for case in CASES]
)
def test_attention_matches_pytorch(torch, kwargs, kind, forward_kwargs):
    ours = build(kwargs)
    theirs = torch.nn.MultiheadAttention(EMBED, HEADS, **kwargs).double()
    state = {name: torch.from_numpy(value) for name, value in ours.state_dict().items()}
    theirs.load_state_dict(state, strict=True)
    assert [name for name, _ in ours.named_parameters()] == [
        name for name, _ in theirs.named_parameters()
    ]
    arrays = make_inputs(kind, ours)
    our_inputs = [Tensor(a, requires_grad=True, dtype=F64) for a in arrays]
    their_inputs = [torch.tensor(a, requires_grad=True) for a in arrays]
    their_kwargs = {
        key: torch.from_numpy(value) if isinstance(value, np.ndarray) else value
        for key, value in forward_kwargs.items()
    }
    if forward_kwargs.get("is_causal"):
        # PyTorch takes is_causal only as a hint beside the mask; ours builds the mask.
        their_kwargs["attn_mask"] = torch.from_numpy(causal(TARGET, TARGET))

    our_output = flat(*run(ours, our_inputs, forward_kwargs))
    their_output, their_weights = run(theirs, their_inputs, their_kwargs)
    pieces = [their_output] if their_weights is None else [their_output, their_weights]
    their_flat = torch.cat([piece.reshape(-1) for piece in pieces])
    np.testing.assert_allclose(
        our_output.numpy(), their_flat.detach().numpy(), rtol=1e-5, atol=1e-12
    )

    upstream = np.random.default_rng(1).standard_normal(our_output.shape)
    our_output.backward(upstream)
    their_flat.backward(torch.from_numpy(upstream))
    for position, (mine, reference) in enumerate(zip(our_inputs, their_inputs, strict=True)):
        np.testing.assert_allclose(
            mine.grad.numpy(),
            reference.grad.numpy(),
            rtol=1e-5,
            atol=1e-12,
            err_msg=f"gradient of input {position}",
        )
    their_parameters = dict(theirs.named_parameters())
    for name, parameter in ours.named_parameters():
        np.testing.assert_allclose(
            parameter.grad.numpy(),
            their_parameters[name].grad.numpy(),
            rtol=1e-5,
            atol=1e-12,
            err_msg=f"gradient of {name}",
        )


# --- masks ------------------------------------------------------------------------------------
def test_masked_keys_get_zero_weight_and_do_not_change_the_output():
    layer = build({"batch_first": True})
    query, key, value = (Tensor(a, dtype=F64) for a in make_inputs("cross", layer))
    mask = padding()
    _, weights = layer(query, key, value, key_padding_mask=mask)
    assert np.all(weights.numpy()[np.broadcast_to(mask[:, None, :], weights.shape)] == 0)
    # Changing a masked key and value leaves the output as it was.
    changed_key, changed_value = key.numpy().copy(), value.numpy().copy()
    changed_key[0, -1] += 10.0
    changed_value[0, -1] -= 10.0
    before, _ = layer(query, key, value, key_padding_mask=mask)
    after, _ = layer(query, Tensor(changed_key), Tensor(changed_value), key_padding_mask=mask)
    np.testing.assert_allclose(after.numpy(), before.numpy(), rtol=1e-12)


def test_is_causal_equals_the_explicit_causal_mask():
    layer = build({})
    (x,) = make_inputs("self_square", layer)
    x = Tensor(x, dtype=F64)
    built, built_weights = layer(x, x, x, is_causal=True)
    given, given_weights = layer(x, x, x, attn_mask=nn.generate_square_subsequent_mask(TARGET))
    np.testing.assert_array_equal(built.numpy(), given.numpy())
    np.testing.assert_array_equal(built_weights.numpy(), given_weights.numpy())
    assert np.all(np.triu(built_weights.numpy()[0], k=1) == 0)


def test_fused_path_equals_the_composed_one_dropout_included():
    """Without weights the attention runs as one fused op; with them, as composed ops. Both
    draw the dropout mask from the same seeded generator, so they must agree exactly."""
    layer = build({"dropout": 0.3, "batch_first": True})
    arrays = make_inputs("cross", layer)
    results = []
    for need_weights in (True, False):
        inputs = [Tensor(a, requires_grad=True, dtype=F64) for a in arrays]
        layer.zero_grad(set_to_none=True)
        ops.manual_seed(3)
        output, _ = layer(*inputs, key_padding_mask=padding(), need_weights=need_weights)
        output.backward(np.random.default_rng(1).standard_normal(output.shape))
        gradients = [x.grad.numpy() for x in inputs] + [p.grad.numpy() for p in layer.parameters()]
        results.append([output.numpy(), *gradients])
    for composed, fused in zip(*results, strict=True):
        np.testing.assert_allclose(fused, composed, rtol=1e-10, atol=1e-13)


def test_fused_dropout_gradient_matches_finite_differences():
    layer = build({"dropout": 0.4})
    inputs = [Tensor(a, requires_grad=True, dtype=F64) for a in make_inputs("cross", layer)]

    def run(*_):
        ops.manual_seed(0)  # the same dropout mask on every call
        return layer(*inputs, need_weights=False)[0]

    assert gradcheck(run, inputs + list(layer.parameters()))


@pytest.mark.gpu
@pytest.mark.skipif(not backend.cuda_available(), reason="needs CuPy and a CUDA device")
@pytest.mark.parametrize("need_weights", [True, False])
def test_attention_on_cuda_matches_cpu(need_weights):
    cpu_layer = build({"batch_first": True})
    cuda_layer = build({"batch_first": True}).to("cuda")
    arrays = make_inputs("cross", cpu_layer)
    options = {"attn_mask": causal(), "key_padding_mask": padding(), "need_weights": need_weights}
    results = []
    for layer, device in ((cpu_layer, "cpu"), (cuda_layer, "cuda")):
        inputs = [Tensor(a, requires_grad=True, dtype=F64, device=device) for a in arrays]
        output = flat(*layer(*inputs, **options))
        output.backward(np.random.default_rng(1).standard_normal(output.shape))
        gradients = [x.grad.numpy() for x in inputs] + [p.grad.numpy() for p in layer.parameters()]
        results.append([output.numpy(), *gradients])
    for on_cpu, on_cuda in zip(*results, strict=True):
        np.testing.assert_allclose(on_cuda, on_cpu, rtol=1e-10, atol=1e-12)


# --- dropout, dtype, initialisation -------------------------------------------------------------
def test_dropout_acts_on_the_weights_in_training_only():
    layer = build({"dropout": 0.5})
    query, key, value = (Tensor(a, dtype=F64) for a in make_inputs("cross", layer))
    _, per_head = layer(query, key, value, average_attn_weights=False)
    dropped = per_head.numpy() == 0
    assert dropped.any()
    layer.eval()
    _, undropped = layer(query, key, value, average_attn_weights=False)
    np.testing.assert_allclose(undropped.numpy().sum(axis=-1), 1.0, rtol=1e-12)
    # In training the kept weights are the evaluation weights scaled by 1 / (1 - p).
    np.testing.assert_allclose(
        per_head.numpy()[~dropped], 2.0 * undropped.numpy()[~dropped], rtol=1e-12
    )


def test_float32_layer_keeps_float32():
    layer = nn.MultiheadAttention(EMBED, HEADS, batch_first=True)
    x = Tensor(np.ones((BATCH, TARGET, EMBED)), dtype=np.float32, requires_grad=True)
    output, weights = layer(x, x, x)
    output.sum().backward()
    assert output.dtype == weights.dtype == x.grad.dtype == np.float32
    assert output.shape == (BATCH, TARGET, EMBED) and weights.shape == (BATCH, TARGET, TARGET)


@pytest.mark.parametrize("kdim", [None, 6])
def test_initialisation_is_pytorchs(kdim):
    with nn.init.seeded(0):
        layer = nn.MultiheadAttention(16, 4, kdim=kdim, vdim=kdim)
    names = [name for name, _ in layer.named_parameters()]
    if kdim is None:
        assert names == ["in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"]
        projections = [layer.in_proj_weight.numpy()]
        fans = [(16, 3 * 16)]
    else:
        assert names[:3] == ["q_proj_weight", "k_proj_weight", "v_proj_weight"]
        projections = [layer.q_proj_weight.numpy(), layer.k_proj_weight.numpy()]
        fans = [(16, 16), (6, 16)]
    for weights, (fan_in, fan_out) in zip(projections, fans, strict=True):
        bound = math.sqrt(6.0 / (fan_in + fan_out))  # Xavier-uniform
        assert np.abs(weights).max() <= bound and np.abs(weights).max() > 0.8 * bound
    assert not layer.in_proj_bias.numpy().any() and not layer.out_proj.bias.numpy().any()
    out_bound = 1 / math.sqrt(16)  # Linear's default
    assert np.abs(layer.out_proj.weight.numpy()).max() <= out_bound


@pytest.mark.parametrize("need_weights", [True, False])
@pytest.mark.parametrize("layout", ["time_major", "batch_first", "unbatched"])
def test_zero_length_keys_give_pytorchs_outputs(torch, need_weights, layout):
    """Issue 27 item 20: attending to no keys is a weighted sum of nothing, zeros, so the
    output is the output projection's bias and the weights are (N, L, 0), as PyTorch gives."""
    ours = build({"batch_first": layout == "batch_first"})
    ours.out_proj.bias.data[...] = np.random.default_rng(3).standard_normal(EMBED)
    theirs = torch.nn.MultiheadAttention(EMBED, HEADS, batch_first=ours.batch_first).double()
    theirs.load_state_dict(
        {name: torch.from_numpy(value) for name, value in ours.state_dict().items()}, strict=True
    )
    shapes = {
        "time_major": ((TARGET, BATCH, EMBED), (0, BATCH, EMBED)),
        "batch_first": ((BATCH, TARGET, EMBED), (BATCH, 0, EMBED)),
        "unbatched": ((TARGET, EMBED), (0, EMBED)),
    }[layout]
    query = np.random.default_rng(4).standard_normal(shapes[0])
    keys = np.zeros(shapes[1])
    our_query, our_keys = Tensor(query, requires_grad=True), Tensor(keys, requires_grad=True)
    their_query = torch.tensor(query, requires_grad=True)
    their_keys = torch.tensor(keys, requires_grad=True)
    output, weights = ours(our_query, our_keys, our_keys, need_weights=need_weights)
    expected, expected_weights = theirs(
        their_query, their_keys, their_keys, need_weights=need_weights
    )
    np.testing.assert_allclose(output.numpy(), expected.detach().numpy(), rtol=1e-12)
    assert output.shape == tuple(expected.shape)
    if need_weights:
        assert weights.shape == tuple(expected_weights.shape)
    else:
        assert weights is None and expected_weights is None
    upstream = np.random.default_rng(5).standard_normal(output.shape)
    output.backward(upstream)
    expected.backward(torch.from_numpy(upstream))
    np.testing.assert_array_equal(our_query.grad.numpy(), their_query.grad.numpy())
    assert our_keys.grad.shape == tuple(their_keys.grad.shape)
    np.testing.assert_allclose(
        ours.out_proj.bias.grad.numpy(), theirs.out_proj.bias.grad.numpy(), rtol=1e-12
    )


def test_zero_length_keys_give_the_output_bias_without_pytorch():
    layer = build({}).eval()
    layer.out_proj.bias.data[...] = [1.0, -2.0, 3.0, 0.5]
    output, weights = layer(
        np.ones((TARGET, BATCH, EMBED)), np.ones((0, BATCH, EMBED)), np.ones((0, BATCH, EMBED))
    )
    np.testing.assert_array_equal(
        output.numpy(), np.broadcast_to([1.0, -2.0, 3.0, 0.5], output.shape)
    )
    assert weights.shape == (BATCH, TARGET, 0)


def test_save_load_round_trip(tmp_path):
    layer = build({"kdim": 3, "vdim": 5, "batch_first": True, "dropout": 0.2}).eval()
    path = tmp_path / "attention.bigdl"
    nn.save(layer, path)
    loaded = nn.load(path)
    assert isinstance(loaded, nn.MultiheadAttention) and not loaded.training
    assert (loaded.kdim, loaded.vdim, loaded.dropout) == (3, 5, 0.2)
    query, key, value = (Tensor(a, dtype=F64) for a in make_inputs("cross", layer))
    for mine, theirs in zip(layer(query, key, value), loaded(query, key, value), strict=True):
        np.testing.assert_array_equal(mine.numpy(), theirs.numpy())


# --- errors ---------------------------------------------------------------------------------------
def zeros(*shape):
    return Tensor(np.zeros(shape), dtype=np.float32)


@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda: nn.MultiheadAttention(6, 4), ValueError, "embed_dim 6 is not divisible"),
        (lambda: nn.MultiheadAttention(4, 0), ValueError, "num_heads must be a positive"),
        (lambda: nn.MultiheadAttention(4, 2, dropout=2), ValueError, "dropout must be"),
        (
            lambda: nn.MultiheadAttention(4, 2)(zeros(3), zeros(3), zeros(3)),
            ValueError,
            r"query must be \(L, N, E\) or unbatched \(L, E\), got shape \(3,\)",
        ),
        (
            lambda: nn.MultiheadAttention(4, 2)(zeros(3, 2, 5), zeros(3, 2, 4), zeros(3, 2, 4)),
            ValueError,
            r"query must have embed_dim=4 features, got shape \(3, 2, 5\)",
        ),
        (
            lambda: nn.MultiheadAttention(4, 2, kdim=3)(
                zeros(3, 2, 4), zeros(3, 2, 4), zeros(3, 2, 4)
            ),
            ValueError,
            "key must have kdim=3 features",
        ),
        (
            lambda: nn.MultiheadAttention(4, 2)(zeros(3, 2, 4), zeros(5, 2, 4), zeros(4, 2, 4)),
            ValueError,
            "key and value must have the same sequence length",
        ),
        (
            lambda: nn.MultiheadAttention(4, 2)(zeros(3, 2, 4), zeros(5, 3, 4), zeros(5, 3, 4)),
            ValueError,
            "the same batch size",
        ),
        (
            lambda: nn.MultiheadAttention(4, 2)(
                zeros(3, 2, 4), zeros(5, 2, 4), zeros(5, 2, 4), attn_mask=np.zeros((3, 4))
            ),
            ValueError,
            r"attn_mask must have shape \(3, 5\) or \(4, 3, 5\), got \(3, 4\)",
        ),
        (
            lambda: nn.MultiheadAttention(4, 2)(
                zeros(3, 2, 4), zeros(5, 2, 4), zeros(5, 2, 4), key_padding_mask=np.zeros((5, 2))
            ),
            ValueError,
            r"key_padding_mask must have shape \(2, 5\), got \(5, 2\)",
        ),
        (
            lambda: nn.MultiheadAttention(4, 2)(
                zeros(3, 2, 4),
                zeros(5, 2, 4),
                zeros(5, 2, 4),
                key_padding_mask=np.zeros((2, 5), int),
            ),
            TypeError,
            "key_padding_mask must be bool or floating point",
        ),
        (
            lambda: nn.MultiheadAttention(4, 2)(*[Tensor(np.zeros((3, 2, 4)), dtype=F64)] * 3),
            TypeError,
            "query dtype float64 differs from the parameters' float32",
        ),
    ],
    ids=[
        "heads_divide",
        "num_heads",
        "dropout",
        "rank",
        "embed_dim",
        "kdim",
        "lengths",
        "batch",
        "attn_mask_shape",
        "padding_shape",
        "padding_dtype",
        "dtype",
    ],
)
def test_bad_settings_and_inputs_are_refused_naming_the_problem(call, error, message):
    with pytest.raises(error, match=message):
        call()
