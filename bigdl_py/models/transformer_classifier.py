"""A Transformer text classifier: token and position embeddings, an encoder, a mean pool.

Token ids ``(N, L)`` are embedded (``token_embedding``), a learned embedding of each
position is added (``position_embedding``, as BERT does), a ``nn.TransformerEncoder`` of
``num_layers`` batch-first layers encodes the sequence, the encoded tokens are averaged over
the positions that are not padding, and one ``Linear`` (``classifier``) gives the logits.
The names are plain PyTorch attribute names, so the same model written in PyTorch exchanges
weights with this one through :func:`bigdl_py.nn.load_safetensors`.
"""

from __future__ import annotations

import numpy as np

from bigdl_py import backend, device_waits, nn
from bigdl_py.autograd import ops
from bigdl_py.autograd.tensor import Tensor


class TransformerClassifier(nn.Module):
    """Classify token sequences with a Transformer encoder and a mean pool.

    Parameters
    ----------
    vocab_size : int
        Token ids lie in ``[0, vocab_size)``.
    num_classes : int
        Size of the output (logits; pair with ``nn.CrossEntropyLoss``).
    d_model : int
        Width of the embeddings and the encoder (default 128).
    nhead : int
        Attention heads; must divide ``d_model`` (default 4).
    num_layers : int
        Encoder layers (default 2).
    dim_feedforward : int, optional
        Hidden width of each layer's feed-forward network (default ``4 * d_model``).
    max_length : int
        Longest sequence the position embedding covers (default 512).
    dropout : float
        Dropout inside the encoder layers (default 0.1).
    padding_idx : int or None
        The padding token (default 0): it has a zero embedding, no query attends to it, and
        the mean pool skips it. ``None``: every position counts.

    Notes
    -----
    Input: ``(N, L)`` integer token ids (float ids with whole values are accepted, as a Spark
    DataFrame delivers them); output: ``(N, num_classes)`` logits. A sequence must hold at
    least one token that is not padding.

    Raises
    ------
    ValueError
        On call, for input that is not ``(N, L)`` with ``1 <= L <= max_length``, ids out
        of range, or a sequence of padding only.
    """

    def __init__(
        self,
        vocab_size: int,
        num_classes: int,
        d_model: int = 128,
        nhead: int = 4,
        num_layers: int = 2,
        dim_feedforward: int | None = None,
        max_length: int = 512,
        dropout: float = 0.1,
        padding_idx: int | None = 0,
    ):
        super().__init__()
        self.vocab_size, self.max_length = int(vocab_size), int(max_length)
        self.padding_idx = padding_idx
        self.token_embedding = nn.Embedding(vocab_size, d_model, padding_idx=padding_idx)
        self.position_embedding = nn.Embedding(max_length, d_model)
        layer = nn.TransformerEncoderLayer(
            d_model, nhead, dim_feedforward or 4 * d_model, dropout, batch_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, num_layers, enable_nested_tensor=False)
        self.classifier = nn.Linear(d_model, num_classes)

    def _tokens(self, tokens):
        """``tokens`` as an int64 array on its device, checked."""
        data = tokens.data if isinstance(tokens, Tensor) else np.asarray(tokens)
        if data.ndim != 2 or not 1 <= data.shape[1] <= self.max_length:
            raise ValueError(
                f"TransformerClassifier: expects (N, L) token ids with 1 <= L <= "
                f"max_length={self.max_length}, got shape {data.shape}"
            )
        ids = data.astype(np.int64)
        # Device ids are checked on the device (read at the next sync point in a step).
        if data.dtype.kind == "f":
            device_waits.check(
                (ids != data).any(),
                lambda: ValueError("TransformerClassifier: token ids must be whole numbers"),
            )
        low, high = ids.min(), ids.max()
        device_waits.check(
            (low < 0) | (high >= self.vocab_size),
            lambda low, high: ValueError(
                f"TransformerClassifier: token ids must lie in [0, {self.vocab_size}), got "
                f"values in [{int(low)}, {int(high)}]"
            ),
            low,
            high,
        )
        return ids

    def forward(self, tokens):
        ids = self._tokens(tokens)
        xp = backend.array_module(ids)
        positions = xp.arange(ids.shape[1])
        x = self.token_embedding(ids) + self.position_embedding(positions)
        if self.padding_idx is None:
            return self.classifier(self.encoder(x).mean(axis=1))
        padding = ids == self.padding_idx
        kept = (~padding).sum(axis=1, keepdims=True)
        device_waits.check(
            (kept == 0).any(),
            lambda: ValueError("TransformerClassifier: a sequence holds padding tokens only"),
        )
        encoded = self.encoder(x, src_key_padding_mask=padding)
        # Mean over the real tokens only: zero the padded positions, divide by their count.
        weights = ((~padding) / kept).astype(encoded.dtype)[:, :, None]
        pooled = ops.sum(encoded * Tensor(weights, _copy=False), axis=1)
        return self.classifier(pooled)


# Known to bigdl_py.nn.save/load by name (the safe format names classes, never pickles them).
nn.register_module(TransformerClassifier)


def transformer_classifier(
    vocab_size: int,
    num_classes: int,
    d_model: int = 128,
    nhead: int = 4,
    num_layers: int = 2,
    max_length: int = 512,
    dropout: float = 0.1,
) -> TransformerClassifier:
    """A :class:`TransformerClassifier` with token 0 as padding."""
    return TransformerClassifier(
        vocab_size, num_classes, d_model, nhead, num_layers, None, max_length, dropout
    )
