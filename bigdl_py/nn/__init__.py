"""Layers, containers, initialisers and losses (PyTorch names; BigDL names in docs/)."""

from bigdl_py.nn import init  # noqa: F401  (nn.init.xavier_uniform_ etc.)
from bigdl_py.nn.attention import *  # noqa: F403
from bigdl_py.nn.containers import *  # noqa: F403
from bigdl_py.nn.graph import *  # noqa: F403
from bigdl_py.nn.layers import *  # noqa: F403
from bigdl_py.nn.loss import *  # noqa: F403
from bigdl_py.nn.module import Module, Parameter  # noqa: F401
from bigdl_py.nn.recurrent import *  # noqa: F403
from bigdl_py.nn.safetensors_io import load_safetensors, save_safetensors  # noqa: F401
from bigdl_py.nn.serialization import load, register_module, save  # noqa: F401
from bigdl_py.nn.transformer import *  # noqa: F403
