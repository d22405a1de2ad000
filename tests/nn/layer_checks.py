"""Checks the second-wave layer test files share (a helper module, not a test file)."""

from __future__ import annotations

import numpy as np
import test_layers_parity as parity

from bigdl_py import nn


def check_save_load_round_trip(directory, make_layer, specs) -> None:
    """``nn.save`` then ``nn.load`` gives the same class, settings, state and outputs."""
    with nn.init.seeded(0):
        layer = make_layer()
    path = directory / "layer.bigdl"
    nn.save(layer, path)
    loaded = nn.load(path)
    assert type(loaded) is type(layer) and repr(loaded) == repr(layer)
    assert loaded.training == layer.training
    loaded_state = loaded.state_dict()
    assert list(loaded_state) == list(layer.state_dict())
    for name, value in layer.state_dict().items():
        np.testing.assert_array_equal(loaded_state[name], value, err_msg=name)
    inputs = parity.as_inputs(parity.make_arrays(specs))
    layer.eval()
    loaded.eval()
    np.testing.assert_array_equal(loaded(*inputs).numpy(), layer(*inputs).numpy())
