"""bigdl_py on Apache Spark.

- :mod:`bigdl_py.spark.session` — ``get_spark`` with the recommended settings, ``task_slots``,
  job descriptions and groups for the Spark UI (driver side).
- :mod:`bigdl_py.spark.worker` — what a task may keep in its Python worker: BLAS threads and
  the worker-resident cache (executor side).
- :mod:`bigdl_py.spark.collectives` — broadcast, reduce, all_reduce, reduce_scatter,
  all_gather, scatter, gather and barrier over the partitions of an RDD.
- :mod:`bigdl_py.spark.wire` — how array slices travel through a shuffle (fp16/bf16 option).

Importing this package does not import pyspark; the functions do, when called.
"""

from bigdl_py.spark.session import (
    RECOMMENDED_CONF,
    get_spark,
    job_description,
    job_group,
    set_job_description,
    task_slots,
)
from bigdl_py.spark.worker import configure_worker_threads

__all__ = [
    "RECOMMENDED_CONF",
    "configure_worker_threads",
    "get_spark",
    "job_description",
    "job_group",
    "set_job_description",
    "task_slots",
]
