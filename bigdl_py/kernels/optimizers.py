"""One fused update of the flat weight vector per OptimMethod (``cuda/optimizers.cu``).

Each ``*_reference`` is its kernel written with NumPy, operation for operation, with the
kernel's parameters in the kernel's order (``n`` first, ``steps`` and ``applied`` last);
it updates its arrays in place. The functions without the suffix are what the
OptimMethods call on a device: they take the state by name and run the kernel or the
reference (``compiler.run``). The scalars arrive as the kernel gets them: ``real`` ones
rounded to the dtype, ``double`` ones (beta1, whose power the bias correction takes) as
Python floats. The learning rate is a 0-d float64 device array the OptimMethod fills
before each step (``step_graph.fill_each_step``), so a replayed graph follows a schedule.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from bigdl_py.kernels.compiler import Kernel, elementwise_blocks, run

_COUNTERS = ("const long long*", "const bool*")  # steps, applied
_RATE = "const double*"  # the learning rate, on the device

SGD = Kernel(
    "optimizers",
    "sgd_update",
    ("index", "real*", "const real*", "real*", _RATE, "real", "real", "real", "int") + _COUNTERS,
)
ADAM = Kernel(
    "optimizers",
    "adam_update",
    ("index", "real*", "const real*", "real*", "real*", "real*", _RATE, "double", "double")
    + ("real", "real", "real", "double", "int", "int")
    + _COUNTERS,
)
ADAMAX = Kernel(
    "optimizers",
    "adamax_update",
    ("index", "real*", "const real*", "real*", "real*", _RATE, "double", "real", "real")
    + ("real", "real")
    + _COUNTERS,
)
ADAGRAD = Kernel(
    "optimizers",
    "adagrad_update",
    ("index", "real*", "const real*", "real*", _RATE, "double", "real", "real") + _COUNTERS,
)
RMSPROP = Kernel(
    "optimizers",
    "rmsprop_update",
    ("index", "real*", "const real*", "real*", "real*", "real*", _RATE, "real", "real", "real")
    + ("real", "real", "int")
    + _COUNTERS,
)
ADADELTA = Kernel(
    "optimizers",
    "adadelta_update",
    ("index", "real*", "const real*", "real*", "real*", _RATE, "real", "real", "real", "real")
    + _COUNTERS,
)


def _reals(weight: np.ndarray, *values: float) -> list:
    """Scalars as the kernel's ``real`` parameters hold them."""
    return [weight.dtype.type(value) for value in values]


def _rate(learning_rate: np.ndarray) -> float:
    """The learning rate the kernel reads from the device (a 0-d float64 array)."""
    return float(learning_rate[()])


# --- the references (NumPy, in place) ------------------------------------------------------


def sgd_reference(
    n, weight, gradient, buffer, learning_rate, momentum, one_minus_dampening, weight_decay,
    nesterov, steps, applied,
):  # fmt: skip
    if not applied[()]:
        return
    learning_rate, momentum, one_minus_dampening, weight_decay = _reals(
        weight, _rate(learning_rate), momentum, one_minus_dampening, weight_decay
    )
    grad = gradient + weight_decay * weight if weight_decay != 0 else gradient
    if momentum != 0:
        if steps[()] == 1:
            kept = grad.copy()
        else:
            kept = momentum * buffer
            kept += grad if one_minus_dampening == 1 else one_minus_dampening * grad
        buffer[...] = kept
        grad = grad + momentum * kept if nesterov else kept
    weight -= learning_rate * grad


def adam_reference(
    n, weight, gradient, exp_avg, exp_avg_sq, max_exp_avg_sq, learning_rate, beta1, beta2,
    one_minus_beta1, one_minus_beta2, eps, decay, decoupled, amsgrad, steps, applied,
):  # fmt: skip
    if not applied[()]:
        return
    t = float(steps[()])
    real = weight.dtype.type
    bias_correction2_root = real(np.sqrt(1.0 - beta2**t))
    step_size = real(_rate(learning_rate) / (1.0 - beta1**t))
    b1, b2 = real(beta1), real(beta2)
    one_minus_beta1, one_minus_beta2, eps, weight_decay, decay_factor = _reals(
        weight, one_minus_beta1, one_minus_beta2, eps, decay, 1.0 - _rate(learning_rate) * decay
    )
    grad = gradient
    if weight_decay != 0:
        if decoupled:
            weight *= decay_factor
        else:
            grad = grad + weight_decay * weight
    exp_avg[...] = b1 * exp_avg + grad * one_minus_beta1
    exp_avg_sq[...] = b2 * exp_avg_sq + grad * grad * one_minus_beta2
    second = exp_avg_sq
    if amsgrad:
        np.maximum(max_exp_avg_sq, exp_avg_sq, out=max_exp_avg_sq)
        second = max_exp_avg_sq
    weight -= exp_avg / (np.sqrt(second) / bias_correction2_root + eps) * step_size


def adamax_reference(
    n, weight, gradient, exp_avg, exp_inf, learning_rate, beta1, one_minus_beta1, beta2, eps,
    weight_decay, steps, applied,
):  # fmt: skip
    if not applied[()]:
        return
    real = weight.dtype.type
    step_size = real(_rate(learning_rate) / (1.0 - beta1 ** float(steps[()])))
    one_minus_beta1, beta2, eps, weight_decay = _reals(
        weight, one_minus_beta1, beta2, eps, weight_decay
    )
    grad = gradient + weight_decay * weight if weight_decay != 0 else gradient
    exp_avg[...] = real(beta1) * exp_avg + grad * one_minus_beta1
    np.maximum(beta2 * exp_inf, np.abs(grad) + eps, out=exp_inf)
    weight -= exp_avg / exp_inf * step_size


def adagrad_reference(
    n, weight, gradient, square_sum, learning_rate, lr_decay, eps, weight_decay, steps, applied
):
    if not applied[()]:
        return
    step_size = weight.dtype.type(_rate(learning_rate) / (1.0 + float(steps[()] - 1) * lr_decay))
    eps, weight_decay = _reals(weight, eps, weight_decay)
    grad = gradient + weight_decay * weight if weight_decay != 0 else gradient
    square_sum += grad * grad
    weight -= grad / (np.sqrt(square_sum) + eps) * step_size


def rmsprop_reference(
    n, weight, gradient, square_avg, grad_avg, buffer, learning_rate, alpha, one_minus_alpha,
    eps, weight_decay, momentum, centered, steps, applied,
):  # fmt: skip
    if not applied[()]:
        return
    learning_rate, alpha, one_minus_alpha, eps, weight_decay, momentum = _reals(
        weight, _rate(learning_rate), alpha, one_minus_alpha, eps, weight_decay, momentum
    )
    grad = gradient + weight_decay * weight if weight_decay != 0 else gradient
    square_avg[...] = alpha * square_avg + grad * grad * one_minus_alpha
    if centered:
        grad_avg[...] = alpha * grad_avg + grad * one_minus_alpha
        denominator = np.sqrt(square_avg - grad_avg * grad_avg) + eps
    else:
        denominator = np.sqrt(square_avg) + eps
    step = grad / denominator
    if momentum > 0:
        buffer[...] = momentum * buffer + step
        step = buffer
    weight -= step * learning_rate


def adadelta_reference(
    n, weight, gradient, square_avg, acc_delta, learning_rate, rho, one_minus_rho, eps,
    weight_decay, steps, applied,
):  # fmt: skip
    if not applied[()]:
        return
    learning_rate, rho, one_minus_rho, eps, weight_decay = _reals(
        weight, _rate(learning_rate), rho, one_minus_rho, eps, weight_decay
    )
    grad = gradient + weight_decay * weight if weight_decay != 0 else gradient
    square_avg[...] = rho * square_avg + grad * grad * one_minus_rho
    delta = np.sqrt(acc_delta + eps) / np.sqrt(square_avg + eps) * grad
    acc_delta[...] = rho * acc_delta + delta * delta * one_minus_rho
    weight -= delta * learning_rate


# --- what the OptimMethods call ------------------------------------------------------------


def update(kernel: Kernel, reference, weight: Any, *arguments: Any) -> None:
    """Run one update kernel on ``weight`` (the first array argument after ``n``)."""
    run(
        kernel,
        reference,
        elementwise_blocks(weight.size),
        weight.dtype,
        weight.size,
        weight,
        *arguments,
    )


REFERENCES = {
    SGD: sgd_reference,
    ADAM: adam_reference,
    ADAMAX: adamax_reference,
    ADAGRAD: adagrad_reference,
    RMSPROP: rmsprop_reference,
    ADADELTA: adadelta_reference,
}
