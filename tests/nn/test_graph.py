"""Functional graph Model: several inputs and outputs, shared layers, merges, wiring spec."""

from __future__ import annotations

import json
import weakref

import numpy as np
import pytest

from bigdl_py import nn
from bigdl_py.autograd import Tensor, no_grad, ops


def batch(*shape, seed=0, requires_grad=False):
    values = np.random.default_rng(seed).standard_normal(shape)
    return Tensor(values, dtype=np.float64, requires_grad=requires_grad)


class TwoTower(nn.Module):
    """The graph of ``build_two_tower`` written as plain code, to compare against."""

    def __init__(self, graph_model):
        super().__init__()
        self.graph_model = graph_model

    def forward(self, a, b):
        layers = self.graph_model
        shared = layers.linear
        left = shared(a).tanh()
        right = shared(layers.linear_1(b)).tanh()
        joined = ops.concatenate([left, right], axis=1)
        return layers.linear_2(joined), left + right


def build_two_tower():
    """Two inputs, two outputs, one layer shared by both towers, a Concat and an Add."""
    a = nn.Input(shape=(4,), name="a")
    b = nn.Input(shape=(3,), name="b")
    shared = nn.Linear(4, 5, dtype=np.float64)
    left = nn.Tanh()(shared(a))
    right = nn.Tanh()(shared(nn.Linear(3, 4, dtype=np.float64)(b)))
    logits = nn.Linear(10, 2, dtype=np.float64)(nn.Concat(1)([left, right]))
    total = nn.Add()(left, right)
    return nn.Model(inputs=[a, b], outputs=[logits, total])


def test_two_inputs_two_outputs_and_a_shared_layer_match_plain_code():
    model = build_two_tower()
    a, b = batch(6, 4, requires_grad=True), batch(6, 3, seed=1, requires_grad=True)
    logits, total = model(a, b)
    expected_logits, expected_total = TwoTower(model)(a, b)
    np.testing.assert_allclose(logits.numpy(), expected_logits.numpy(), rtol=1e-12)
    np.testing.assert_allclose(total.numpy(), expected_total.numpy(), rtol=1e-12)

    # Gradients from both outputs reach both inputs and the shared layer (from both uses).
    (logits.sum() + (total * total).sum()).backward()
    graph_grads = [p.grad.numpy().copy() for p in model.parameters()] + [
        a.grad.numpy().copy(),
        b.grad.numpy().copy(),
    ]
    model.zero_grad()
    a.grad = b.grad = None
    expected_logits, expected_total = TwoTower(model)(a, b)
    (expected_logits.sum() + (expected_total * expected_total).sum()).backward()
    plain_grads = [p.grad.numpy() for p in model.parameters()] + [a.grad.numpy(), b.grad.numpy()]
    for got, want in zip(graph_grads, plain_grads, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-12)


def test_a_shared_layer_is_one_sub_module_and_its_parameters_count_once():
    model = build_two_tower()
    assert [name for name, _ in model.named_children()] == [
        "linear",
        "tanh",
        "linear_1",
        "tanh_1",
        "concat",
        "linear_2",
        "add",
    ]
    assert model.num_parameters() == (4 * 5 + 5) + (3 * 4 + 4) + (10 * 2 + 2)


def test_two_builds_of_one_graph_have_the_same_parameter_names_and_seeded_weights():
    with nn.init.seeded(3):
        first = build_two_tower()
    with nn.init.seeded(3):
        second = build_two_tower()
    first_state, second_state = first.state_dict(), second.state_dict()
    assert list(first_state) == list(second_state)
    for name in first_state:
        np.testing.assert_array_equal(first_state[name], second_state[name])


def test_single_output_returns_a_value_and_a_list_returns_a_tuple():
    x = nn.Input()
    y = nn.ReLU()(x)
    assert isinstance(nn.Model(x, y)(batch(2, 3)), Tensor)
    outputs = nn.Model([x], [y])(batch(2, 3))
    assert isinstance(outputs, tuple) and len(outputs) == 1


def test_an_input_can_also_be_an_output():
    x = nn.Input()
    y = nn.Sigmoid()(x)
    value = batch(2, 2)
    same, squashed = nn.Model(x, [x, y])(value)
    assert same is value and squashed.shape == (2, 2)


def test_node_spelled_out_equals_calling_the_layer():
    x = nn.Input()
    layer = nn.Linear(3, 2, dtype=np.float64)
    called, spelled = nn.Model(x, layer(x)), nn.Model(x, nn.Node(layer, (x,)))
    value = batch(4, 3)
    np.testing.assert_array_equal(called(value).numpy(), spelled(value).numpy())


def test_multiply_merge_and_constant_arguments():
    class Scale(nn.Module):
        def forward(self, x, factor, offset=0.0):
            return x * factor + offset

    x = nn.Input()
    y = nn.Multiply()([x, Scale()(x, 2.0, offset=1.0)])
    value = batch(3, 2)
    np.testing.assert_allclose(
        nn.Model(x, y)(value).numpy(), value.numpy() * (value.numpy() * 2 + 1), rtol=1e-12
    )


def test_indexing_a_node_selects_from_a_tuple_output():
    class Split(nn.Module):
        def forward(self, x):
            return x[:, :2], x[:, 2:]

    x = nn.Input()
    halves = Split()(x)
    model = nn.Model(x, nn.Concat(1)([halves[1], halves[0]]))
    value = batch(2, 5)
    expected = np.concatenate([value.numpy()[:, 2:], value.numpy()[:, :2]], axis=1)
    np.testing.assert_array_equal(model(value).numpy(), expected)


def test_a_model_is_a_layer_of_another_graph():
    inner_input = nn.Input()
    inner = nn.Model(inner_input, nn.Linear(3, 3, dtype=np.float64)(inner_input))
    x = nn.Input()
    outer = nn.Model(x, nn.Add()(inner(x), inner(x)))
    value = batch(2, 3)
    np.testing.assert_allclose(outer(value).numpy(), 2 * inner(value).numpy(), rtol=1e-12)
    assert [name for name, _ in outer.named_parameters()] == [
        "model.linear.weight",
        "model.linear.bias",
    ]


def test_a_deep_graph_runs_without_recursion():
    x = nn.Input()
    node = x
    for _ in range(3000):  # well past Python's default recursion limit of 1000
        node = nn.Identity()(node)
    model = nn.Model(x, node)
    value = batch(1, 2)
    assert model(value) is value


def test_inference_drops_intermediate_values_as_it_goes():
    # With no autograd graph recorded, an intermediate dies once its last consumer has run.
    probed, alive_later = [], []

    class Probe(nn.Module):
        def forward(self, x):
            output = x * 1.0
            probed.append(weakref.ref(output))
            return output

    class Check(nn.Module):
        def forward(self, x):
            alive_later.append(probed[0]() is not None)
            return x

    x = nn.Input()
    model = nn.Model(x, Check()(nn.Tanh()(nn.Tanh()(Probe()(x)))))
    with no_grad():
        model(batch(2, 2))
    assert alive_later == [False]


# --- errors ----------------------------------------------------------------------------------
def test_calling_with_the_wrong_number_of_inputs_names_the_inputs():
    model = build_two_tower()
    with pytest.raises(ValueError, match=r"takes 2 input\(s\) \(Input\(shape=\(4,\), name='a'\)"):
        model(batch(2, 4))


def test_an_input_of_the_wrong_shape_is_reported():
    model = build_two_tower()
    with pytest.raises(ValueError, match=r"input 1 \(Input\(shape=\(3,\).*got \(2, 5\)"):
        model(batch(2, 4), batch(2, 5))


def test_input_shape_none_entries_match_any_size():
    x = nn.Input(shape=(None, 3))
    model = nn.Model(x, nn.ReLU()(x))
    assert model(batch(2, 7, 3)).shape == (2, 7, 3)


def test_outputs_depending_on_an_unlisted_input_are_rejected():
    a, b = nn.Input(name="a"), nn.Input(name="b")
    with pytest.raises(ValueError, match=r"depend on Input\(shape=None, name='b'\)"):
        nn.Model(a, nn.Add()(a, b))


def test_inputs_must_be_input_placeholders_listed_once():
    x = nn.Input()
    hidden = nn.ReLU()(x)
    with pytest.raises(ValueError, match="input 0 must be an Input placeholder"):
        nn.Model(hidden, nn.Tanh()(hidden))
    with pytest.raises(ValueError, match="listed more than once"):
        nn.Model([x, x], hidden)
    with pytest.raises(ValueError, match="output 0 must be a graph Node, got Tensor"):
        nn.Model(x, batch(1))


def test_graph_nodes_are_not_data():
    x = nn.Input()
    with pytest.raises(TypeError, match="placeholder in a functional graph"):
        ops.relu(x)
    with pytest.raises(TypeError, match="pass graph nodes positionally"):
        nn.Concat()(x, other=x)


# --- a code-free description of the wiring ----------------------------------------------------
def test_graph_spec_is_json_and_rebuilds_an_equivalent_model():
    model = build_two_tower()
    spec = json.loads(json.dumps(model.graph_spec()))
    rebuilt = nn.Model.from_graph_spec(spec, dict(model.named_children()))
    a, b = batch(3, 4), batch(3, 3, seed=1)
    for got, want in zip(rebuilt(a, b), model(a, b), strict=True):
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    assert list(rebuilt.state_dict()) == list(model.state_dict())
    assert [item["name"] for item in spec["inputs"]] == ["a", "b"]


def test_graph_spec_keeps_selections_and_constant_arguments():
    class Split(nn.Module):
        def forward(self, x, at):
            return x[:, :at], x[:, at:]

    x = nn.Input()
    parts = Split()(x, 1)
    model = nn.Model(x, [parts[1], parts[0]])
    spec = json.loads(json.dumps(model.graph_spec()))
    rebuilt = nn.Model.from_graph_spec(spec, {"split": Split()})
    value = batch(2, 3)
    for got, want in zip(rebuilt(value), model(value), strict=True):
        np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_from_graph_spec_names_a_missing_layer():
    spec = build_two_tower().graph_spec()
    with pytest.raises(KeyError, match="no layer named 'linear'"):
        nn.Model.from_graph_spec(spec, {})


def test_layers_are_named_after_their_class_in_lower_case():
    x = nn.Input()
    y = nn.ReLU()(nn.BatchNorm1d(3)(nn.Linear(3, 3)(x)))
    model = nn.Model(x, nn.ReLU()(y))
    assert list(model._modules) == ["linear", "batchnorm1d", "relu", "relu_1"]
