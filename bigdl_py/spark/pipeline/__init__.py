"""Pipeline (model) parallelism on Spark: the pieces of ``update=Pipeline(...)``.

The mode itself (what its Spark stages are) is :mod:`bigdl_py.spark.modes.pipeline`; it is
built from these files, one idea each:

* :mod:`~bigdl_py.spark.pipeline.cuts` — the model as a chain of layers, where to cut it
  into stages (balanced by parameter bytes and measured time, or as the caller says), and
  the stages' places in the flat parameter vector;
* :mod:`~bigdl_py.spark.pipeline.schedule` — GPipe's synchronous schedule: which stage works
  on which micro-batch at which tick, where the samples of each micro-batch come from, and
  at which tick each stage's update happens;
* :mod:`~bigdl_py.spark.pipeline.streams` — the random streams a layer draws from, fixed by
  (seed, iteration, replica, micro-batch, layer) wherever the layer runs;
* :mod:`~bigdl_py.spark.pipeline.stage_replica` — one stage's layers on a partition: its
  forward and backward of a micro-batch, its weights by iteration;
* :mod:`~bigdl_py.spark.pipeline.ticks` — what a partition does in one tick (one Spark
  stage), and the records that cross between neighbouring stages;
* :mod:`~bigdl_py.spark.pipeline.reference` — the same arithmetic in one process, for a
  ``LocalOptimizer`` to train as the reference a pipeline run must equal.
"""
