"""The settings that pick which kernels and libraries a device step launches.

A captured step (``bigdl_py.step_graph``) replays the launches of its capture: a setting
read while the step is built, changed after the capture, would be ignored by every replay.
So each setting that changes what a device step launches is part of the key its graph is
looked up by (the training loop's and the Spark replica's); a change warms up and captures
(or runs eagerly) a signature of its own, as a change of the model's mode does.

- ``BIGDL_PY_FUSED_KERNELS``: the fused kernels, or the composed array operations;
- ``BIGDL_PY_CUBLAS``: products on the package's cuBLAS handle, or on CuPy's;
- ``BIGDL_PY_CUDNN``: convolutions and LSTM/GRU layers on cuDNN, or on the CuPy routes;
- the TF32 settings (``backend.allow_tf32``): the compute types of float32 products and
  of cuDNN's convolutions.

``BIGDL_PY_ONEDNN`` picks host routes only (a NumPy step is never captured), and the
library paths (``BIGDL_PY_CUBLAS_LIBRARY``, ``BIGDL_PY_CUDNN_LIBRARY``) are read once, when
the library is first loaded.
"""

from __future__ import annotations

from bigdl_py import backend, kernels
from bigdl_py.autograd.ops import cublas, cudnn


def route_settings() -> tuple:
    """The settings above as they are now, ``(name, value)`` pairs (hashable)."""
    return (
        ("fused kernels", kernels.enabled()),
        ("cublas", cublas.enabled()),
        ("cudnn", cudnn.switched_on()),
        ("tf32", tuple(backend.tf32_settings().items())),
    )
