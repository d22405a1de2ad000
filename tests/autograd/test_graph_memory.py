"""What the recorded graph keeps alive: only what some backward saved.

An activation that no backward needs must be freed as soon as the forward pass lets go of
its Tensor, and the backward walk must free each op's saved arrays once that op has run;
otherwise a network's peak memory is every activation at once (issue 15's memory bar).
Arrays are watched through weak references, so each test sees the real lifetime.
"""

from __future__ import annotations

import weakref

import numpy as np

from bigdl_py.autograd import Function, Tensor, ops


def _leaf(values=(1.0, -2.0, 3.0)):
    return Tensor(np.asarray(values, dtype=np.float64), requires_grad=True)


def test_an_input_no_backward_saved_is_freed_with_its_tensor():
    x = _leaf()
    middle = x + 1.0
    middle_array = weakref.ref(middle.data)
    output = ops.relu(middle)  # ReLU's backward reads its output, not its input
    del middle
    assert middle_array() is None
    output.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [1.0, 0.0, 1.0])


def test_an_input_a_backward_saved_stays_until_that_backward_ran():
    x = _leaf()
    middle = x + 1.0
    middle_array = weakref.ref(middle.data)
    output = middle * middle  # Mul saves both factors
    del middle
    assert middle_array() is not None
    output.sum().backward()
    assert middle_array() is None
    np.testing.assert_array_equal(x.grad.numpy(), 2 * (np.array([1.0, -2.0, 3.0]) + 1))


class _WatchingIdentity(Function):
    """Identity whose backward notes whether the array in ``self.watched`` still lives."""

    def forward(self, a):
        return a.copy()

    def backward(self, grad):
        self.watched_alive_in_backward = self.watched() is not None
        return grad


def test_the_backward_walk_frees_a_later_ops_saved_arrays_before_reaching_earlier_ops():
    x = _leaf()
    copied = _WatchingIdentity.apply(x)
    watcher = copied.grad_fn
    watcher.watched = weakref.ref(copied.data)
    loss = (copied * copied).sum()  # only Mul's saved factors hold the copy now
    del copied
    loss.backward()
    assert watcher.watched_alive_in_backward is False


def test_retain_grad_does_not_keep_the_intermediate_alive():
    x = _leaf()
    middle = (x * 3.0).retain_grad()
    middle_tensor = weakref.ref(middle)
    loss = ops.relu(middle).sum()
    del middle
    assert middle_tensor() is None
    loss.backward()  # the retained tensor is gone: nothing to fill, and no error
    np.testing.assert_array_equal(x.grad.numpy(), [3.0, 0.0, 3.0])


def test_relu_keeps_only_its_output_which_the_next_op_usually_saves_too():
    x = _leaf()
    output = ops.relu(x)
    saved = output.grad_fn.saved
    assert len(saved) == 1 and saved[0] is output.data
    output.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [1.0, 0.0, 1.0])


def test_batch_norm_keeps_only_what_its_backward_saved():
    rng = np.random.default_rng(0)
    x = Tensor(rng.standard_normal((4, 3, 5, 5)), requires_grad=True)
    weight = Tensor(np.ones(3), requires_grad=True)
    bias = Tensor(np.zeros(3), requires_grad=True)
    convolved = x * 2.0  # stands for the convolution whose output batch norm reads
    convolved_array = weakref.ref(convolved.data)
    output = ops.batch_norm(convolved, None, None, weight, bias, training=True)
    del convolved
    # One activation-sized array (the normalised input) and per-channel vectors, nothing more.
    activation_sized = [a for a in output.grad_fn.saved if a is not None and a.size == x.numel()]
    assert len(activation_sized) == 1
    assert convolved_array() is None
