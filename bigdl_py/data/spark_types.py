"""Which Spark object a value is, answered without importing pyspark.

The training front door (``bigdl_py.train.Optimizer``) picks local or distributed training
by the data it is given, and the Spark side reads RDDs and DataFrames differently: they all
ask here. A class is recognised by the module that defines it, so asking costs no import of
pyspark. (Whether a session or DataFrame is Spark Connect's is the session's question:
``bigdl_py.spark.session.is_spark_connect``.)
"""

from __future__ import annotations

from typing import Any


def _defined_in(value: Any, module_prefix: str, class_names: tuple[str, ...] = ()) -> bool:
    """Whether a class of ``value``'s MRO comes from ``module_prefix`` (and, when given, is
    named one of ``class_names``)."""
    return any(
        cls.__module__.startswith(module_prefix)
        and (not class_names or cls.__name__ in class_names)
        for cls in type(value).__mro__
    )


def is_rdd(value: Any) -> bool:
    """Whether ``value`` is a PySpark RDD."""
    return _defined_in(value, "pyspark.", ("RDD",))


def is_dataframe(value: Any) -> bool:
    """Whether ``value`` is a Spark DataFrame (classic or Spark Connect)."""
    return _defined_in(value, "pyspark.sql.", ("DataFrame",))


def is_spark_data(value: Any) -> bool:
    """Whether ``value`` is an RDD or a DataFrame: data that lives on a Spark cluster."""
    return is_rdd(value) or is_dataframe(value)
