"""TensorBoard summaries: ``TrainSummary`` and ``ValidationSummary`` (BigDL's names and tags).

A summary writes TensorBoard event files under ``<log_dir>/<app_name>/train`` or
``.../validation`` through tensorboardX's event writer. The training loop records per
iteration ``Loss``, ``Throughput`` (samples/s) and ``LearningRate``, and per validation
one scalar per validation method (``Top1Accuracy``, ``Loss``, ...).

Scalars are buffered in memory and handed to the writer in groups — one event per step —
so the hot loop pays for appending to a list, not for building protobufs every iteration.
``read_scalar`` flushes and reads the files back, in the format TensorBoard reads: it uses
tensorboardX's protobuf definitions and the TFRecord framing, so it needs no TensorFlow or
TensorBoard install.
"""

from __future__ import annotations

import glob
import os
import struct
import sys
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from bigdl_py import backend
from bigdl_py.train.triggers import SeveralIteration, Trigger, check_trigger

EVENT_FILE_PATTERN = "events.out.tfevents.*"
_TRAIN_TAGS = ("Loss", "Throughput", "LearningRate", "Parameters")
_writers_opened = 0


def tensorboardx():
    """Import tensorboardX without letting it import PyTorch.

    ``tensorboardX.writer`` tries ``import torch`` at import time, only to accept torch
    tensors as values; where torch is installed that costs seconds and hundreds of MB, and
    bigdl_py never passes torch tensors. A ``None`` entry in ``sys.modules`` makes that one
    import fail fast (tensorboardX handles the ImportError); it is removed right after.
    """
    if "tensorboardX" not in sys.modules and "torch" not in sys.modules:
        sys.modules["torch"] = None  # type: ignore[assignment]
        try:
            import tensorboardX  # noqa: F401
        finally:
            if sys.modules.get("torch", False) is None:
                del sys.modules["torch"]
    import tensorboardX

    return tensorboardX


class Summary:
    """Base of the train and validation summaries: buffered scalar writes and read-back.

    Parameters
    ----------
    log_dir : str
        Root directory of the logs.
    app_name : str
        Name of this run; the events go to ``<log_dir>/<app_name>/<kind>``.
    flush_every : int
        Hand buffered scalars to the writer after this many steps (and on every
        :meth:`flush`, :meth:`read_scalar` and :meth:`close`).
    """

    kind = "summary"

    def __init__(self, log_dir: str | os.PathLike, app_name: str, flush_every: int = 50):
        if not app_name or os.sep in str(app_name):
            raise ValueError(
                f"app_name must be a non-empty name without {os.sep!r}, got {app_name!r}"
            )
        self.log_dir = os.fspath(log_dir)
        self.app_name = str(app_name)
        self.directory = os.path.join(self.log_dir, self.app_name, self.kind)
        self.flush_every = int(flush_every)
        self._writer = None
        self._pending: list[tuple[int, float, list[tuple[str, float]]]] = []

    # --- writing ------------------------------------------------------------------------
    def add_scalar(self, tag: str, value: float, step: int, wall_time: float | None = None) -> None:
        """Record ``value`` under ``tag`` at ``step`` (buffered)."""
        self.add_scalars({tag: value}, step, wall_time)

    def add_scalars(
        self, values: Mapping[str, float], step: int, wall_time: float | None = None
    ) -> None:
        """Record several tags at one step as one event (buffered)."""
        wall_time = time.time() if wall_time is None else wall_time
        self._pending.append((int(step), wall_time, [(t, float(v)) for t, v in values.items()]))
        if len(self._pending) >= self.flush_every:
            self._write_pending()

    def add_histogram(self, tag: str, values: Any, step: int) -> None:
        """Write a histogram of ``values`` (e.g. a parameter) at ``step``."""
        self._write_pending()
        values = backend.as_numpy(values)
        histogram = tensorboardx().summary.histogram(tag, values, bins="auto")
        self._write_event(int(step), time.time(), histogram)

    def _write_event(self, step: int, wall_time: float, summary_proto: Any) -> None:
        tensorboardx()
        from tensorboardX.proto.event_pb2 import Event

        if self._writer is None:
            # tensorboardX's synchronous writer: its threaded FileWriter's flush() does not
            # wait for queued events, and read-back must see everything written.
            from tensorboardX.event_file_writer import EventsWriter

            os.makedirs(self.directory, exist_ok=True)
            global _writers_opened
            _writers_opened += 1
            # Event file names hold the time in whole seconds; a resumed run can start within
            # the same second, so the pid and a counter keep the names distinct.
            suffix = f".{os.getpid()}.{_writers_opened}"
            self._writer = EventsWriter(os.path.join(self.directory, "events"), suffix)
        event = Event(wall_time=wall_time, step=step, summary=summary_proto)
        self._writer.write_event(event)

    def _write_pending(self) -> None:
        if not self._pending:
            return
        tensorboardx()
        from tensorboardX.proto.summary_pb2 import Summary as SummaryProto

        for step, wall_time, values in self._pending:
            proto = SummaryProto(
                value=[SummaryProto.Value(tag=tag, simple_value=value) for tag, value in values]
            )
            self._write_event(step, wall_time, proto)
        self._pending.clear()

    def flush(self) -> None:
        """Write everything buffered to disk."""
        self._write_pending()
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        """Flush and close the event file (a later write opens a new one)."""
        self.flush()
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    # --- reading ------------------------------------------------------------------------
    def read_scalar(self, tag: str) -> list[tuple[int, float, float]]:
        """``[(step, value, wall_time), ...]`` of ``tag``, in the order written.

        A run resumed from a checkpoint writes the steps after the checkpoint again, so a
        step can appear twice; the later record is the resumed run's.
        """
        self.flush()
        return read_scalars(self.directory).get(tag, [])

    def tags(self) -> list[str]:
        """Every scalar tag written so far."""
        self.flush()
        return sorted(read_scalars(self.directory))

    def __getstate__(self) -> dict:
        # The open writer (a thread and a file) stays behind when a summary is pickled.
        self.flush()
        state = dict(self.__dict__)
        state["_writer"] = None
        state["_pending"] = []
        return state

    def __repr__(self) -> str:
        return f"{type(self).__name__}(log_dir={self.log_dir!r}, app_name={self.app_name!r})"


class TrainSummary(Summary):
    """Training curves: ``Loss``, ``Throughput`` and ``LearningRate`` per iteration.

    ``set_summary_trigger("Parameters", SeveralIteration(100))`` also writes a histogram of
    every parameter at those iterations (off by default: it costs a pass over the weights).
    """

    kind = "train"

    def __init__(self, log_dir: str | os.PathLike, app_name: str, flush_every: int = 50):
        super().__init__(log_dir, app_name, flush_every)
        every = SeveralIteration(1)
        self._triggers: dict[str, Trigger | None] = {
            "Loss": every,
            "Throughput": every,
            "LearningRate": every,
            "Parameters": None,
        }

    def set_summary_trigger(self, name: str, trigger: Trigger) -> TrainSummary:
        """When to record ``name`` (``Loss``, ``Throughput``, ``LearningRate``, ``Parameters``)."""
        if name not in self._triggers:
            raise ValueError(f"unknown summary {name!r}; choose one of {list(_TRAIN_TAGS)}")
        self._triggers[name] = check_trigger(trigger, f"summary trigger of {name!r}")
        return self

    def get_summary_trigger(self, name: str) -> Trigger | None:
        return self._triggers.get(name)

    def summary_triggers(self) -> dict[str, Trigger | None]:
        """Every summary's trigger by name (None: not recorded)."""
        return dict(self._triggers)


class ValidationSummary(Summary):
    """Validation curves: one scalar per validation method, each time validation runs."""

    kind = "validation"


# --- event files ------------------------------------------------------------------------------
def event_files(directory: str | os.PathLike) -> list[str]:
    """The TensorBoard event files in ``directory``, oldest first (their names hold the time)."""
    return sorted(glob.glob(os.path.join(os.fspath(directory), EVENT_FILE_PATTERN)))


def read_scalars(directory: str | os.PathLike) -> dict[str, list[tuple[int, float, float]]]:
    """Every scalar in a directory's event files: ``{tag: [(step, value, wall_time), ...]}``.

    A record cut short at the end of a file (a writer still writing) is ignored.
    """
    tensorboardx()
    from tensorboardX.proto.event_pb2 import Event

    scalars: dict[str, list[tuple[int, float, float]]] = {}
    for path in event_files(directory):
        for record in _records(path):
            event = Event.FromString(record)
            if not event.HasField("summary"):
                continue
            for value in event.summary.value:
                number = _scalar_of(value)
                if number is not None:
                    scalars.setdefault(value.tag, []).append((event.step, number, event.wall_time))
    return scalars


def _records(path: str):
    """The payloads of a TFRecord file: [u64 length][u32 crc][payload][u32 crc] each."""
    with open(path, "rb") as file:
        data = file.read()
    offset = 0
    while offset + 12 <= len(data):
        (length,) = struct.unpack_from("<Q", data, offset)
        start = offset + 12
        if start + length + 4 > len(data):
            break
        yield data[start : start + length]
        offset = start + length + 4


def _scalar_of(value: Any) -> float | None:
    kind = value.WhichOneof("value")
    if kind == "simple_value":
        return float(value.simple_value)
    if kind == "tensor" and value.tensor.float_val:
        return float(value.tensor.float_val[0])
    if kind == "tensor" and value.tensor.tensor_content and value.tensor.dtype == 1:  # DT_FLOAT
        return float(np.frombuffer(value.tensor.tensor_content, dtype=np.float32)[0])
    return None
