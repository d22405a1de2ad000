"""Optimisation on a flat parameter vector: OptimMethods, schedules, clipping, groups.

Everything here works on 1-D arrays (a model's whole flat vector, or one slice of it), so the
same objects serve local and distributed training. The training loop and its triggers live in
``bigdl_py.train``; the BigDL names ``Optimizer``, ``LocalOptimizer``, ``MaxEpoch``, ... are
re-exported here lazily so ``from bigdl_py.optim import LocalOptimizer, MaxEpoch`` works without
this package importing ``bigdl_py.train`` on import.
"""

from __future__ import annotations

import importlib
from typing import Any

from bigdl_py.optim.adadelta import Adadelta
from bigdl_py.optim.adagrad import Adagrad
from bigdl_py.optim.adam import Adam
from bigdl_py.optim.adamax import Adamax
from bigdl_py.optim.adamw import AdamW
from bigdl_py.optim.clipping import ConstantClipping, L2NormClipping
from bigdl_py.optim.flat_parameters import FlatEntry, FlatParameters, flatten_parameters
from bigdl_py.optim.optim_method import OptimMethod
from bigdl_py.optim.parameter_groups import GroupedOptimMethod, ParameterGroup, ParameterGroups
from bigdl_py.optim.plateau import Plateau
from bigdl_py.optim.registry import OPTIM_METHODS, optim_method_from_config
from bigdl_py.optim.regularizers import L1L2Regularizer, L1Regularizer, L2Regularizer
from bigdl_py.optim.rmsprop import RMSprop
from bigdl_py.optim.schedules import (
    Constant,
    Cosine,
    CosineAnnealing,
    EpochStep,
    Exponential,
    InverseTimeDecay,
    MultiStep,
    Poly,
    Schedule,
    Step,
    Warmup,
    schedule_from_config,
)
from bigdl_py.optim.sgd import SGD
from bigdl_py.optim.sharding import (
    all_slice_bounds,
    concatenate_state_dicts,
    slice_bounds,
    split_state_dict,
)

__all__ = [
    "OPTIM_METHODS",
    "SGD",
    "Adadelta",
    "Adagrad",
    "Adam",
    "AdamW",
    "Adamax",
    "Constant",
    "ConstantClipping",
    "Cosine",
    "CosineAnnealing",
    "EpochStep",
    "Exponential",
    "FlatEntry",
    "FlatParameters",
    "GroupedOptimMethod",
    "InverseTimeDecay",
    "L1L2Regularizer",
    "L1Regularizer",
    "L2NormClipping",
    "L2Regularizer",
    "MultiStep",
    "OptimMethod",
    "ParameterGroup",
    "ParameterGroups",
    "Plateau",
    "Poly",
    "RMSprop",
    "Schedule",
    "Step",
    "Warmup",
    "all_slice_bounds",
    "concatenate_state_dicts",
    "flatten_parameters",
    "optim_method_from_config",
    "schedule_from_config",
    "slice_bounds",
    "split_state_dict",
]

# BigDL users import the training loop and its triggers from ``optim``; they live in ``train``.
_FROM_TRAIN = (
    "Optimizer",
    "LocalOptimizer",
    "DistriOptimizer",
    "MaxEpoch",
    "MaxIteration",
    "EveryEpoch",
    "SeveralIteration",
    "MinLoss",
    "MaxScore",
    "EarlyStopping",
    "And",
    "Or",
    "Top1Accuracy",
    "Top5Accuracy",
    "Loss",
    "MAE",
    "TrainSummary",
    "ValidationSummary",
)


def __getattr__(name: str) -> Any:
    """Import the BigDL training names from ``bigdl_py.train`` on first use."""
    if name in _FROM_TRAIN:
        train = importlib.import_module("bigdl_py.train")
        try:
            value = getattr(train, name)
        except AttributeError:
            raise AttributeError(
                f"bigdl_py.optim.{name} is re-exported from bigdl_py.train, which does not "
                f"define {name!r}"
            ) from None
        globals()[name] = value  # later lookups skip this function
        return value
    raise AttributeError(f"module 'bigdl_py.optim' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_FROM_TRAIN])
