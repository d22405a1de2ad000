"""Layers with PyTorch's names, arguments and default initialisation.

One file per kind; ``docs/bigdl_mapping.md`` lists the BigDL name of each.
"""

from bigdl_py.nn.layers.activation import *  # noqa: F403
from bigdl_py.nn.layers.activation import __all__ as _activation
from bigdl_py.nn.layers.conv import *  # noqa: F403
from bigdl_py.nn.layers.conv import __all__ as _conv
from bigdl_py.nn.layers.dropout import *  # noqa: F403
from bigdl_py.nn.layers.dropout import __all__ as _dropout
from bigdl_py.nn.layers.embedding import *  # noqa: F403
from bigdl_py.nn.layers.embedding import __all__ as _embedding
from bigdl_py.nn.layers.linear import *  # noqa: F403
from bigdl_py.nn.layers.linear import __all__ as _linear
from bigdl_py.nn.layers.merge import *  # noqa: F403
from bigdl_py.nn.layers.merge import __all__ as _merge
from bigdl_py.nn.layers.normalization import *  # noqa: F403
from bigdl_py.nn.layers.normalization import __all__ as _normalization
from bigdl_py.nn.layers.pooling import *  # noqa: F403
from bigdl_py.nn.layers.pooling import __all__ as _pooling
from bigdl_py.nn.layers.shape import *  # noqa: F403
from bigdl_py.nn.layers.shape import __all__ as _shape

__all__ = sorted(
    _activation
    + _conv
    + _dropout
    + _embedding
    + _linear
    + _merge
    + _normalization
    + _pooling
    + _shape
)
