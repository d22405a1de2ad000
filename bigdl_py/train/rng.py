"""The random state a model consumes while training, saved in checkpoints as JSON.

Dropout draws its masks from NumPy ``Generator``s: a layer's own (``Dropout(p, seed=...)``)
or the one shared by the dropout op (``bigdl_py.autograd.ops.manual_seed``). An exact resume
must continue those streams where they stopped, so a checkpoint records each generator's
``bit_generator.state`` (a dict of plain ints and strings) and a resume puts it back.

CuPy's device generator (dropout on GPU arrays without a layer seed) is not captured: a
resumed GPU run with such dropout continues correctly but not bit-exactly.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from bigdl_py.autograd.ops import misc as op_randomness

_SHARED = "<dropout op>"


def _module_generators(model: Any) -> dict[str, np.random.Generator]:
    """``"<module path>:<attribute>"`` -> every Generator a module holds as an attribute."""
    generators = {}
    for module_name, module in model.named_modules():
        for attribute, value in vars(module).items():
            if isinstance(value, np.random.Generator):
                generators[f"{module_name}:{attribute}"] = value
    return generators


def model_rng_state(model: Any) -> dict[str, Any]:
    """The state of every generator the model's forward passes draw from (JSON values)."""
    generators = _module_generators(model)
    states = {name: generator.bit_generator.state for name, generator in generators.items()}
    states[_SHARED] = op_randomness._default_generator.bit_generator.state
    return states


def load_model_rng_state(model: Any, states: dict[str, Any]) -> None:
    """Put back :func:`model_rng_state`; generators are updated in place.

    Raises
    ------
    ValueError
        When the model's generators do not match the saved ones (another architecture).
    """
    generators = _module_generators(model)
    saved = {name for name in states if name != _SHARED}
    if saved != set(generators):
        raise ValueError(
            f"the checkpoint has random state for {sorted(saved)} but the model has generators "
            f"{sorted(generators)}; was it saved from another model?"
        )
    for name, generator in generators.items():
        generator.bit_generator.state = states[name]
    if _SHARED in states:
        op_randomness._default_generator.bit_generator.state = states[_SHARED]
