"""Layers, containers, initialisers and losses (PyTorch names; BigDL names in docs/)."""

from bigdl_py.nn import init
from bigdl_py.nn.containers import *  # noqa: F403
from bigdl_py.nn.graph import *  # noqa: F403
from bigdl_py.nn.layers import *  # noqa: F403
from bigdl_py.nn.loss import *  # noqa: F403
from bigdl_py.nn.module import Module, Parameter
from bigdl_py.nn.recurrent import *  # noqa: F403
