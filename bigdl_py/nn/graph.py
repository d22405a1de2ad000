"""Functional graph models: BigDL's ``Graph``/``Model`` and the Keras functional API.

Build a graph by calling layers on placeholders, then wrap its ends in a ``Model``::

    x = Input(shape=(784,))
    h = ReLU()(Linear(784, 100)(x))      # calling a module on a Node records a Node
    y = Linear(100, 10)(h)
    model = Model(inputs=x, outputs=y)   # a Module: model(batch) runs the graph

``Module.__call__`` records a :class:`Node` whenever an argument (or a list/tuple argument's
item) is a Node, so layer code needs nothing special; ``Node(layer, (x,))`` is the same call
spelled out. A layer called on several nodes is *shared*: it is one sub-module and its
parameters are counted once. Merge layers (``Add``, ``Multiply``, ``Concat``) join branches;
``node[i]`` picks item ``i`` of a layer that returns a tuple.

``Model`` runs the nodes in one precomputed topological order (an iterative walk, so deep
graphs do not hit Python's recursion limit) and registers every layer as a sub-module in
that order, named after its class in lower case (``linear``, ``linear_1``, ``batchnorm2d``,
...). The order and the names depend only on the graph's structure, so two builds of one
graph have the same ``named_parameters()`` — the layout of the flat parameter vector.

:meth:`Model.graph_spec` describes the wiring as plain JSON values and
:meth:`Model.from_graph_spec` rebuilds it from that and the named layers, which is how model
save/load stores a graph without storing code.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from bigdl_py.nn.module import GraphNodeBase, Module

__all__ = ["Input", "Model", "Node"]


class Node(GraphNodeBase):
    """A value in a functional graph: ``layer`` applied to ``args`` (which hold Nodes).

    Parameters
    ----------
    layer : Module
        The module to call when the graph runs.
    args : tuple
        Positional arguments: Nodes, lists/tuples of Nodes, or constants.
    kwargs : dict, optional
        Keyword arguments: constants only.
    """

    __slots__ = ("layer", "args", "kwargs", "parents", "name")

    def __init__(self, layer: Module | None, args: Sequence = (), kwargs: Mapping | None = None):
        if layer is not None and not isinstance(layer, Module):
            raise TypeError(f"Node: layer must be a Module, got {type(layer).__name__}")
        kwargs = dict(kwargs or {})
        for key, value in kwargs.items():
            if isinstance(value, GraphNodeBase):
                raise TypeError(
                    f"{type(layer).__name__}: graph node passed as keyword {key!r}; pass graph "
                    "nodes positionally"
                )
        self.layer = layer
        self.args = tuple(args)
        self.kwargs = kwargs
        self.parents = tuple(_nodes_in(self.args))
        self.name: str | None = None

    def __getitem__(self, index: int) -> Node:
        """A node for item ``index`` of this node's (tuple) output."""
        return _Selection(self, index)

    def __array__(self, *args, **kwargs):
        raise TypeError(
            "a graph Node has no values: it is a placeholder in a functional graph. Call "
            "layers on it and wrap the graph in Model(inputs, outputs) to compute"
        )

    def __repr__(self) -> str:
        layer = "?" if self.layer is None else type(self.layer).__name__
        return f"Node({layer}, {len(self.parents)} input(s))"


class Input(Node):
    """A graph input placeholder (BigDL's and Keras' ``Input``).

    Parameters
    ----------
    shape : sequence of int or None, optional
        Shape of one sample, without the batch axis; ``None`` entries match any size.
        When given, ``Model`` checks each batch against it.
    name : str, optional
        Used in error messages and in ``graph_spec``.
    """

    __slots__ = ("shape",)

    def __init__(self, shape: Sequence[int | None] | None = None, name: str | None = None):
        super().__init__(None)
        if isinstance(shape, int):
            shape = (shape,)
        self.shape = None if shape is None else tuple(None if s is None else int(s) for s in shape)
        self.name = name

    def accepts(self, value: Any) -> bool:
        """True when ``value``'s shape is ``(N, *shape)`` (``None`` entries match anything)."""
        if self.shape is None:
            return True
        sample = tuple(value.shape)[1:]
        return len(sample) == len(self.shape) and all(
            want is None or want == got for want, got in zip(self.shape, sample, strict=True)
        )

    def __repr__(self) -> str:
        return f"Input(shape={self.shape}, name={self.name!r})"


class _Selection(Node):
    """Item ``index`` of another node's tuple output (no layer, nothing to register)."""

    __slots__ = ("index",)

    def __init__(self, source: Node, index: int):
        super().__init__(None, (source,))
        self.index = index

    def __repr__(self) -> str:
        return f"{self.parents[0]!r}[{self.index}]"


def _nodes_in(args: Sequence) -> list[Node]:
    """The Nodes among ``args`` and inside list/tuple arguments, in order."""
    nodes = []
    for value in args:
        if isinstance(value, Node):
            nodes.append(value)
        elif isinstance(value, (list, tuple)):
            nodes.extend(item for item in value if isinstance(item, Node))
    return nodes


def _resolve(value: Any, values: dict[int, Any]) -> Any:
    """Replace the Nodes in an argument by their computed values."""
    if isinstance(value, Node):
        return values[id(value)]
    if isinstance(value, (list, tuple)):
        return type(value)(_resolve(item, values) for item in value)
    return value


def _topological_order(outputs: Sequence[Node]) -> list[Node]:
    """Every node the outputs depend on, each after its parents (iterative post-order DFS).

    Parents are visited in argument order and outputs in the given order, so the order
    depends only on the graph's structure.
    """
    order: list[Node] = []
    done: set[int] = set()
    for output in outputs:
        stack: list[tuple[Node, int]] = [(output, 0)]
        while stack:
            node, next_parent = stack.pop()
            if id(node) in done:
                continue
            if next_parent < len(node.parents):
                stack.append((node, next_parent + 1))
                parent = node.parents[next_parent]
                if id(parent) not in done:
                    stack.append((parent, 0))
            else:
                done.add(id(node))
                order.append(node)
    return order


class Model(Module):
    """A Module that runs a graph of layers from ``inputs`` to ``outputs``.

    Parameters
    ----------
    inputs : Input or sequence of Input
        The placeholders, in the order ``forward`` takes their values.
    outputs : Node or sequence of Node
        What ``forward`` returns: one value for a single Node, a tuple for a sequence.

    Raises
    ------
    ValueError
        When an input is not an ``Input``, is listed twice, or an output depends on an
        ``Input`` that is not among ``inputs``.
    """

    def __init__(self, inputs: Input | Sequence[Input], outputs: Node | Sequence[Node]):
        super().__init__()
        input_list = [inputs] if isinstance(inputs, Node) else list(inputs)
        output_list = [outputs] if isinstance(outputs, Node) else list(outputs)
        self._check_ends(input_list, output_list)
        order = _topological_order(output_list)
        input_ids = {id(node) for node in input_list}
        for node in order:
            if isinstance(node, Input) and id(node) not in input_ids:
                raise ValueError(
                    f"Model: the outputs depend on {node!r}, which is not among the inputs"
                )
        object.__setattr__(self, "_input_nodes", input_list)
        object.__setattr__(self, "_output_nodes", output_list)
        object.__setattr__(self, "_single_output", isinstance(outputs, Node))
        object.__setattr__(self, "_order", [node for node in order if id(node) not in input_ids])
        object.__setattr__(self, "_layer_names", self._register_layers())
        object.__setattr__(self, "_free_after", self._dead_values_by_step())

    @staticmethod
    def _check_ends(inputs: list, outputs: list) -> None:
        if not inputs or not outputs:
            raise ValueError("Model: needs at least one input and one output")
        for position, node in enumerate(inputs):
            if not isinstance(node, Input):
                raise ValueError(
                    f"Model: input {position} must be an Input placeholder, got {node!r}"
                )
        if len({id(node) for node in inputs}) != len(inputs):
            raise ValueError("Model: an Input is listed more than once in inputs")
        for position, node in enumerate(outputs):
            if not isinstance(node, Node):
                raise ValueError(
                    f"Model: output {position} must be a graph Node, got {type(node).__name__}"
                )

    def _register_layers(self) -> dict[int, str]:
        """Register each distinct layer once, in topological order, named after its class."""
        names: dict[int, str] = {}
        taken: dict[str, int] = {}
        for node in self._order:
            layer = node.layer
            if layer is None or id(layer) in names:
                continue
            if layer is self:
                raise ValueError("Model: a model cannot be a layer of its own graph")
            base = type(layer).__name__.lower()
            count = taken.get(base, 0)
            taken[base] = count + 1
            name = base if count == 0 else f"{base}_{count}"
            names[id(layer)] = name
            self.add_module(name, layer)
        return names

    def _dead_values_by_step(self) -> list[list[int]]:
        """For each step, the nodes whose values no later step needs (outputs are kept)."""
        last_use: dict[int, int] = {}
        for step, node in enumerate(self._order):
            for parent in node.parents:
                last_use[id(parent)] = step
        for node in self._output_nodes:
            last_use.pop(id(node), None)
        free_after: list[list[int]] = [[] for _ in self._order]
        for node_id, step in last_use.items():
            free_after[step].append(node_id)
        return free_after

    def forward(self, *inputs):
        if len(inputs) != len(self._input_nodes):
            raise ValueError(
                f"Model: takes {len(self._input_nodes)} input(s) "
                f"({', '.join(repr(node) for node in self._input_nodes)}), got {len(inputs)}"
            )
        values: dict[int, Any] = {}
        for position, (node, value) in enumerate(zip(self._input_nodes, inputs, strict=True)):
            if not node.accepts(value):
                raise ValueError(
                    f"Model: input {position} ({node!r}) expects shape (N, *{node.shape}), "
                    f"got {tuple(value.shape)}"
                )
            values[id(node)] = value
        for step, node in enumerate(self._order):
            if isinstance(node, _Selection):
                values[id(node)] = values[id(node.parents[0])][node.index]
            else:
                args = [_resolve(argument, values) for argument in node.args]
                values[id(node)] = node.layer(*args, **node.kwargs)
            # Dropping dead intermediates lets inference (no_grad) free them as it goes.
            for node_id in self._free_after[step]:
                values.pop(node_id, None)
        results = tuple(values[id(node)] for node in self._output_nodes)
        return results[0] if self._single_output else results

    def extra_repr(self) -> str:
        return f"inputs={len(self._input_nodes)}, outputs={len(self._output_nodes)}"

    # --- a code-free description of the wiring ------------------------------------------
    def graph_spec(self) -> dict:
        """The graph's wiring as JSON-serialisable values (layers referred to by name).

        Returns
        -------
        dict
            ``{"inputs": [{"name", "shape"}], "nodes": [...], "outputs": [...],
            "single_output": bool}``; each node is ``{"layer": name, "args": ...,
            "kwargs": ...}`` or ``{"select": index, "source": node_id}``, where node ids
            number the inputs first, then the nodes in order, and an argument that is a
            node is written ``{"node": id}``.
        """
        ids = {id(node): number for number, node in enumerate(self._input_nodes + self._order)}

        def encode(value):
            if isinstance(value, Node):
                return {"node": ids[id(value)]}
            if isinstance(value, (list, tuple)):
                return [encode(item) for item in value]
            return value

        nodes = []
        for node in self._order:
            if isinstance(node, _Selection):
                nodes.append({"select": node.index, "source": ids[id(node.parents[0])]})
            else:
                nodes.append(
                    {
                        "layer": self._layer_names[id(node.layer)],
                        "args": [encode(argument) for argument in node.args],
                        "kwargs": dict(node.kwargs),
                    }
                )
        return {
            "inputs": [
                {"name": node.name, "shape": None if node.shape is None else list(node.shape)}
                for node in self._input_nodes
            ],
            "nodes": nodes,
            "outputs": [ids[id(node)] for node in self._output_nodes],
            "single_output": self._single_output,
        }

    @classmethod
    def from_graph_spec(cls, spec: Mapping, layers: Mapping[str, Module]) -> Model:
        """Rebuild a model from :meth:`graph_spec` output and its layers by name.

        Raises
        ------
        KeyError
            When ``layers`` lacks a layer the spec names.
        """
        built: list[Node] = [Input(item["shape"], item["name"]) for item in spec["inputs"]]

        def decode(value):
            if isinstance(value, Mapping) and set(value) == {"node"}:
                return built[value["node"]]
            if isinstance(value, list):
                return [decode(item) for item in value]
            return value

        for item in spec["nodes"]:
            if "select" in item:
                built.append(_Selection(built[item["source"]], item["select"]))
                continue
            if item["layer"] not in layers:
                raise KeyError(f"Model.from_graph_spec: no layer named {item['layer']!r}")
            args = [decode(argument) for argument in item["args"]]
            built.append(Node(layers[item["layer"]], args, item["kwargs"]))
        inputs = built[: len(spec["inputs"])]
        outputs = [built[number] for number in spec["outputs"]]
        model = cls(inputs, outputs[0] if spec["single_output"] else outputs)
        renamed = {name for name in model._modules if model._modules[name] is not layers.get(name)}
        if renamed:
            raise ValueError(
                f"Model.from_graph_spec: layers {sorted(renamed)} do not match the spec's "
                "layer names (were they built from the same classes?)"
            )
        return model
