"""A graph ``Model`` as a chain of sub-models, cut wherever one value alone flows on.

Pipeline parallelism (``bigdl_py.spark.modes.pipeline``) runs a model's layers as stages, each
handing ONE tensor to the next. A graph model can be cut after a step of its topological
order when the value that step computes is the only one any later step (or the output)
reads, and no layer is called on both sides of the cut. A ResNet, say, can be cut between
its blocks, never inside one (the skip connection keeps the block's input alive).

:func:`chain_segments` returns the model between consecutive cut points as sub-models of one
input and one output, built from the same layer objects in the same order, so their
parameters, concatenated, are the model's in ``parameters()`` order.
"""

from __future__ import annotations

from bigdl_py.nn.graph import Input, Model, Node, _Selection


def chain_segments(model: Model) -> list[Model]:
    """The sub-models between ``model``'s cut points, in order (one if it has none).

    Raises
    ------
    ValueError
        If the model has more than one input or output (a chain has one of each).
    """
    inputs, outputs = model._input_nodes, model._output_nodes
    if len(inputs) != 1 or len(outputs) != 1:
        raise ValueError(
            f"a chain of stages needs a graph Model of one input and one output; this one has "
            f"{len(inputs)} input(s) and {len(outputs)} output(s)"
        )
    order = model._order
    segments, start = [], 0
    for cut in _cut_points(inputs[0], outputs[0], order):
        segments.append(
            _sub_model(order[start : cut + 1], order[start - 1] if start else inputs[0])
        )
        start = cut + 1
    segments.append(_sub_model(order[start:], order[start - 1] if start else inputs[0]))
    return segments


def _cut_points(source: Node, output: Node, order: list[Node]) -> list[int]:
    """Steps after which only that step's value is alive and no layer is used on both sides."""
    last_use = {id(source): -1}
    for step, node in enumerate(order):
        for parent in node.parents:
            last_use[id(parent)] = step
    last_use[id(output)] = len(order)
    last_layer_use = {}
    for step, node in enumerate(order):
        if node.layer is not None:
            last_layer_use[id(node.layer)] = step
    cuts = []
    alive = {id(source)} if last_use[id(source)] >= 0 else set()
    layers_left_open = set()  # layers called before this step and again after it
    for step, node in enumerate(order[:-1]):
        alive = {value for value in alive if last_use[value] > step}
        if last_use.get(id(node), -1) > step:
            alive.add(id(node))
        if node.layer is not None and last_layer_use[id(node.layer)] > step:
            layers_left_open.add(id(node.layer))
        layers_left_open = {layer for layer in layers_left_open if last_layer_use[layer] > step}
        if alive == {id(node)} and not layers_left_open:
            cuts.append(step)
    return cuts


def _sub_model(nodes: list[Node], source: Node) -> Model:
    """``nodes`` (a run of the order) as a Model whose input stands for ``source``."""
    placeholder = Input()
    copies = {id(source): placeholder}

    def mapped(value):
        if isinstance(value, Node):
            return copies[id(value)]
        if isinstance(value, (list, tuple)):
            return type(value)(mapped(item) for item in value)
        return value

    for node in nodes:
        if isinstance(node, _Selection):
            copy = _Selection(copies[id(node.parents[0])], node.index)
        else:
            copy = Node(node.layer, [mapped(argument) for argument in node.args], node.kwargs)
        copies[id(node)] = copy
    return Model(placeholder, copies[id(nodes[-1])])
