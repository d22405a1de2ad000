"""The backward walk: reverse topological order over the recorded graph, iteratively.

The graph's nodes are Functions, and the leaf Tensors at its ends; a Function reaches its
inputs through ``InputEdge``\\ s, never through the input Tensors, so the walk holds no
activation that no backward saved. Graphs are deep (an unrolled RNN, a chain of 10,000 ops),
so both the ordering and the walk use an explicit stack, never recursion (micrograd's idea
without its recursion).

An embedding's weight gradient travels as a :class:`RowGradient` (the looked-up rows'
gradients and their indices) instead of a table-sized array: a leaf adds those rows into its
``.grad`` in place, so no table of zeros is allocated and summed into ``.grad`` each step
(NCF's four tables: ~0.1 ms of a 1.6 ms step). Anything else, a Function's backward or a
sum with another gradient, gets it as a dense array.
"""

from __future__ import annotations

from bigdl_py import backend
from bigdl_py.autograd.function import Function


class RowGradient:
    """A gradient of ``shape`` that is zero but for rows: ``rows[k]`` adds into row
    ``index[k]`` (repeated indices add up). ``rows`` has the shape ``(len(index),
    *shape[1:])``."""

    __slots__ = ("index", "rows", "shape", "dtype")

    def __init__(self, index, rows, shape: tuple):
        self.index = index
        self.rows = rows
        self.shape = tuple(shape)
        self.dtype = rows.dtype

    def dense(self):
        """The gradient as a new array of ``shape``."""
        from bigdl_py.autograd.ops.misc import row_sums  # ops import this module

        return row_sums(self.index, self.rows, self.shape[0])

    def add_to(self, target) -> None:
        """Add the rows into ``target`` (an array of ``shape``) in place."""
        from bigdl_py.autograd.ops.misc import add_rows

        add_rows(target, self.index, self.rows)


def as_dense(gradient):
    """``gradient`` as an array: a :class:`RowGradient` made dense, anything else as it is."""
    return gradient.dense() if type(gradient) is RowGradient else gradient


def unbroadcast(gradient, shape: tuple):
    """Sum ``gradient`` over the axes that broadcasting added or stretched to reach ``shape``."""
    if gradient.shape == tuple(shape):
        return gradient
    xp = backend.array_module(gradient)
    extra_leading = gradient.ndim - len(shape)
    if extra_leading < 0:
        raise RuntimeError(f"gradient of shape {gradient.shape} cannot reduce to shape {shape}")
    if extra_leading:
        gradient = gradient.sum(axis=tuple(range(extra_leading)))
    stretched = tuple(i for i, size in enumerate(shape) if size == 1 and gradient.shape[i] != 1)
    if stretched:
        gradient = gradient.sum(axis=stretched, keepdims=True)
    return xp.reshape(gradient, shape)


def input_nodes(node) -> list:
    """The nodes a node's gradient flows to: a Function's recorded inputs; none for a leaf."""
    if not isinstance(node, Function):
        return []
    return [edge.node for edge in node.inputs if edge is not None]


def topological_order(root) -> list:
    """Nodes reachable from ``root`` (a Function or a leaf Tensor), inputs before consumers."""
    order = []
    visited = {id(root)}
    # Each stack entry is (node, an iterator over its input nodes not yet visited).
    stack = [(root, iter(input_nodes(root)))]
    while stack:
        node, children = stack[-1]
        for child in children:
            if id(child) not in visited:
                visited.add(id(child))
                stack.append((child, iter(input_nodes(child))))
                break
        else:  # every input done
            stack.pop()
            order.append(node)
    return order


def run_backward(root, grad_output, retain_graph: bool = False) -> None:
    """Accumulate d(root)/d(leaf) * grad_output into every leaf's ``.grad``."""
    start = root if root.is_leaf else root.grad_fn
    order = topological_order(start)
    pending = {id(start): grad_output}
    for node in reversed(order):
        gradient = pending.pop(id(node), None)
        if gradient is None:
            continue
        if not isinstance(node, Function):
            node._accumulate_grad(gradient)
            continue
        if type(gradient) is RowGradient:  # a Function's backward takes arrays only
            gradient = gradient.dense()
        input_gradients = backward_step(node, gradient)
        del gradient  # the output's gradient is dead now: free it before the next node runs
        for edge, input_gradient in zip(node.inputs, input_gradients, strict=False):
            if edge is None or input_gradient is None:
                continue
            if input_gradient.shape != edge.shape:
                input_gradient = unbroadcast(input_gradient, edge.shape)
            if input_gradient.dtype != edge.dtype:
                input_gradient = as_dense(input_gradient).astype(edge.dtype)
            previous = pending.get(id(edge.node))
            # Never add in place: a backward may hand the same array to several inputs.
            pending[id(edge.node)] = (
                input_gradient
                if previous is None
                else as_dense(previous) + as_dense(input_gradient)
            )
        del input_gradients
        if not retain_graph:
            node.release()


def backward_step(function: Function, gradient) -> tuple:
    """Run one Function's backward on its output's gradient; the inputs' gradients, padded
    with None to one per input."""
    retained = function.retained_output() if function.retained_output is not None else None
    if retained is not None:
        retained._accumulate_grad(gradient)
    if function.released:
        raise RuntimeError(
            f"backward through {function.name} a second time: its saved buffers were "
            "freed after the first backward; pass retain_graph=True to the first call "
            "if you need to backward twice"
        )
    input_gradients = function.backward(gradient)
    if not isinstance(input_gradients, tuple):
        input_gradients = (input_gradients,)
    missing = len(function.inputs) - len(input_gradients)
    return input_gradients + (None,) * missing if missing > 0 else input_gradients
