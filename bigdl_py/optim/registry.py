"""Rebuild OptimMethods from ``config()``: a name looked up among known classes, never code."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bigdl_py.optim.adadelta import Adadelta
from bigdl_py.optim.adagrad import Adagrad
from bigdl_py.optim.adam import Adam
from bigdl_py.optim.adamax import Adamax
from bigdl_py.optim.adamw import AdamW
from bigdl_py.optim.optim_method import OptimMethod
from bigdl_py.optim.parameter_groups import GroupedOptimMethod, ParameterGroup, ParameterGroups
from bigdl_py.optim.rmsprop import RMSprop
from bigdl_py.optim.schedules import schedule_from_config
from bigdl_py.optim.sgd import SGD

OPTIM_METHODS: dict[str, type[OptimMethod]] = {
    cls.__name__: cls for cls in (SGD, Adam, AdamW, Adagrad, Adadelta, RMSprop, Adamax)
}


def optim_method_from_config(config: Mapping[str, Any]) -> OptimMethod | GroupedOptimMethod:
    """Build the method described by a ``config()`` (fresh state), grouped ones included.

    Raises
    ------
    ValueError
        If the name is not a known OptimMethod.
    """
    name = config.get("name")
    if name == "GroupedOptimMethod":
        groups = [
            ParameterGroup(
                group["name"],
                [tuple(bounds) for bounds in group["ranges"]],
                dict(group["overrides"]),
                list(group["parameter_names"]),
            )
            for group in config["groups"]
        ]
        template = optim_method_from_config(config["method"])
        return GroupedOptimMethod(template, ParameterGroups(config["size"], groups))
    if name not in OPTIM_METHODS:
        raise ValueError(f"unknown OptimMethod {name!r}; known methods: {sorted(OPTIM_METHODS)}")
    hyper_parameters = dict(config.get("hyper_parameters", {}))
    if "betas" in hyper_parameters:
        hyper_parameters["betas"] = tuple(hyper_parameters["betas"])
    schedule = config.get("schedule")
    schedule = schedule_from_config(schedule) if schedule is not None else None
    return OPTIM_METHODS[name](**hyper_parameters, schedule=schedule)
