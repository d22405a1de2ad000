"""Neural collaborative filtering (He et al. 2017): user and item embeddings scored by a network.

:class:`NCF` is NeuMF, the paper's full model: a generalised matrix factorisation branch (the
element-wise product of a user and an item embedding) and an MLP branch (an MLP over the
concatenation of two other embeddings), joined by one ``Linear`` that gives the score.
``gmf=False`` keeps the MLP branch alone (the paper's "NCF-MLP"). The score is a rating
for explicit feedback (train with ``nn.MSELoss``) or a logit for implicit feedback (train
with ``nn.BCEWithLogitsLoss``).

The input is one ``(N, 2)`` array of ``(user, item)`` index pairs, so the model takes the
features of a Spark DataFrame with two id columns as they come (``feature_cols=["user",
"item"]``); float ids, as the DataFrame path delivers them by default, are exact up to 2**24.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from bigdl_py import device_waits, nn
from bigdl_py.autograd import ops
from bigdl_py.autograd.tensor import Tensor

# The paper draws embeddings from N(0, 0.01); PyTorch's N(0, 1) default makes the initial
# products and scores far larger than ratings or logits need.
EMBEDDING_STD = 0.01


def check_hidden_widths(hidden: Sequence[int]) -> list[int]:
    """``hidden`` as a list of ints, or a ValueError unless they are positive widths with
    an even first one (it is split between the user and the item embedding)."""
    hidden = [int(width) for width in hidden]
    if not hidden or min(hidden) < 1 or hidden[0] % 2:
        raise ValueError(
            f"NCF: hidden must be positive widths with an even first one (it is split "
            f"between the user and the item embedding), got {hidden}"
        )
    return hidden


class NCF(nn.Module):
    """NeuMF: GMF and MLP branches over ``(user, item)`` pairs, scored by one ``Linear``.

    Parameters
    ----------
    num_users, num_items : int
        Sizes of the id ranges; ids must lie in ``[0, num_users)`` and ``[0, num_items)``.
    embedding_dim : int
        Size of the GMF branch's user and item embeddings (default 16).
    hidden : sequence of int
        Widths of the MLP branch (default ``(64, 32, 16)``): its user and item embeddings
        have ``hidden[0] // 2`` entries each, then ``Linear``-ReLU layers to each next width.
    gmf : bool
        Include the GMF branch (default True); False gives the MLP-only model.
    dropout : float
        Dropout after each hidden ReLU (default 0).

    Notes
    -----
    Input: ``(N, 2)`` ids (any numeric dtype; integral values); output: ``(N,)`` scores.

    Raises
    ------
    ValueError
        For an empty or odd ``hidden[0]``, a non-positive size, or (on call) input that is
        not ``(N, 2)``, or ids that are not whole numbers in range.
    """

    def __init__(
        self,
        num_users: int,
        num_items: int,
        embedding_dim: int = 16,
        hidden: Sequence[int] = (64, 32, 16),
        gmf: bool = True,
        dropout: float = 0.0,
    ):
        super().__init__()
        hidden = check_hidden_widths(hidden)
        self.num_users, self.num_items = int(num_users), int(num_items)
        self.user_mlp = nn.Embedding(num_users, hidden[0] // 2)
        self.item_mlp = nn.Embedding(num_items, hidden[0] // 2)
        layers = []
        for width_in, width_out in zip(hidden[:-1], hidden[1:], strict=True):
            layers += [nn.Linear(width_in, width_out), nn.ReLU()]
            if dropout:
                layers.append(nn.Dropout(dropout))
        self.mlp = nn.Sequential(*layers)
        self.gmf = bool(gmf)
        joined = hidden[-1]
        if self.gmf:
            self.user_gmf = nn.Embedding(num_users, embedding_dim)
            self.item_gmf = nn.Embedding(num_items, embedding_dim)
            joined += embedding_dim
        self.predict = nn.Linear(joined, 1)
        for module in self.modules():
            if isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, std=EMBEDDING_STD)

    def _ids(self, pairs) -> tuple:
        """The user and the item column of ``pairs`` as int64 arrays, checked."""
        data = pairs.data if isinstance(pairs, Tensor) else np.asarray(pairs)
        if data.ndim != 2 or data.shape[1] != 2:
            raise ValueError(f"NCF: expects (N, 2) (user, item) ids, got shape {data.shape}")
        ids = data.astype(np.int64)
        # Device ids are checked on the device (read at the next sync point in a step).
        if data.dtype.kind == "f":
            device_waits.check(
                (ids != data).any(),
                lambda: ValueError("NCF: ids must be whole numbers, got fractional values"),
            )
        for column, name, size in ((0, "user", self.num_users), (1, "item", self.num_items)):
            low, high = ids[:, column].min(), ids[:, column].max()
            device_waits.check((low < 0) | (high >= size), _id_range_error(name, size), low, high)
        return ids[:, 0], ids[:, 1]

    def forward(self, pairs):
        users, items = self._ids(pairs)
        features = self.mlp(ops.concatenate([self.user_mlp(users), self.item_mlp(items)], axis=1))
        if self.gmf:
            product = self.user_gmf(users) * self.item_gmf(items)
            features = ops.concatenate([product, features], axis=1)
        return self.predict(features).reshape(-1)


def _id_range_error(name: str, size: int):
    def error(low, high) -> ValueError:
        return ValueError(
            f"NCF: {name} ids must lie in [0, {size}), got values in [{int(low)}, {int(high)}]"
        )

    return error


# Known to bigdl_py.nn.save/load by name (the safe format names classes, never pickles them).
nn.register_module(NCF)


def ncf(
    num_users: int,
    num_items: int,
    embedding_dim: int = 16,
    hidden: Sequence[int] = (64, 32, 16),
    gmf: bool = True,
    dropout: float = 0.0,
) -> NCF:
    """NeuMF for ``num_users`` x ``num_items`` (see :class:`NCF`); ``gmf=False`` for
    the MLP-only model."""
    return NCF(num_users, num_items, embedding_dim, hidden, gmf, dropout)
