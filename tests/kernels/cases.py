"""Inputs for every kernel, shared by the host-emulation tests and the GPU tests.

A :class:`KernelCase` builds a kernel's arguments (NumPy arrays and scalars, in the
kernel's order) and names the arrays it writes; the tests run the NumPy reference and the
kernel (emulated on the host, or compiled on a GPU) on copies and compare those arrays.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from bigdl_py.kernels import compiler
from bigdl_py.kernels import optimizers as fused_optimizers


class KernelCase(NamedTuple):
    name: str
    kernel: compiler.Kernel
    reference: Callable
    arguments: Callable[[np.random.Generator, np.dtype], list]  # (rng, dtype) -> arguments
    outputs: tuple[int, ...]  # positions of the arrays the kernel writes
    blocks: Callable[[list], int]  # arguments -> blocks of the launch

    def __repr__(self) -> str:
        return self.name


def copies(arguments: list) -> list:
    return [value.copy() if isinstance(value, np.ndarray) else value for value in arguments]


CASES: list[KernelCase] = []


def case(name, kernel, reference, arguments, outputs, blocks=None) -> None:
    blocks = blocks or (lambda args: compiler.elementwise_blocks(args[0]))
    CASES.append(KernelCase(name, kernel, reference, arguments, tuple(outputs), blocks))


# --- optimizers --------------------------------------------------------------------------
SIZE = 1000  # more than one block's worth: the grid-stride loop and the tail both run


def _vectors(rng, dtype, count, positive=()):
    """``count`` random vectors; those at ``positive`` are > 0 (accumulated squares)."""
    vectors = []
    for index in range(count):
        values = rng.standard_normal(SIZE).astype(dtype)
        vectors.append(np.abs(values) + dtype.type(0.1) if index in positive else values)
    return vectors


def _counters(step: int, applied: bool):
    return [np.array(step, dtype=np.int64), np.array(applied)]


def _sgd(first, nesterov, dampening, applied):
    def make(rng, dtype):
        weight, gradient, buffer = _vectors(rng, dtype, 3)
        return [
            SIZE, weight, gradient, buffer, 0.1, 0.9, 1.0 - dampening, 1e-4, int(nesterov),
            *_counters(1 if first else 5, applied),
        ]  # fmt: skip

    return make


for first, nesterov, dampening, applied in [
    (True, False, 0.0, True),
    (False, False, 0.0, True),
    (False, True, 0.0, True),
    (False, False, 0.3, True),
    (False, False, 0.0, False),
]:
    case(
        f"sgd-first{first}-nesterov{nesterov}-dampening{dampening}-applied{applied}",
        fused_optimizers.SGD,
        fused_optimizers.sgd_reference,
        _sgd(first, nesterov, dampening, applied),
        (1, 3),
    )


def _adam(decoupled, amsgrad, applied):
    def make(rng, dtype):
        weight, gradient, exp_avg, exp_avg_sq, max_sq = _vectors(rng, dtype, 5, positive=(3, 4))
        learning_rate, weight_decay = 1e-3, 0.01
        return [
            SIZE, weight, gradient, exp_avg, exp_avg_sq, max_sq, learning_rate, 0.9, 0.999,
            1.0 - 0.9, 1.0 - 0.999, 1e-8, weight_decay, int(decoupled),
            1.0 - learning_rate * weight_decay, int(amsgrad), *_counters(7, applied),
        ]  # fmt: skip

    return make


for decoupled, amsgrad, applied in [
    (False, False, True),
    (True, False, True),
    (False, True, True),
    (True, True, False),
]:
    case(
        f"adam-decoupled{decoupled}-amsgrad{amsgrad}-applied{applied}",
        fused_optimizers.ADAM,
        fused_optimizers.adam_reference,
        _adam(decoupled, amsgrad, applied),
        (1, 3, 4, 5),
    )


def _adamax_arguments(rng, dtype):
    weight, gradient, exp_avg, exp_inf = _vectors(rng, dtype, 4, positive=(3,))
    return [
        SIZE, weight, gradient, exp_avg, exp_inf, 2e-3, 0.9, 1.0 - 0.9, 0.999, 1e-8, 1e-3,
        *_counters(3, True),
    ]  # fmt: skip


case("adamax", fused_optimizers.ADAMAX, fused_optimizers.adamax_reference, _adamax_arguments,
     (1, 3, 4))  # fmt: skip


def _adagrad_arguments(rng, dtype):
    weight, gradient, square_sum = _vectors(rng, dtype, 3, positive=(2,))
    return [SIZE, weight, gradient, square_sum, 0.01, 0.05, 1e-10, 1e-3, *_counters(4, True)]


case("adagrad", fused_optimizers.ADAGRAD, fused_optimizers.adagrad_reference,
     _adagrad_arguments, (1, 3))  # fmt: skip


def _rmsprop(centered, momentum):
    def make(rng, dtype):
        weight, gradient, square_avg, grad_avg, buffer = _vectors(rng, dtype, 5, positive=(2,))
        grad_avg *= dtype.type(0.1)  # so that square_avg - grad_avg**2 stays > 0
        return [
            SIZE, weight, gradient, square_avg, grad_avg, buffer, 0.01, 0.99, 1.0 - 0.99, 1e-8,
            1e-3, momentum, int(centered), *_counters(2, True),
        ]  # fmt: skip

    return make


for centered, momentum in [(False, 0.0), (True, 0.0), (True, 0.9)]:
    case(
        f"rmsprop-centered{centered}-momentum{momentum}",
        fused_optimizers.RMSPROP,
        fused_optimizers.rmsprop_reference,
        _rmsprop(centered, momentum),
        (1, 3, 4, 5),
    )


def _adadelta_arguments(rng, dtype):
    weight, gradient, square_avg, acc_delta = _vectors(rng, dtype, 4, positive=(2, 3))
    return [
        SIZE, weight, gradient, square_avg, acc_delta, 1.0, 0.9, 1.0 - 0.9, 1e-6, 1e-3,
        *_counters(2, True),
    ]  # fmt: skip


case("adadelta", fused_optimizers.ADADELTA, fused_optimizers.adadelta_reference,
     _adadelta_arguments, (1, 3, 4))  # fmt: skip
