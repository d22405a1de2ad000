"""Inputs for every kernel, shared by the host-emulation tests and the GPU tests.

A :class:`KernelCase` builds a kernel's arguments (NumPy arrays and scalars, in the
kernel's order) and names the arrays it writes; the tests run the NumPy reference and the
kernel (emulated on the host, or compiled on a GPU) on copies and compare those arrays.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from bigdl_py.kernels import activations as fused_activations
from bigdl_py.kernels import compiler
from bigdl_py.kernels import convolution as fused_convolution
from bigdl_py.kernels import dropout as fused_dropout
from bigdl_py.kernels import normalization as fused_normalization
from bigdl_py.kernels import optimizers as fused_optimizers
from bigdl_py.kernels import softmax as fused_softmax


class KernelCase(NamedTuple):
    name: str
    kernel: compiler.Kernel
    reference: Callable
    arguments: Callable[[np.random.Generator, np.dtype], list]  # (rng, dtype) -> arguments
    outputs: tuple[int, ...]  # positions of the arrays the kernel writes
    blocks: Callable[[list], int]  # arguments -> blocks of the launch
    threads: Callable[[list], int]  # arguments -> threads of a block

    def __repr__(self) -> str:
        return self.name


def copies(arguments: list) -> list:
    return [value.copy() if isinstance(value, np.ndarray) else value for value in arguments]


CASES: list[KernelCase] = []


def case(name, kernel, reference, arguments, outputs, blocks=None, threads=None) -> None:
    blocks = blocks or (lambda args: compiler.elementwise_blocks(args[0]))
    threads = threads or (lambda args: compiler.THREADS)
    CASES.append(KernelCase(name, kernel, reference, arguments, tuple(outputs), blocks, threads))


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


def _rate(value: float) -> np.ndarray:
    """A learning rate as the kernels read it: a float64 on the device."""
    return np.array(value, dtype=np.float64)


def _sgd(first, nesterov, dampening, applied):
    def make(rng, dtype):
        weight, gradient, buffer = _vectors(rng, dtype, 3)
        return [
            SIZE, weight, gradient, buffer, _rate(0.1), 0.9, 1.0 - dampening, 1e-4, int(nesterov),
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
        return [
            SIZE, weight, gradient, exp_avg, exp_avg_sq, max_sq, _rate(1e-3), 0.9, 0.999,
            1.0 - 0.9, 1.0 - 0.999, 1e-8, 0.01, int(decoupled), int(amsgrad),
            *_counters(7, applied),
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
        SIZE, weight, gradient, exp_avg, exp_inf, _rate(2e-3), 0.9, 1.0 - 0.9, 0.999, 1e-8, 1e-3,
        *_counters(3, True),
    ]  # fmt: skip


case("adamax", fused_optimizers.ADAMAX, fused_optimizers.adamax_reference, _adamax_arguments,
     (1, 3, 4))  # fmt: skip


def _adagrad_arguments(rng, dtype):
    weight, gradient, square_sum = _vectors(rng, dtype, 3, positive=(2,))
    return [
        SIZE, weight, gradient, square_sum, _rate(0.01), 0.05, 1e-10, 1e-3, *_counters(4, True)
    ]  # fmt: skip


case("adagrad", fused_optimizers.ADAGRAD, fused_optimizers.adagrad_reference,
     _adagrad_arguments, (1, 3))  # fmt: skip


def _rmsprop(centered, momentum):
    def make(rng, dtype):
        weight, gradient, square_avg, grad_avg, buffer = _vectors(rng, dtype, 5, positive=(2,))
        grad_avg *= dtype.type(0.1)  # so that square_avg - grad_avg**2 stays > 0
        return [
            SIZE, weight, gradient, square_avg, grad_avg, buffer, _rate(0.01), 0.99,
            1.0 - 0.99, 1e-8, 1e-3, momentum, int(centered), *_counters(2, True),
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
        SIZE, weight, gradient, square_avg, acc_delta, _rate(1.0), 0.9, 1.0 - 0.9, 1e-6, 1e-3,
        *_counters(2, True),
    ]  # fmt: skip


case("adadelta", fused_optimizers.ADADELTA, fused_optimizers.adadelta_reference,
     _adadelta_arguments, (1, 3, 4))  # fmt: skip


# --- softmax, NLL, cross-entropy -------------------------------------------------------------
def _row_launch(args):
    return compiler.row_blocks(args[0])


def _row_threads(args):
    return compiler.row_threads(args[1])


def _rows_case(kernel, reference, rows, width, backward):
    def make(rng, dtype):
        x = (rng.standard_normal((rows, width)) * 3).astype(dtype)
        if not backward:
            return [rows, width, x, np.empty_like(x)]
        y = np.empty_like(x)
        forward = fused_softmax.REFERENCES[
            fused_softmax.LOG_SOFTMAX_FORWARD
            if "log" in kernel.name
            else fused_softmax.SOFTMAX_FORWARD
        ]
        forward(rows, width, x, y)
        return [rows, width, rng.standard_normal((rows, width)).astype(dtype), y, np.empty_like(x)]

    case(
        f"{kernel.name}-{rows}x{width}",
        kernel,
        reference,
        make,
        (4 if backward else 3,),
        _row_launch,
        _row_threads,
    )


for rows, width in [(7, 10), (5, 300), (3, 1)]:
    for kernel, backward in [
        (fused_softmax.SOFTMAX_FORWARD, False),
        (fused_softmax.SOFTMAX_BACKWARD, True),
        (fused_softmax.LOG_SOFTMAX_FORWARD, False),
        (fused_softmax.LOG_SOFTMAX_BACKWARD, True),
    ]:
        _rows_case(kernel, fused_softmax.REFERENCES[kernel], rows, width, backward)

ROWS, CLASSES = 9, 6
LABELS = np.array([0, 5, -100, 2, 2, 1, 7, -100, 3])  # -100 ignored; 7 clamped to a class


def _targets(rng, dtype, weighted):
    weight = (rng.random(CLASSES) + 0.5).astype(dtype) if weighted else np.zeros(1, dtype)
    return [LABELS.copy(), weight, int(weighted), -100]


def _upstream(rng, dtype, reduction):
    grad = rng.standard_normal(ROWS if reduction == 0 else 1).astype(dtype)
    return [grad, np.array([3.5], dtype=dtype), reduction]


for weighted in (False, True):
    case(
        f"nll_forward-weighted{weighted}",
        fused_softmax.NLL_FORWARD,
        fused_softmax.nll_forward_reference,
        lambda rng, dtype, w=weighted: [
            ROWS,
            CLASSES,
            rng.standard_normal((ROWS, CLASSES)).astype(dtype),
            *_targets(rng, dtype, w),
            np.empty(ROWS, dtype),
            np.empty(ROWS, dtype),
        ],  # fmt: skip
        (7, 8),
    )
    for reduction in (0, 1, 2):
        case(
            f"nll_backward-weighted{weighted}-reduction{reduction}",
            fused_softmax.NLL_BACKWARD,
            fused_softmax.nll_backward_reference,
            lambda rng, dtype, w=weighted, r=reduction: [
                ROWS * CLASSES,
                CLASSES,
                *_targets(rng, dtype, w),
                *_upstream(rng, dtype, r),
                np.empty((ROWS, CLASSES), dtype),
            ],  # fmt: skip
            (9,),
        )
    for smoothing in (0.0, 0.2):
        case(
            f"cross_entropy_forward-weighted{weighted}-smoothing{smoothing}",
            fused_softmax.CROSS_ENTROPY_FORWARD,
            fused_softmax.cross_entropy_forward_reference,
            lambda rng, dtype, w=weighted, s=smoothing: [
                ROWS,
                CLASSES,
                (rng.standard_normal((ROWS, CLASSES)) * 3).astype(dtype),
                *_targets(rng, dtype, w),
                1 - s,
                s / CLASSES,
                *(np.empty(ROWS, dtype) for _ in range(4)),
            ],  # fmt: skip
            (9, 10, 11, 12),
            _row_launch,
            _row_threads,
        )
        for reduction in (0, 2):

            def _backward(rng, dtype, w=weighted, s=smoothing, r=reduction):
                logits = (rng.standard_normal((ROWS, CLASSES)) * 3).astype(dtype)
                targets = _targets(rng, dtype, w)
                kept = [np.empty(ROWS, dtype) for _ in range(4)]
                fused_softmax.cross_entropy_forward_reference(
                    ROWS, CLASSES, logits, *targets, 1 - s, s / CLASSES, *kept
                )
                total_weight = targets[1].sum(keepdims=True)
                return [
                    ROWS * CLASSES, CLASSES, logits, kept[2], kept[3], targets[0], targets[1],
                    targets[2], total_weight, -100, 1 - s, s / CLASSES, s,
                    *_upstream(rng, dtype, r), np.empty((ROWS, CLASSES), dtype),
                ]  # fmt: skip

            case(
                f"cross_entropy_backward-weighted{weighted}-smoothing{smoothing}-reduction{reduction}",
                fused_softmax.CROSS_ENTROPY_BACKWARD,
                fused_softmax.cross_entropy_backward_reference,
                _backward,
                (16,),
            )

for mean in (0, 1):
    case(
        f"loss_reduce-mean{mean}",
        fused_softmax.LOSS_REDUCE,
        fused_softmax.loss_reduce_reference,
        lambda rng, dtype, m=mean: [
            300,
            rng.standard_normal(300).astype(dtype),
            rng.random(300).astype(dtype),
            m,
            np.empty(2, dtype),
        ],  # fmt: skip
        (4,),
        lambda args: 1,
    )


# --- batch norm and layer norm -----------------------------------------------------------------
BATCH, CHANNELS, INNER = 5, 3, 70  # 350 values a channel: more than a block's threads


def _bn_inputs(rng, dtype):
    x = (rng.standard_normal((BATCH, CHANNELS, INNER)) * 2 + 1).astype(dtype)
    mean = x.mean(axis=(0, 2)).astype(dtype)
    inv_std = (1 / np.sqrt(x.var(axis=(0, 2)) + 1e-5)).astype(dtype)
    return x, mean, inv_std, rng.standard_normal(CHANNELS).astype(dtype)


for update in (0, 1):
    case(
        f"batch_norm_statistics-update{update}",
        fused_normalization.BATCH_NORM_STATISTICS,
        fused_normalization.batch_norm_statistics_reference,
        lambda rng, dtype, u=update: [
            BATCH,
            CHANNELS,
            INNER,
            _bn_inputs(rng, dtype)[0],
            np.empty(CHANNELS, dtype),
            np.empty(CHANNELS, dtype),
            rng.standard_normal(CHANNELS).astype(dtype),
            (rng.random(CHANNELS) + 0.5).astype(dtype),
            u,
            1e-5,
            0.1,
            0.9,
            350 / 349,
        ],  # fmt: skip
        (4, 5, 6, 7),
        lambda args: 2,  # fewer blocks than channels: the blocks' stride loop runs
    )
for has_weight, has_bias in ((1, 1), (0, 1), (0, 0)):
    case(
        f"batch_norm_forward-weight{has_weight}-bias{has_bias}",
        fused_normalization.BATCH_NORM_FORWARD,
        fused_normalization.batch_norm_forward_reference,
        lambda rng, dtype, w=has_weight, b=has_bias: [
            BATCH * CHANNELS * INNER,
            CHANNELS,
            INNER,
            *_bn_inputs(rng, dtype),
            rng.standard_normal(CHANNELS).astype(dtype),
            w,
            b,
            np.empty((BATCH, CHANNELS, INNER), dtype),
        ],  # fmt: skip
        (10,),
    )
case(
    "batch_norm_backward_reduce",
    fused_normalization.BATCH_NORM_BACKWARD_REDUCE,
    fused_normalization.batch_norm_backward_reduce_reference,
    lambda rng, dtype: [
        BATCH,
        CHANNELS,
        INNER,
        rng.standard_normal((BATCH, CHANNELS, INNER)).astype(dtype),
        *_bn_inputs(rng, dtype)[:3],
        np.empty(CHANNELS, dtype),
        np.empty(CHANNELS, dtype),
    ],  # fmt: skip
    (7, 8),
    lambda args: CHANNELS,
)
for has_weight, training in ((1, 1), (0, 1), (1, 0)):
    case(
        f"batch_norm_backward_input-weight{has_weight}-training{training}",
        fused_normalization.BATCH_NORM_BACKWARD_INPUT,
        fused_normalization.batch_norm_backward_input_reference,
        lambda rng, dtype, w=has_weight, t=training: [
            BATCH * CHANNELS * INNER,
            CHANNELS,
            INNER,
            rng.standard_normal((BATCH, CHANNELS, INNER)).astype(dtype),
            *_bn_inputs(rng, dtype),
            w,
            rng.standard_normal(CHANNELS).astype(dtype),
            rng.standard_normal(CHANNELS).astype(dtype),
            BATCH * INNER,
            t,
            np.empty((BATCH, CHANNELS, INNER), dtype),
        ],  # fmt: skip
        (13,),
    )

LN_ROWS, LN_WIDTH = 6, 300


def _ln_inputs(rng, dtype):
    x = (rng.standard_normal((LN_ROWS, LN_WIDTH)) * 3 - 1).astype(dtype)
    mean = x.mean(axis=1).astype(dtype)
    inv_std = (1 / np.sqrt(x.var(axis=1) + 1e-5)).astype(dtype)
    return x, mean, inv_std


for has_weight, has_bias in ((1, 1), (0, 0)):
    case(
        f"layer_norm_forward-weight{has_weight}-bias{has_bias}",
        fused_normalization.LAYER_NORM_FORWARD,
        fused_normalization.layer_norm_forward_reference,
        lambda rng, dtype, w=has_weight, b=has_bias: [
            LN_ROWS,
            LN_WIDTH,
            _ln_inputs(rng, dtype)[0],
            rng.standard_normal(LN_WIDTH).astype(dtype),
            rng.standard_normal(LN_WIDTH).astype(dtype),
            w,
            b,
            1e-5,
            np.empty((LN_ROWS, LN_WIDTH), dtype),
            np.empty(LN_ROWS, dtype),
            np.empty(LN_ROWS, dtype),
        ],  # fmt: skip
        (8, 9, 10),
        lambda args: 4,
        lambda args: compiler.row_threads(args[1]),
    )
    case(
        f"layer_norm_backward_input-weight{has_weight}",
        fused_normalization.LAYER_NORM_BACKWARD_INPUT,
        fused_normalization.layer_norm_backward_input_reference,
        lambda rng, dtype, w=has_weight: [
            LN_ROWS,
            LN_WIDTH,
            rng.standard_normal((LN_ROWS, LN_WIDTH)).astype(dtype),
            *_ln_inputs(rng, dtype),
            rng.standard_normal(LN_WIDTH).astype(dtype),
            w,
            np.empty((LN_ROWS, LN_WIDTH), dtype),
        ],  # fmt: skip
        (8,),
        lambda args: LN_ROWS,
        lambda args: compiler.row_threads(args[1]),
    )
    case(
        f"layer_norm_backward_affine-weight{has_weight}-bias{has_bias}",
        fused_normalization.LAYER_NORM_BACKWARD_AFFINE,
        fused_normalization.layer_norm_backward_affine_reference,
        lambda rng, dtype, w=has_weight, b=has_bias: [
            LN_ROWS,
            LN_WIDTH,
            rng.standard_normal((LN_ROWS, LN_WIDTH)).astype(dtype),
            *_ln_inputs(rng, dtype),
            np.zeros(LN_WIDTH, dtype),
            np.zeros(LN_WIDTH, dtype),
            w,
            b,
        ],  # fmt: skip
        (6, 7),
        lambda args: 100,
        lambda args: compiler.row_threads(args[0]),
    )


# --- activations -------------------------------------------------------------------------------
def _activation_input(rng, dtype):
    values = rng.standard_normal(SIZE) * 4
    values[:3] = [0.0, 40.0, -40.0]
    return values.astype(dtype)


for kind in range(6):
    case(
        f"activation_forward-kind{kind}",
        fused_activations.FORWARD,
        fused_activations.forward_reference,
        lambda rng, dtype, k=kind: [
            SIZE,
            k,
            0.2,
            _activation_input(rng, dtype),
            np.empty(SIZE, dtype),
        ],  # fmt: skip
        (4,),
    )

    def _activation_backward(rng, dtype, k=kind):
        x = _activation_input(rng, dtype)
        saved = x
        if fused_activations.SAVES_OUTPUT[k]:
            saved = np.empty_like(x)
            fused_activations.forward_reference(SIZE, k, 0.2, x, saved)
        return [SIZE, k, 0.2, rng.standard_normal(SIZE).astype(dtype), saved, np.empty_like(x)]

    case(
        f"activation_backward-kind{kind}",
        fused_activations.BACKWARD,
        fused_activations.backward_reference,
        _activation_backward,
        (5,),
    )


# --- dropout -----------------------------------------------------------------------------------
DROPPED = 1001  # not a multiple of 4: the last block of words is partly used
STREAM = [0x0123456789ABCDEF, 2**32 - 3]  # an offset about to carry into the high word


case(
    "philox_take",
    fused_dropout.PHILOX_TAKE,
    fused_dropout.philox_take_reference,
    lambda rng, dtype: [np.array(STREAM, np.uint64), np.zeros(2, np.uint64), 251],
    (0, 1),
    lambda args: 1,
)
case(
    "dropout_mask",
    fused_dropout.DROPOUT_MASK,
    fused_dropout.dropout_mask_reference,
    lambda rng, dtype: [
        DROPPED,
        np.array(STREAM, np.uint64),
        fused_dropout.threshold(0.3),
        np.zeros(DROPPED, bool),
    ],  # fmt: skip
    (3,),
    lambda args: 2,
)
case(
    "dropout_apply",
    fused_dropout.DROPOUT_APPLY,
    fused_dropout.dropout_apply_reference,
    lambda rng, dtype: [
        DROPPED,
        rng.standard_normal(DROPPED).astype(dtype),
        np.array(STREAM, np.uint64),
        fused_dropout.threshold(0.3),
        1 / 0.7,
        np.empty(DROPPED, dtype),
    ],  # fmt: skip
    (5,),
    lambda args: 2,
)


# --- convolution -------------------------------------------------------------------------------
# (N, C, H, W), (KH, KW), padding, stride, dilation: odd sizes, uneven strides and a dilation.
CONVOLUTIONS = [((3, 2, 7, 6), (3, 2), (1, 0), (2, 1), (1, 2)), ((2, 3, 5, 5), (3, 3), (1, 1),
                (1, 1), (1, 1))]  # fmt: skip


def _conv_geometry(shape, kernel, padding, stride, dilation):
    _, channels, height, width = shape
    out = [
        (size + 2 * pad - dil * (k - 1) - 1) // step + 1
        for size, k, pad, step, dil in zip(
            (height, width), kernel, padding, stride, dilation, strict=True
        )
    ]
    return (channels, height, width, *kernel, *padding, *stride, *dilation, *out)


for index, (shape, kernel, padding, stride, dilation) in enumerate(CONVOLUTIONS):
    geometry = _conv_geometry(shape, kernel, padding, stride, dilation)
    rows = shape[1] * kernel[0] * kernel[1]
    area = geometry[11] * geometry[12]
    first, samples = 1, shape[0] - 1  # a tile that starts past the first sample

    case(
        f"im2col-{index}",
        fused_convolution.IM2COL,
        fused_convolution.im2col_reference,
        lambda rng, dtype, s=shape, g=geometry, r=rows, a=area, f=first, n=samples: [
            r * n * a,
            rng.standard_normal(s).astype(dtype),
            f,
            n,
            *g,
            np.empty((r, n * a), dtype),
        ],  # fmt: skip
        (17,),
    )
    case(
        f"col2im-{index}",
        fused_convolution.COL2IM,
        fused_convolution.col2im_reference,
        lambda rng, dtype, s=shape, g=geometry, r=rows, a=area, f=first, n=samples: [
            n * s[1] * s[2] * s[3],
            rng.standard_normal((r, n * a)).astype(dtype),
            f,
            n,
            *g,
            np.zeros(s, dtype),
        ],  # fmt: skip
        (17,),
    )

OUT_CHANNELS, AREA, SAMPLES_IN_BATCH = 4, 30, 5
for has_bias in (0, 1):
    case(
        f"conv_store-bias{has_bias}",
        fused_convolution.STORE,
        fused_convolution.store_reference,
        lambda rng, dtype, b=has_bias: [
            3 * OUT_CHANNELS * AREA,
            rng.standard_normal((OUT_CHANNELS, 3 * AREA)).astype(dtype),
            rng.standard_normal(OUT_CHANNELS).astype(dtype),
            b,
            1,
            3,
            OUT_CHANNELS,
            AREA,
            np.zeros((SAMPLES_IN_BATCH, OUT_CHANNELS, AREA), dtype),
        ],  # fmt: skip
        (8,),
    )
case(
    "conv_gather",
    fused_convolution.GATHER,
    fused_convolution.gather_reference,
    lambda rng, dtype: [
        3 * OUT_CHANNELS * AREA,
        rng.standard_normal((SAMPLES_IN_BATCH, OUT_CHANNELS, AREA)).astype(dtype),
        2,
        3,
        OUT_CHANNELS,
        AREA,
        np.empty((OUT_CHANNELS, 3 * AREA), dtype),
    ],  # fmt: skip
    (6,),
)
