"""Scaled dot-product attention, ``dropout(softmax(q @ k.T / sqrt(d) + mask)) @ v``, fused.

Composed from matmul, softmax and dropout ops, attention keeps the scaled queries, the
softmax output and the dropped-out weights for the backward pass and makes a new
``(..., L, S)`` array at each step. Fused, the forward keeps only the softmax output and the
dropout mask and works in place, and the backward is written out: one full ``(..., L, S)``
float array less held per attention, and on a 32 x 4 x 128 x 128 (head width 32) float32
problem forward plus backward took 0.85x the composed ops' CPU time (one BLAS thread, AMD
EPYC, machine loaded).
"""

from __future__ import annotations

import math

from bigdl_py import backend, kernels
from bigdl_py.autograd.function import Function
from bigdl_py.autograd.ops import conv_tiles, cublas
from bigdl_py.autograd.ops.misc import _keep_mask
from bigdl_py.kernels import softmax as fused_softmax

__all__ = ["scaled_dot_product_attention"]


class ScaledDotProductAttention(Function):
    """Inputs ``query (..., L, D)``, ``key (..., S, D)``, ``value (..., S, Dv)``; output
    ``(..., L, Dv)``. Options: ``mask``, an array added to the scores (``-inf`` forbids a
    pair), broadcastable to ``(..., L, S)``; ``dropout_p`` on the weights; ``rng`` for the
    dropout mask (None: the generator ``ops.manual_seed`` seeds, as ``ops.dropout``)."""

    def forward(self, query, key, value, mask=None, dropout_p=0.0, rng=None):
        xp = backend.array_module(query)
        self.scale = query.dtype.type(1.0 / math.sqrt(query.shape[-1]))
        self.dropout_scale = query.dtype.type(1.0 / (1.0 - dropout_p) if dropout_p < 1 else 0.0)
        leading = query.shape[:-2]
        key = xp.broadcast_to(key, (*leading, *key.shape[-2:]))
        value = xp.broadcast_to(value, (*leading, *value.shape[-2:]))
        weights = xp.empty((*query.shape[:-1], key.shape[-2]), dtype=query.dtype)
        output = xp.empty((*query.shape[:-1], value.shape[-1]), dtype=query.dtype)
        if mask is not None:
            mask = xp.broadcast_to(mask, weights.shape)
        # The whole mask is drawn before the tiles run: the same for any thread count.
        keep = _keep_mask(weights.shape, dropout_p, weights, rng) if dropout_p > 0 else None

        fused = kernels.route(query, key, value) is not None

        def run(part):
            tile = weights[part]
            cublas.matmul(query[part] * self.scale, xp.swapaxes(key[part], -1, -2), out=tile)
            if mask is not None:
                tile += mask[part]
            if not tile.shape[-1]:  # no keys: empty weights, a zero output (PyTorch's)
                pass
            elif fused:  # one kernel, in place
                fused_softmax.row_softmax(tile, log=False, out=tile)
            else:
                tile -= tile.max(axis=-1, keepdims=True)
                xp.exp(tile, out=tile)
                tile *= 1 / tile.sum(axis=-1, keepdims=True)
            if keep is not None:
                tile = tile * keep[part]
                tile *= self.dropout_scale
            cublas.matmul(tile, value[part], out=output[part])

        _for_each_tile(weights, run)
        self.save_for_backward(query, key, value, weights, keep)
        return output

    def backward(self, grad):
        query, key, value, weights, keep = self.saved
        xp = backend.array_module(grad)
        needs_query, needs_key, needs_value = self.needs_input_grad[:3]
        # key and value are views broadcast to the query's leading axes; the backward walk
        # sums their gradients back to the given shapes.
        grad_query = xp.empty_like(query) if needs_query else None
        grad_key = xp.empty(key.shape, dtype=grad.dtype) if needs_key else None
        grad_value = xp.empty(value.shape, dtype=grad.dtype) if needs_value else None

        fused = kernels.route(query, key, value) is not None

        def run(part):
            tile, tile_grad = weights[part], grad[part]
            if needs_value:
                dropped = tile if keep is None else tile * keep[part] * self.dropout_scale
                cublas.matmul(xp.swapaxes(dropped, -1, -2), tile_grad, out=grad_value[part])
            # d(loss)/d(dropped weights)
            grad_scores = cublas.matmul(tile_grad, xp.swapaxes(value[part], -1, -2))
            if keep is not None:
                grad_scores *= keep[part]
                grad_scores *= self.dropout_scale
            if fused:  # softmax's backward, one kernel
                grad_scores = fused_softmax.row_softmax_backward(grad_scores, tile, log=False)
            else:  # softmax's backward, in place: w * (g - sum(g * w)).
                grad_scores -= (grad_scores * tile).sum(axis=-1, keepdims=True)
                grad_scores *= tile
            if needs_query:
                cublas.matmul(grad_scores, key[part], out=grad_query[part])
                grad_query[part] *= self.scale
            if needs_key:
                cublas.matmul(xp.swapaxes(grad_scores, -1, -2), query[part], out=grad_key[part])
                grad_key[part] *= self.scale

        _for_each_tile(weights, run)
        return grad_query, grad_key, grad_value


def _for_each_tile(weights, work) -> None:
    """Call ``work(part)`` on tiles ``part`` of the first axis of ``(..., L, S)`` arrays.

    A few samples' ``(L, S)`` blocks at a time (about ``conv_tiles.TILE_BYTES``) stay in
    cache through the softmax's passes; when BLAS may use several threads the tiles are
    shared out among that many Python threads with BLAS held to one thread, since the
    many small GEMMs of attention (128 x 32 x 128 per head in the bench) each end in a
    barrier between BLAS threads that, on a shared machine, often waits for a descheduled
    thread. Without leading axes the whole problem is one tile.
    """
    if weights.ndim == 2:
        work(Ellipsis)
        return
    on_gpu = backend.is_device_array(weights)
    batch = weights.shape[0]
    workers = 1 if on_gpu else conv_tiles.worker_count()
    size = conv_tiles.tile_size(batch, weights[0].nbytes, workers, on_gpu)
    conv_tiles.for_each_tile(
        batch, size, lambda start, stop, _: work(slice(start, stop)), on_gpu=on_gpu
    )


def scaled_dot_product_attention(query, key, value, mask=None, dropout_p: float = 0.0, rng=None):
    """``dropout(softmax(query @ key.T / sqrt(D) + mask)) @ value`` over the last two axes.

    Parameters
    ----------
    query, key, value : Tensor
        ``(..., L, D)``, ``(..., S, D)`` and ``(..., S, Dv)`` with equal leading axes.
    mask : array, optional
        Added to the scores; broadcastable to ``(..., L, S)`` (``-inf`` forbids a pair).
    dropout_p : float
        Dropout on the attention weights (pass 0 outside training).
    rng : numpy.random.Generator, optional
        Source of the dropout mask (see ``ops.dropout``).

    Returns
    -------
    Tensor
        ``(..., L, Dv)``.
    """
    if not 0.0 <= dropout_p <= 1.0:
        raise ValueError(
            f"scaled_dot_product_attention: dropout_p must be in [0, 1], got {dropout_p}"
        )
    if query.shape[-1] != key.shape[-1] or key.shape[-2] != value.shape[-2]:
        raise ValueError(
            "scaled_dot_product_attention: expects query (..., L, D), key (..., S, D) and value "
            f"(..., S, Dv), got shapes {tuple(query.shape)}, {tuple(key.shape)} and "
            f"{tuple(value.shape)}"
        )
    return ScaledDotProductAttention.apply(
        query, key, value, mask=mask, dropout_p=float(dropout_p), rng=rng
    )
