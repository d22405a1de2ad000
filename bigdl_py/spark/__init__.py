"""bigdl_py on Apache Spark.

- :mod:`bigdl_py.spark.session` — ``get_spark`` with the recommended settings, ``task_slots``,
  job descriptions and groups for the Spark UI (driver side).
- :mod:`bigdl_py.spark.worker` — what a task may keep in its Python worker: BLAS threads and
  the worker-resident cache (executor side).
- :mod:`bigdl_py.spark.collectives` — broadcast, reduce, all_reduce, reduce_scatter,
  all_gather, scatter, gather and barrier over the partitions of an RDD.
- :mod:`bigdl_py.spark.wire` — how array slices travel through a shuffle (fp16/bf16 option).
- :mod:`bigdl_py.spark.distri_optimizer` — ``DistriOptimizer``: BigDL's synchronous
  data-parallel training loop; ``update=`` picks a training mode (``"auto"``, ``"sharded"``,
  ``"replicated"``, ``LocalSGD(period=k)``, ``Pipeline(stages=K, micro_batches=M)``; one file
  or package each in :mod:`bigdl_py.spark.modes`).
  Its machinery: ``settings`` (the caller's settings, typed, and the run's plan),
  ``partitioned_data`` (the data on the executors), ``replica`` (a partition's model and
  forward-backward), ``owner_update`` (the owner's step and state store), ``records``
  (what travels between the driver and a mode's stages), ``training_run`` (the driver of
  jobs of chained iterations), ``modes.stages`` (how a mode's stages read their input and
  end a chain), ``batch_plan`` (which samples partition j trains on in iteration i).
- :mod:`bigdl_py.spark.distri_trainer` — ``DistriTrainer``: custom training steps (several
  models, one OptimMethod each, e.g. a GAN) on DistriOptimizer's machinery.
- :mod:`bigdl_py.spark.ml` — Spark ML pipeline stages ``NNEstimator``, ``NNClassifier``,
  ``NNModel`` and ``NNClassifierModel`` (importable from here too).
- :mod:`bigdl_py.spark.predict_udf` — ``predict_udf``: a model as a column function, the
  Arrow UDF that ``predict`` uses (importable from here too); its column checks are in
  :mod:`bigdl_py.spark.arrow_features`.

Importing this package does not import pyspark; the functions do, when called, and the
Spark ML stages are imported on first use.
"""

import importlib

from bigdl_py.spark.session import (
    RECOMMENDED_CONF,
    get_spark,
    job_description,
    job_group,
    set_job_description,
    task_slots,
)
from bigdl_py.spark.worker import configure_worker_threads

# Imported on first use: pyspark.ml loads the JVM-facing ML modules, and the trainer the
# whole distributed training machinery.
_LAZY = {
    "NNClassifier": "bigdl_py.spark.ml",
    "NNClassifierModel": "bigdl_py.spark.ml",
    "NNEstimator": "bigdl_py.spark.ml",
    "NNModel": "bigdl_py.spark.ml",
    "DistriTrainer": "bigdl_py.spark.distri_trainer",
    "predict_udf": "bigdl_py.spark.predict_udf",
    "DistriOptimizer": "bigdl_py.spark.distri_optimizer",
    "DistributedTrainingError": "bigdl_py.spark.partitioned_data",
    "LocalSGD": "bigdl_py.spark.modes.local_sgd",
    "Pipeline": "bigdl_py.spark.modes.pipeline",
    "PartitionedBatchPlan": "bigdl_py.spark.batch_plan",
}

__all__ = [
    "DistriOptimizer",
    "DistriTrainer",
    "DistributedTrainingError",
    "LocalSGD",
    "PartitionedBatchPlan",
    "Pipeline",
    "NNClassifier",
    "NNClassifierModel",
    "NNEstimator",
    "NNModel",
    "RECOMMENDED_CONF",
    "configure_worker_threads",
    "get_spark",
    "job_description",
    "job_group",
    "predict_udf",
    "set_job_description",
    "task_slots",
]


def __getattr__(name: str):
    """Import the Spark ML stages and the trainer when first asked for."""
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'bigdl_py.spark' has no attribute {name!r}")
