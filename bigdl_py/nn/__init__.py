"""Layers, containers, initialisers and losses (PyTorch names; BigDL names in docs/)."""

from bigdl_py.nn.module import Module, Parameter

__all__ = ["Module", "Parameter"]
