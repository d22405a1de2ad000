"""Functional forms of the layer ops: conv2d, pooling, normalisation, dropout, embedding."""

from __future__ import annotations

__all__: list[str] = []
