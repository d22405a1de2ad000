"""``DistriTrainer``: custom training steps on Spark, for models that one loss does not train.

``DistriOptimizer`` is BigDL's loop: one model, one criterion, one OptimMethod. A GAN needs
more: two networks, each trained by its own loss (which runs the other network) and its own
optimizer, in alternation. ``DistriTrainer`` gives that on the same machinery, step by step:

* the training data is cut into partitions and cached on the executors once
  (``PartitionedData``), shared by every step;
* each *step* names a part of the model (``trainable``: a submodule, or all of it), a
  ``training_step(model, batch) -> mean loss`` function and an OptimMethod. It is a
  ``SparkTrainingRun`` of its own: replicas next to the partitions, the gradient of its part
  reduce-scattered through Spark's shuffle, its optimizer state sharded over the owners;
* the driver keeps every parameter's current value and ships each step the values of the
  parts it does not train (frozen in its replicas: no gradient is computed for them).

So one call of :meth:`DistriTrainer.run_step` is one Spark job (forward-backward + update)
over the global batch, exactly as a ``DistriOptimizer`` iteration is, and the caller writes
the loop: which step, how often, what to log. Synchronous SGD this way is the same
mathematics as running the steps one after the other in one process on the global batch.
"""

from __future__ import annotations

import copy
import os
import uuid
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np

from bigdl_py.nn.module import Module
from bigdl_py.optim import OptimMethod
from bigdl_py.optim.flat_parameters import flat_layout
from bigdl_py.spark.modes import resolve_mode
from bigdl_py.spark.partitioned_data import prepare_training
from bigdl_py.spark.replica import RunSpec, StepBatch, trained_submodule
from bigdl_py.spark.session import executors_share_a_disk
from bigdl_py.spark.training_run import SparkTrainingRun
from bigdl_py.train import checkpoint as checkpoints
from bigdl_py.train.resume import pack_state_dicts, unpack_state_dicts

__all__ = ["DistriTrainer", "StepBatch"]


class _Step:
    """One named step: which parameters it trains, and its Spark run once started."""

    def __init__(self, name: str, spec: RunSpec, names: list[str], values: dict):
        self.name = name
        self.spec = spec
        self.parameter_names = names  # the trained parameters, in the run's flat order
        self.layout = flat_layout((n, values[n]) for n in names)  # where each sits in it
        self.run: SparkTrainingRun | None = None
        self.iterations = 0
        self.resume_shards: list[dict] | None = None  # from a checkpoint, for the next run


class DistriTrainer:
    """Train parts of ``model`` on Spark with custom steps and one OptimMethod per step.

    Parameters
    ----------
    model : Module
        Every network the steps use, as children of one module (a GAN: ``generator`` and
        ``discriminator``). Its weights on the driver are the starting point;
        :meth:`sync_model` writes the trained ones back.
    training_set
        As for ``DistriOptimizer``: an RDD (Samples, ``(features, label)`` pairs or
        MiniBatches), a DataFrame (with ``feature_cols``, ``label_col``, ``feature_shape``)
        or ``(features, labels)`` arrays.
    batch_size : int
        The global batch of one step, split over the partitions.
    num_partitions, feature_cols, label_col, feature_shape, wire_dtype, seed, shuffle, device,
    spark
        As for ``DistriOptimizer``.

    Examples
    --------
    >>> trainer = DistriTrainer(gan, (images, labels), batch_size=128, num_partitions=2)
    >>> trainer.add_step("discriminator", discriminator_loss, Adam(2e-4, betas=(0.5, 0.999)),
    ...                  trainable="discriminator")
    >>> trainer.add_step("generator", generator_loss, Adam(2e-4, betas=(0.5, 0.999)),
    ...                  trainable="generator")
    >>> for epoch in range(epochs):
    ...     for batch in range(trainer.batches_per_epoch):
    ...         d_loss = trainer.run_step("discriminator", epoch, batch)["loss"]
    ...         g_loss = trainer.run_step("generator", epoch, batch)["loss"]
    >>> trainer.sync_model(); trainer.close()
    """

    def __init__(
        self,
        model: Module,
        training_set: Any,
        batch_size: int,
        *,
        num_partitions: int | None = None,
        feature_cols: Any = "features",
        label_col: str = "label",
        feature_shape: Any = None,
        wire_dtype: str | None = None,
        seed: int = 0,
        shuffle: bool = True,
        device: str = "cpu",
        spark: Any = None,
    ):
        from bigdl_py.spark import wire
        from bigdl_py.spark.gpu import check_device_request
        from bigdl_py.spark.session import get_spark, partition_count

        if not isinstance(model, Module):
            raise TypeError(f"model must be a bigdl_py.nn.Module, got {type(model).__name__}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        self.wire_dtype = wire.check_wire_dtype(wire_dtype)
        self.device = check_device_request(device)
        spark = spark or get_spark()
        num_partitions = partition_count(spark.sparkContext, num_partitions)
        if batch_size < num_partitions:
            raise ValueError(
                f"batch_size {batch_size} is smaller than num_partitions {num_partitions}: "
                "every partition needs at least one sample per step"
            )
        self.model = model
        self.batch_size = batch_size
        self.seed = int(seed)
        # Recorded in each checkpoint, so a fresh run never replaces another run's ones.
        self.run_id = "run-" + uuid.uuid4().hex[:12]
        self._own_checkpoint_dirs: set[str] = set()  # written to or resumed from by this run
        _, self.data, self.plan = prepare_training(
            training_set,
            batch_size,
            num_partitions=num_partitions,
            feature_cols=feature_cols,
            label_col=label_col,
            feature_shape=feature_shape,
            seed=seed,
            shuffle=shuffle,
            spark=spark,
        )
        # The driver's copy of every parameter, by name (in the model's dtype): the source
        # of frozen weights.
        self.values = {
            name: np.array(parameter.numpy()) for name, parameter in model.named_parameters()
        }
        self.buffers: dict[str, np.ndarray] = {}
        self.steps: dict[str, _Step] = {}

    @property
    def num_partitions(self) -> int:
        return self.data.num_partitions

    @property
    def batches_per_epoch(self) -> int:
        return self.plan.iterations_per_epoch

    def add_step(
        self,
        name: str,
        training_step: Callable[[Module, StepBatch], Any],
        optim_method: OptimMethod,
        trainable: str | None = None,
    ) -> DistriTrainer:
        """Declare a step: ``training_step(model, batch)`` returns the mean loss of the
        batch's samples (a scalar Tensor) and may use ``batch.rng`` / ``batch.normal`` for
        its own randomness; ``optim_method`` updates the parameters of the submodule named
        ``trainable`` (dotted, as in ``named_modules``; None: the whole model)."""
        if name in self.steps:
            raise ValueError(f"a step named {name!r} exists already")
        if not callable(training_step):
            raise TypeError(f"training_step of step {name!r} must be callable")
        if not isinstance(optim_method, OptimMethod):
            raise TypeError(
                f"optim_method of step {name!r} must be an OptimMethod, got "
                f"{type(optim_method).__name__}"
            )
        module = trained_submodule(self.model, trainable)
        prefix = "" if trainable is None else trainable + "."
        names = [prefix + local for local, _ in module.named_parameters()]
        if not names:
            raise ValueError(f"step {name!r}: submodule {trainable!r} has no parameters")
        spec = RunSpec(
            run_id=f"{name}-{uuid.uuid4().hex[:12]}",
            model=self.model,
            criterion=None,
            optim_method=copy.deepcopy(optim_method),
            num_partitions=self.num_partitions,
            flat_size=int(sum(self.values[n].size for n in names)),
            batch_size=self.batch_size,
            state_dir=self.data.state_dir,
            seed=self.seed,
            wire_dtype=self.wire_dtype,
            device=self.device,
            trainable=trainable,
            training_step=training_step,
            stream=zlib.crc32(name.encode()),
            mode=resolve_mode("sharded"),
            # Where the executors share no disk, a step's owner finds no state file on
            # another host: the state travels through the driver, as DistriOptimizer's.
            carry_state=not executors_share_a_disk(self.data.sc),
        )
        self.steps[name] = _Step(name, spec, names, self.values)
        return self

    def _step(self, name: str) -> _Step:
        if name not in self.steps:
            raise KeyError(f"no step named {name!r}; the steps are {sorted(self.steps)}")
        return self.steps[name]

    def _frozen_weights(self, step: _Step) -> np.ndarray | None:
        trained = set(step.parameter_names)
        frozen = [values.ravel() for n, values in self.values.items() if n not in trained]
        return np.concatenate(frozen) if frozen else None

    def run_step(self, name: str, epoch: int, batch: int) -> dict[str, Any]:
        """One synchronous step ``name`` on global batch ``batch`` of ``epoch`` (one Spark
        job); returns ``{"loss", "count", "finite"}``. A non-finite loss leaves the weights
        and the optimizer state as they were."""
        step = self._step(name)
        if not 0 <= batch < self.batches_per_epoch:
            raise ValueError(f"batch must be in [0, {self.batches_per_epoch}), got {batch}")
        if step.run is None:
            weights = np.concatenate([self.values[n].ravel() for n in step.parameter_names])
            initial = None
            if step.resume_shards is not None:
                initial = {"iteration": step.iterations, "shards": step.resume_shards}
            step.run = SparkTrainingRun(self.data, step.spec, weights, initial)
            step.resume_shards = None
        (result,) = step.run.run_chain(
            step.iterations,
            [self.plan.shares(epoch * self.batches_per_epoch + batch)],
            [{"iteration": step.iterations, "epoch": epoch}],
            f"bigdl_py step {name} {step.iterations + 1}",
            frozen_weights=self._frozen_weights(step),
        )
        step.iterations += 1
        for entry in step.layout:
            self.values[entry.name][...] = step.run.weights[entry.offset : entry.stop].reshape(
                entry.shape
            )
        if step.run.buffers:
            self.buffers.update(step.run.buffers)
        return result

    def last_timings(self, name: str) -> dict[str, float]:
        """The last iteration's breakdown of step ``name`` (as DistriOptimizer's)."""
        run = self._step(name).run
        return dict(run.last_timings) if run is not None else {}

    def sync_model(self) -> Module:
        """Write the trained weights (and partition 0's buffers) into ``model``."""
        state = dict(self.model.state_dict())
        state.update(self.values)
        state.update(self.buffers)
        self.model.load_state_dict(state)
        return self.model

    # --- checkpoints -------------------------------------------------------------------
    def _fingerprint(self) -> dict:
        """What must match for a resumed trainer to see the same batches and shards."""
        return {
            "size": int(sum(self.data.sizes)),
            "partition_sizes": [int(size) for size in self.data.sizes],
            "batch_size": self.batch_size,
            "seed": self.seed,
            "steps": {name: step.parameter_names for name, step in self.steps.items()},
        }

    def save_checkpoint(
        self,
        directory: str,
        metadata: dict | None = None,
        keep: int = 2,
        replace_other_runs: bool = False,
    ) -> str:
        """Write the weights, buffers, every step's sharded optimizer state and step count
        (and the caller's JSON ``metadata``, e.g. the epoch) as one checkpoint in
        ``directory`` (atomic npz + JSON manifest, no pickle); returns its manifest path.
        The previous checkpoint stays until this one is complete.

        Raises
        ------
        ValueError
            When ``directory`` is a file, or holds checkpoints another run wrote (they would
            be pruned) and ``replace_other_runs`` is False; nothing is written then. A run
            resumed with :meth:`load_checkpoint` continues that checkpoint's run.
        """
        owned = os.path.realpath(directory)
        if not replace_other_runs and owned not in self._own_checkpoint_dirs:
            problem = checkpoints.other_run_checkpoints(directory, self.run_id)
            if problem is not None:
                raise ValueError(problem)
        arrays: dict[str, Any] = {f"model/{name}": values for name, values in self.values.items()}
        arrays.update({f"buffer/{name}": values for name, values in self.buffers.items()})
        layouts, counts = {}, {}
        for name, step in self.steps.items():
            if step.run is not None:
                shards = step.run.gather_optim_states(step.iterations)
            elif step.resume_shards is not None:
                shards = step.resume_shards
            else:  # declared, never run: fresh state
                shards = [copy.deepcopy(step.spec.optim_method).state_dict()] * self.num_partitions
            packed, layouts[name] = pack_state_dicts(f"optim/{name}", shards)
            arrays.update(packed)
            counts[name] = step.iterations
        total = sum(counts.values())
        manifest = checkpoints.save_checkpoint(
            directory,
            total,
            arrays,
            {
                "trainer": self._fingerprint(),
                "step_iterations": counts,
                "optim_layouts": layouts,
                "user": metadata or {},
            },
            keep=keep,
            run_id=self.run_id,
        )
        self._own_checkpoint_dirs.add(owned)  # the older runs' checkpoints are pruned in turn
        return manifest

    def load_checkpoint(self, path: str) -> dict:
        """Continue from a checkpoint (a directory's latest good one, or a manifest): the
        steps must be declared as when it was written, with the same data, partitions,
        batch size and seed. Returns the ``metadata`` given to :meth:`save_checkpoint`.

        Raises
        ------
        ValueError
            Naming each setting that differs from the checkpoint's.
        """
        checkpoint = checkpoints.load_checkpoint(path)
        saved = checkpoint.metadata.get("trainer")
        if saved is None:
            raise ValueError(f"{checkpoint.path} is not a DistriTrainer checkpoint")
        now = self._fingerprint()
        different = {k: (saved.get(k), now[k]) for k in now if saved.get(k) != now[k]}
        if different:
            raise ValueError(
                f"cannot resume from {checkpoint.path}: settings differ from the ones it was "
                f"written with (setting: (checkpoint, now)) {different}"
            )
        self.run_id = checkpoint.run_id or self.run_id  # continuing that run
        self._own_checkpoint_dirs.add(os.path.realpath(os.path.dirname(checkpoint.path)))
        for name, values in self.values.items():
            values[...] = checkpoint.arrays[f"model/{name}"]
        self.buffers = {
            name[len("buffer/") :]: value
            for name, value in checkpoint.arrays.items()
            if name.startswith("buffer/")
        }
        layouts = checkpoint.metadata["optim_layouts"]
        for name, step in self.steps.items():
            if step.run is not None:  # start a fresh run from the checkpoint's state
                step.run.close()
                step.run = None
            step.iterations = int(checkpoint.metadata["step_iterations"][name])
            step.resume_shards = unpack_state_dicts(
                f"optim/{name}", checkpoint.arrays, layouts[name]
            )
        self.sync_model()
        return dict(checkpoint.metadata.get("user", {}))

    def close(self) -> None:
        """End every step's run and delete the cached data on the executors."""
        for step in self.steps.values():
            if step.run is not None:
                step.run.close()
                step.run = None
        self.data.close()

    def __enter__(self) -> DistriTrainer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
