"""The random state a model consumes while training, saved in checkpoints as JSON.

Dropout draws its masks from NumPy ``Generator``s: a layer's own (``Dropout(p, seed=...)``)
or the one shared by the dropout op (``bigdl_py.autograd.ops.manual_seed``). An exact resume
must continue those streams where they stopped, so a checkpoint records each generator's
``bit_generator.state`` (a dict of plain ints and strings) and a resume puts it back.

CuPy's device generator (dropout on GPU arrays without a layer seed) is not captured: a
resumed GPU run with such dropout continues correctly but not bit-exactly.

:func:`keyed_random_streams` is the other way to make masks reproducible: each random layer
draws a forward pass's masks from a stream of its own keyed by ``(seed, iteration,
micro-batch, the layer's position in the model)``, so the masks do not depend on what ran
before or in which process. ``LocalOptimizer(seed=...)`` and the pipeline mode
(``bigdl_py.spark.modes.pipeline``, whose stages run a model's layers in different
processes) key them the same way, so the two draw the same masks.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from bigdl_py.autograd.ops import misc as op_randomness
from bigdl_py.nn.layers.dropout import Dropout

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


def random_stream(key: Sequence[int], position: int) -> np.random.Generator:
    """The generator of the module at ``position`` (its index in ``model.modules()``) for
    the forward pass ``key`` (``(seed, iteration, micro-batch)``)."""
    return np.random.default_rng(np.random.SeedSequence([*map(int, key), int(position)]))


@contextlib.contextmanager
def keyed_random_streams(
    indexed_modules: Iterable[tuple[int, Any]], key: Sequence[int]
) -> Iterator[None]:
    """Inside the block, every random module draws from :func:`random_stream` ``(key, i)``.

    ``indexed_modules`` are ``(i, module)`` pairs, ``i`` the module's index in the whole
    model's ``modules()`` (``enumerate(model.modules())``, or the part of it one pipeline
    stage holds). A :class:`~bigdl_py.nn.Dropout` (and ``Dropout2d``) gets the keyed
    generator whether it had a seed of its own or drew from the shared one; any other
    module's ``numpy.random.Generator`` attributes are replaced too. The previous
    generators come back when the block ends. Draws made outside a module (a bare
    ``ops.dropout`` without ``rng``) still come from the shared generator.
    """
    saved = []
    for position, module in indexed_modules:
        if isinstance(module, Dropout):
            saved.append((module, "generator", module.generator))
            module.generator = random_stream(key, position)
            continue
        for attribute, value in list(vars(module).items()):
            if isinstance(value, np.random.Generator):
                saved.append((module, attribute, value))
                setattr(module, attribute, random_stream(key, position))
    try:
        yield
    finally:
        for module, attribute, value in reversed(saved):
            setattr(module, attribute, value)
