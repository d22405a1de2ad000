"""The backward walk: reverse topological order over the recorded graph, iteratively.

Graphs are deep (an unrolled RNN, a chain of 10,000 ops), so both the ordering and the walk
use an explicit stack, never recursion (micrograd's idea without its recursion).
"""

from __future__ import annotations

from bigdl_py import backend


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


def topological_order(root) -> list:
    """Tensors reachable from ``root`` through ``grad_fn``, inputs before their consumers."""
    order = []
    visited = {id(root)}
    # Each stack entry is (tensor, index of the next input to visit).
    stack = [(root, 0)]
    while stack:
        tensor, next_input = stack[-1]
        function = tensor.grad_fn
        inputs = function.inputs if function is not None else ()
        if next_input < len(inputs):
            stack[-1] = (tensor, next_input + 1)
            child = inputs[next_input]
            if child.requires_grad and id(child) not in visited:
                visited.add(id(child))
                stack.append((child, 0))
        else:
            stack.pop()
            order.append(tensor)
    return order


def run_backward(root, grad_output, retain_graph: bool = False) -> None:
    """Accumulate d(root)/d(leaf) * grad_output into every leaf's ``.grad``."""
    order = topological_order(root)
    pending = {id(root): grad_output}
    for tensor in reversed(order):
        gradient = pending.pop(id(tensor), None)
        if gradient is None:
            continue
        function = tensor.grad_fn
        if function is None or tensor._retains_grad:
            tensor._accumulate_grad(gradient)
        if function is None:
            continue
        if function.released:
            raise RuntimeError(
                f"backward through {function.name} a second time: its saved buffers were "
                "freed after the first backward; pass retain_graph=True to the first call "
                "if you need to backward twice"
            )
        input_gradients = function.backward(gradient)
        if not isinstance(input_gradients, tuple):
            input_gradients = (input_gradients,)
        if len(input_gradients) < len(function.inputs):
            input_gradients = input_gradients + (None,) * (
                len(function.inputs) - len(input_gradients)
            )
        for child, needed, child_gradient in zip(
            function.inputs, function.needs_input_grad, input_gradients, strict=False
        ):
            if not needed or child_gradient is None:
                continue
            child_gradient = unbroadcast(child_gradient, child.shape)
            if child_gradient.dtype != child.dtype:
                child_gradient = child_gradient.astype(child.dtype)
            previous = pending.get(id(child))
            # Never add in place: a backward may hand the same array to several inputs.
            pending[id(child)] = child_gradient if previous is None else previous + child_gradient
        if not retain_graph:
            function.release()
