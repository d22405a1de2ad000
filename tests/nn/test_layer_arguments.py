"""Constructor arguments are checked alike in every layer (``nn/layers/_arguments.py``):
NaN, infinity, bools, floats where an integer belongs and strings are refused at
construction with a ValueError naming the layer, the argument and the value (issue 27,
item 20). Before, ``GroupNorm(eps=nan)`` gave all-NaN outputs, ``padding_idx=1.5`` was row
1, ``batch_first="False"`` was True and ``Upsample(scale_factor=nan)`` failed inside
``math.floor``.
"""

from __future__ import annotations

import numpy as np
import pytest

from bigdl_py import nn

NAN, INF = float("nan"), float("inf")

REFUSED = [
    # (build, the message's start: layer, argument and value)
    (lambda: nn.Upsample(scale_factor=NAN), "Upsample: scale_factor must be a positive finite"),
    (lambda: nn.Upsample(scale_factor=INF), "Upsample: scale_factor must be a positive finite"),
    (lambda: nn.Upsample(scale_factor=(2.0, NAN)), r"scale_factor must be .*\(2.0, nan\)"),
    (lambda: nn.Upsample(scale_factor=0), "Upsample: scale_factor must be a positive"),
    (lambda: nn.Upsample(scale_factor=-2.0), "Upsample: scale_factor must be a positive"),
    (lambda: nn.GroupNorm(2, 4, eps=NAN), "GroupNorm: eps must be a finite number, got nan"),
    (lambda: nn.GroupNorm(2, 4, eps=-1e-5), r"GroupNorm: eps must be > 0, got -1e-05"),
    (lambda: nn.GroupNorm(2, 4, eps="1e-5"), "GroupNorm: eps must be a finite number, got '1e-5'"),
    (lambda: nn.LayerNorm(4, eps=INF), "LayerNorm: eps must be a finite number, got inf"),
    (lambda: nn.BatchNorm2d(4, eps=True), "BatchNorm2d: eps must be a finite number, got True"),
    (lambda: nn.InstanceNorm2d(4, eps=0.0), r"InstanceNorm2d: eps must be > 0, got 0.0"),
    (
        lambda: nn.TransformerEncoderLayer(4, 2, 8, layer_norm_eps=NAN),
        "TransformerEncoderLayer: layer_norm_eps must be a finite number, got nan",
    ),
    (lambda: nn.BatchNorm1d(4, momentum=True), r"momentum must be a number in \[0, 1\] or None"),
    (lambda: nn.BatchNorm1d(4, momentum="0.1"), r"momentum must be a number in \[0, 1\] or None"),
    (lambda: nn.Embedding(5, 2, padding_idx=1.5), "Embedding: padding_idx must be an integer"),
    (lambda: nn.Embedding(5, 2, padding_idx="1"), "Embedding: padding_idx must be an integer"),
    (lambda: nn.Embedding(5, 2, padding_idx=True), "padding_idx must be an integer, got True"),
    (lambda: nn.EmbeddingBag(5, 2, padding_idx=1.0), "EmbeddingBag: padding_idx must be an int"),
    (
        lambda: nn.EmbeddingBag(5, 2, include_last_offset="False"),
        "EmbeddingBag: include_last_offset must be True or False, got 'False'",
    ),
    (lambda: nn.LSTM(3, 4, batch_first="False"), "LSTM: batch_first must be True or False"),
    (lambda: nn.GRU(3, 4, bidirectional=2), "GRU: bidirectional must be True or False, got 2"),
    (lambda: nn.GRU(3, 4, bias=NAN), "GRU: bias must be True or False, got nan"),
    (lambda: nn.Linear(3, 4, bias="no"), "Linear: bias must be True or False, got 'no'"),
    (lambda: nn.Conv2d(3, 4, 3, bias=0.5), "Conv2d: bias must be True or False, got 0.5"),
    (lambda: nn.LayerNorm(4, elementwise_affine="yes"), "LayerNorm: elementwise_affine must"),
    (lambda: nn.GroupNorm(2, 4, affine=-1), "GroupNorm: affine must be True or False"),
    (lambda: nn.BatchNorm2d(4, track_running_stats="no"), "BatchNorm2d: track_running_stats"),
    (lambda: nn.MultiheadAttention(4, 2, batch_first="1"), "MultiheadAttention: batch_first"),
    (lambda: nn.MultiheadAttention(4, 2, bias=NAN), "MultiheadAttention: bias must be True"),
    (lambda: nn.TransformerEncoderLayer(4, 2, 8, norm_first="x"), "norm_first must be True"),
    (
        lambda: nn.TransformerEncoder(nn.TransformerEncoderLayer(4, 2, 8), 2, mask_check="no"),
        "TransformerEncoder: mask_check must be True or False",
    ),
    (lambda: nn.AdaptiveMaxPool2d(2, return_indices="no"), "return_indices must be True or"),
    (
        lambda: nn.Upsample(scale_factor=2, mode="bilinear", align_corners="yes"),
        "Upsample: align_corners must be True, False or None, got 'yes'",
    ),
    (lambda: nn.LeakyReLU(NAN), "LeakyReLU: negative_slope must be a finite number, got nan"),
    (lambda: nn.LeakyReLU("0.1"), "LeakyReLU: negative_slope must be a finite number"),
    (lambda: nn.ELU(alpha=INF), "ELU: alpha must be a finite number, got inf"),
    (lambda: nn.PReLU(init=NAN), "PReLU: init must be a finite number, got nan"),
    (lambda: nn.Hardtanh(max_val=NAN), "Hardtanh: max_val must be a finite number, got nan"),
    (lambda: nn.Softplus(threshold=NAN), "Softplus: threshold must be a finite number"),
    (lambda: nn.Softplus(beta=INF), "Softplus: beta must be a finite number, got inf"),
    (lambda: nn.Softmax(dim=1.5), "Softmax: dim must be an integer, got 1.5"),
    (lambda: nn.LogSoftmax(dim="1"), "LogSoftmax: dim must be an integer, got '1'"),
    (lambda: nn.Flatten(start_dim=True), "Flatten: start_dim must be an integer, got True"),
    (lambda: nn.Flatten(end_dim=INF), "Flatten: end_dim must be an integer, got inf"),
    (lambda: nn.Concat(axis=1.0), "Concat: axis must be an integer, got 1.0"),
    (lambda: nn.Reshape(True), "Reshape: shape must be a sequence of integers, got True"),
    (lambda: nn.Reshape("12"), "Reshape: shape must be a sequence of integers, got '12'"),
    (lambda: nn.Reshape((2, 1.5)), r"Reshape: shape must be a sequence of integers"),
    (lambda: nn.Dropout(0.5, seed=1.5), "Dropout: seed must be an integer >= 0, got 1.5"),
    (lambda: nn.Dropout2d(0.5, seed="3"), "Dropout2d: seed must be an integer >= 0, got '3'"),
    (lambda: nn.MaxPool1d(2, padding=0.5), "MaxPool1d: padding must be an integer >= 0"),
    (lambda: nn.SmoothL1Loss(beta=NAN), "SmoothL1Loss: beta must be a finite number, got nan"),
    (lambda: nn.SmoothL1Loss(beta=-1), r"SmoothL1Loss: beta must be >= 0, got -1"),
    (lambda: nn.CrossEntropyLoss(label_smoothing=NAN), r"label_smoothing must be a number in"),
    (lambda: nn.NLLLoss(weight=[1.0, NAN]), r"NLLLoss: weight must be finite, got \[1.0, nan\]"),
    (lambda: nn.BCELoss(weight=[INF]), r"BCELoss: weight must be finite"),
]


@pytest.mark.parametrize("build, message", REFUSED)
def test_a_bad_argument_is_refused_at_construction_naming_it(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_what_pytorch_code_passes_is_still_accepted():
    # 0 and 1 as flags, NumPy scalars from a config, a negative padding_idx counting from the
    # end, a NumPy shape: all valid, and read as PyTorch reads them.
    assert nn.Linear(3, 4, bias=0).bias is None
    assert nn.LSTM(3, 4, batch_first=np.bool_(True)).batch_first is True
    assert nn.GRU(3, 4, bidirectional=1).bidirectional is True
    assert nn.Embedding(5, 2, padding_idx=np.int64(-1)).padding_idx == 4
    assert nn.GroupNorm(2, 4, eps=np.float32(1e-3)).eps == pytest.approx(1e-3)
    assert nn.BatchNorm1d(4, momentum=None).momentum is None
    assert nn.BatchNorm1d(4, momentum=0).momentum == 0.0
    assert nn.Upsample(scale_factor=np.float64(1.5)).scale_factor == 1.5
    assert nn.Upsample(scale_factor=2, mode="bilinear", align_corners=None).align_corners is None
    assert nn.Reshape(np.array([2, -1])).shape == (2, -1)
    assert nn.Softmax(dim=np.int32(0)).dim == 0
    assert nn.Dropout(0.5, seed=np.int64(3)).seed == 3
    assert nn.LeakyReLU(0).negative_slope == 0.0


def test_settings_round_trip_through_a_model_file(tmp_path):
    model = nn.Sequential(
        nn.Conv2d(2, 3, 3, bias=False),
        nn.GroupNorm(1, 3, eps=1e-3, affine=False),
        nn.LeakyReLU(0.2),
        nn.Flatten(),
    )
    path = tmp_path / "model.bigdl"
    nn.save(model, path)
    assert repr(nn.load(path)) == repr(model)
