"""Dropout (BigDL's ``Dropout``, ``SpatialDropout2D``): inverted dropout of elements or of
whole channels, driven by the module's training flag."""

from __future__ import annotations

import numpy as np

from bigdl_py.autograd import ops
from bigdl_py.nn.layers._arguments import check_int, check_probability
from bigdl_py.nn.layers._base import check_ndim
from bigdl_py.nn.module import Module

__all__ = ["Dropout", "Dropout2d"]


class Dropout(Module):
    """Zero each element with probability ``p`` in training and scale the rest by 1/(1-p).

    In evaluation (``model.eval()``) the input passes through unchanged.

    Parameters
    ----------
    p : float
        Drop probability in ``[0, 1]`` (default 0.5).
    seed : int, optional
        Give the layer its own generator seeded with ``seed``, so its masks repeat from
        run to run. Without it masks come from the generator shared by all dropout ops,
        which ``bigdl_py.autograd.ops.manual_seed`` reseeds.

    Notes
    -----
    BigDL's ``Dropout(init_p)`` means the same ``p`` and also scales at training time.
    """

    def __init__(self, p: float = 0.5, seed: int | None = None):
        super().__init__()
        self.p = check_probability(p, "p", type(self).__name__)
        self.seed = None if seed is None else check_int(seed, "seed", type(self).__name__, 0)
        self._generator = None if seed is None else np.random.default_rng(self.seed)

    @property
    def generator(self) -> np.random.Generator | None:
        """The layer's own generator (None: it draws from the one the dropout ops share).

        A training loop that keys the random streams (``bigdl_py.train.rng``) sets it for a
        forward pass and puts the previous one back after.
        """
        return self._generator

    @generator.setter
    def generator(self, generator: np.random.Generator | None) -> None:
        if generator is not None and not isinstance(generator, np.random.Generator):
            raise TypeError(
                f"{type(self).__name__}.generator must be a numpy.random.Generator or None, "
                f"got {type(generator).__name__}"
            )
        self._generator = generator

    def forward(self, x):
        return ops.dropout(x, self.p, training=self.training, rng=self._generator)

    def extra_repr(self) -> str:
        return f"p={self.p}" + ("" if self.seed is None else f", seed={self.seed}")


class Dropout2d(Dropout):
    """Zero each whole channel with probability ``p`` in training and scale the rest by
    1/(1-p); the identity in evaluation.

    Input ``(N, C, H, W)``; ``(N, C, L)`` drops channels of a sequence, as PyTorch 2 does
    with 3-d input (it warns that a later release may read 3-d input as one ``(C, H, W)``
    sample). One draw per sample and channel, so a dropped feature map is zero everywhere.

    Parameters
    ----------
    p : float
        Drop probability in ``[0, 1]`` (default 0.5).
    seed : int, optional
        Give the layer its own generator seeded with ``seed`` (see :class:`Dropout`).

    Notes
    -----
    BigDL's ``SpatialDropout2D(init_p)`` means the same ``p``.
    """

    def forward(self, x):
        check_ndim(self, x, (3, 4), "(N, C, H, W) or (N, C, L)")
        return ops.dropout2d(x, self.p, training=self.training, rng=self._generator)
