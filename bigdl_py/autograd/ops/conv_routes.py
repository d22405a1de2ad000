"""The one place that picks a convolution's library route, for conv2d and conv_transpose2d.

``conv_onednn`` (float32 NumPy operands, oneDNN's library loads) and ``conv_cudnn`` (CuPy
operands of one float dtype, cuDNN 9 loads) take the same arguments; either may still
decline a geometry (None), and what no library takes runs on ``conv.py``'s im2col route.
"""

from __future__ import annotations

from bigdl_py.autograd.ops import conv_cudnn, conv_onednn, cudnn, onednn


def library_route(*arrays):
    """``conv_onednn``, ``conv_cudnn`` or None (im2col) for these operands (None entries
    are absent operands, a missing bias)."""
    if onednn.applies_to(*arrays):
        return conv_onednn
    if cudnn.applies_to(*arrays):
        return conv_cudnn
    return None
