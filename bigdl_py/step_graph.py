"""Whole training steps as CUDA graphs: captured once, replayed every iteration.

A training step on a GPU is a few hundred kernel launches; issuing them from Python costs
the host more than the GPU takes to run them. A CUDA graph records the launches of one
step once (a *capture*) and replays them all with one call. :class:`StepGraph` does that
for a step function ``step(*device_inputs) -> outputs`` (forward, loss, backward,
clipping, update):

* the first ``warmup_steps`` calls of each *signature* (the caller's key, the inputs' shapes
  and dtypes) run eagerly: kernels compile, lazily made state (optimizer moments, scratch
  buffers, the dropout stream) comes into being;
* the next call captures the step on a stream of its own, its allocations from a memory
  pool the graph owns; the inputs are static device buffers the graph reads;
* every later call copies the batch into those buffers (from pinned host memory, without
  waiting), runs the host actions the step registered, and launches the graph. A new
  signature (the last, shorter batch; ``model.eval()``; another optimizer) gets its own
  graph; a few are kept.

What a replay cannot do by itself, the code inside a step asks for through these hooks
(each does the plain thing when no capture is in progress, so the step's code is one):

* :func:`fill_each_step` — a device scalar the host fills before each launch (the learning
  rate of a schedule: a kernel argument would stay at its captured value);
* :func:`each_step` — host bookkeeping to repeat at every launch (an optimizer's count);
* :func:`keep_alive` — arrays the graph uses that their owner may drop (scratch buffers);
* ``backend.refuse_in_capture`` — what no graph can replay (host data copied to the
  device, cuRAND draws, an update rule without a fused kernel): the capture fails with
  ``NotCapturable`` and that signature runs eagerly from then on, the reason logged once;
* checks of device data (``device_waits.check``) become a device-side record of the first
  replayed step that failed, read at the next sync point as before.

Capture runs nothing on a GPU: a failed capture leaves the device as it was, the host
state the caller names (``host_state``: its random generators) is put back, and the step
runs eagerly. On the strict test device (``bigdl_py.strict_device``) graphs are emulated:
the capture runs the step and records every operation on the memory it used; a replay
runs those operations again with the values they were recorded with, as a GPU replays
kernels. On NumPy arrays (the CPU) every call runs eagerly.

On by default on CUDA and strict devices; ``BIGDL_PY_CUDA_GRAPHS=0`` or ``enabled=False``
turns graphs off. ``docs/gpu.md`` lists the rules.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np

from bigdl_py import backend, device_waits

SWITCH_VARIABLE = "BIGDL_PY_CUDA_GRAPHS"
NotCapturable = backend.NotCapturable
logger = logging.getLogger("bigdl_py.step_graph")


def enabled_by_environment() -> bool:
    """Whether ``BIGDL_PY_CUDA_GRAPHS`` leaves graphs on (anything but 0/false/no/off)."""
    value = os.environ.get(SWITCH_VARIABLE, "1").strip().lower()
    return value not in ("0", "false", "no", "off")


# --- hooks for the code inside a step ---------------------------------------------------------


def capturing() -> bool:
    """Whether a step is being captured in this thread."""
    return backend.active_capture() is not None


def each_step(effect: Callable[[], None]) -> None:
    """Run ``effect`` (host bookkeeping of the step) now, or, during a capture, before each
    launch of the graph (the first included)."""
    capture = backend.active_capture()
    if capture is None:
        effect()
    else:
        capture.host_effect(effect)


def fill_each_step(scalar: Any, value: Callable[[], float]) -> None:
    """Fill the device array ``scalar`` with ``value()`` now, or, during a capture, before
    each launch of the graph: kernels that read it then see each step's value."""
    capture = backend.active_capture()
    if capture is None:
        scalar.fill(value())
    else:
        capture.device_preparation(lambda: scalar.fill(value()))


def keep_alive(*arrays: Any) -> None:
    """During a capture, keep ``arrays`` as long as the graph: its kernels read or write
    them at every replay, whoever else lets them go (a no-op outside a capture)."""
    capture = backend.active_capture()
    if capture is not None:
        capture.kept.extend(arrays)


# --- one capture ------------------------------------------------------------------------------


class _Capture:
    """What a capture gathers besides the kernels: the host actions to run before each
    launch, in the order the step asked for them, the arrays to keep, the deferred checks.

    A *host effect* touches only host state; a *device preparation* writes device memory
    the captured kernels read (a learning rate, a check's step number).
    """

    emulated = False

    def __init__(self):
        self.actions: list[tuple[Callable[[], None], bool]] = []  # (action, prepares device)
        self.kept: list = []
        self.checks: list[_CapturedCheck] = []

    def host_effect(self, effect: Callable[[], None]) -> None:
        self.actions.append((effect, False))

    def device_preparation(self, prepare: Callable[[], None]) -> None:
        self.actions.append((prepare, True))

    def defer_check(self, failed: Any, error: Callable[..., Exception], evidence: tuple) -> None:
        self.checks.append(_CapturedCheck(self, failed, error, evidence))

    def record(self, operation: Callable[[], Any], result: Any) -> None:
        raise TypeError("a strict-device array met a CUDA graph capture")

    def before_launch(self, first: bool) -> None:
        """The host actions of one launch; an emulated capture already made the first
        launch's device preparations while it ran."""
        for action, prepares_device in self.actions:
            if not (first and self.emulated and prepares_device):
                action()


class _EmulatedCapture(_Capture):
    """A capture on the strict device: the step runs while it is captured (NumPy cannot
    defer), so that run is the first launch; its operations are recorded for replays."""

    emulated = True

    def __init__(self):
        super().__init__()
        self.operations: list[tuple[Callable[[], Any], Any]] = []

    def device_preparation(self, prepare: Callable[[], None]) -> None:
        with backend.capture_scope(None):  # this run is the first launch: prepare it now
            prepare()
        super().device_preparation(prepare)

    def record(self, operation: Callable[[], Any], result: Any) -> None:
        self.operations.append((operation, result))

    def launch(self) -> None:
        from bigdl_py.strict_device import replay

        for operation, result in self.operations:
            replay(operation, result)


class _CapturedCheck:
    """A check of device data inside a captured step (``device_waits.check``).

    A replay overwrites the arrays of the step before, so the graph keeps on the device the
    number of the first replayed step whose check failed and copies of the check's evidence
    from that step; the host fills in each launch's step number and has the next sync
    point read the record (``error_if_failed``), which then starts over.
    """

    def __init__(self, capture: _Capture, failed: Any, error: Callable[..., Exception], evidence):
        xp = backend.array_module(failed)
        self.error = error
        self.names: dict[int, Any] = {}
        self.needs_reset = True
        self.first_failed = xp.empty((), dtype=np.int64)
        self.step = xp.empty((), dtype=np.int64)
        capture.device_preparation(self._prepare)
        # The captured part: keep this step's number and evidence if it fails first.
        failed_first = failed & (self.first_failed < 0)
        xp.copyto(self.first_failed, self.step, where=failed_first)
        self.kept = []
        for array in evidence:
            kept = xp.empty_like(array)
            xp.copyto(kept, array, where=failed_first)
            self.kept.append(kept)

    def _prepare(self) -> None:
        if self.needs_reset:
            self.first_failed.fill(-1)
            self.needs_reset = False
        number, name = device_waits.current_step()
        self.step.fill(number)
        self.names[number] = name
        device_waits.defer_once(self)

    def error_if_failed(self) -> Exception | None:
        number = int(self.first_failed)  # read at a sync point
        names, self.names, self.needs_reset = self.names, {}, True
        if number < 0:
            return None
        return device_waits.name_step(self.error(*self.kept), names.get(number, ""))


# --- a captured step --------------------------------------------------------------------------


class _Graph:
    """One captured step: its static input buffers, its outputs, its capture's host
    actions, and what it must keep alive (the memory pool, the arrays it touches)."""

    def __init__(self, capture: _Capture, inputs: list, outputs: Any, launch, keep: tuple):
        self.capture, self.inputs, self.outputs = capture, inputs, outputs
        self._launch = launch
        self._keep = keep
        self._launched = False

    def replay(self, host_inputs: Sequence[np.ndarray], upload: backend.PinnedUpload) -> Any:
        first = not self._launched
        if not first:
            for static, host in zip(self.inputs, host_inputs, strict=True):
                upload.copy(host, static)
        self.capture.before_launch(first)
        if not (first and self.capture.emulated):
            self._launch()
        self._launched = True
        return self.outputs


class _Signature:
    """What :class:`StepGraph` knows of one signature: eager runs so far, its graph, or why
    it cannot have one."""

    __slots__ = ("eager_runs", "graph", "refused")

    def __init__(self):
        self.eager_runs = 0
        self.graph: _Graph | None = None
        self.refused: str | None = None


class StepGraph:
    """Runs a training step eagerly, or captured once and replayed (see the module).

    Parameters
    ----------
    device : Device or str
        Where the step runs: ``cuda`` (CUDA graphs), ``strict`` (emulated graphs) or
        ``cpu`` (always eager).
    enabled : bool, optional
        Capture at all; default: on unless ``BIGDL_PY_CUDA_GRAPHS=0``.
    warmup_steps : int
        Eager runs of each signature before its capture (at least 1: the first run makes
        the state the graph then reads).
    max_graphs : int
        Graphs kept at once; the least recently used goes first (with its memory).
    host_state : callable, optional
        Called before a capture; returns a function that puts back the host state the step
        changes as it runs (random generators), called when the capture fails.
    """

    def __init__(
        self,
        device: backend.Device | str,
        enabled: bool | None = None,
        warmup_steps: int = 1,
        max_graphs: int = 4,
        host_state: Callable[[], Callable[[], None]] | None = None,
    ):
        if int(warmup_steps) < 1:
            raise ValueError(f"StepGraph: warmup_steps must be >= 1, got {warmup_steps!r}")
        if int(max_graphs) < 1:
            raise ValueError(f"StepGraph: max_graphs must be >= 1, got {max_graphs!r}")
        self.device = backend.device(device)
        wanted = enabled_by_environment() if enabled is None else bool(enabled)
        self.mode = self.device.type if wanted and self.device.type != "cpu" else "eager"
        self.warmup_steps = int(warmup_steps)
        self.max_graphs = int(max_graphs)
        self.host_state = host_state
        self._signatures: OrderedDict[Hashable, _Signature] = OrderedDict()
        #: Steps run so far: captured (each then launched once), replayed, run eagerly.
        self.counts = {"captured": 0, "replayed": 0, "eager": 0}
        #: Why each signature that runs eagerly could not be captured.
        self.refusals: dict[Hashable, str] = {}
        self._upload = backend.PinnedUpload()
        self._join = None
        if self.mode == "cuda":
            self._join = backend.StreamJoin(backend.new_stream(self.device))

    @property
    def enabled(self) -> bool:
        """Whether steps may be captured here (a device, and graphs not switched off)."""
        return self.mode != "eager"

    def graphs_held(self) -> int:
        """How many graphs are held now."""
        return sum(entry.graph is not None for entry in self._signatures.values())

    def reset(self) -> None:
        """Drop every graph and what it holds (the state it reads was replaced: a
        checkpoint loaded); each signature warms up and is captured again."""
        self._signatures.clear()

    def run(self, step: Callable[..., Any], inputs: Sequence[np.ndarray], key: Hashable = ()):
        """``step(*device_inputs)`` on ``inputs`` (host arrays) copied to the device: eagerly,
        captured, or replayed. ``key`` holds whatever else the captured work depends on
        (the model's training flags, the optimizer); the inputs' shapes and dtypes are
        added to it. Returns what ``step`` returns: on a replay the same arrays each time,
        overwritten by the next call (copy what must outlive it before then)."""
        if self.mode == "eager":
            return self._eager(step, inputs)
        inputs = [np.asarray(array) for array in inputs]
        signature = (key, tuple((array.shape, array.dtype.str) for array in inputs))
        entry = self._entry(signature)
        with self.device.activate(), self._on_stream():
            if entry.graph is not None:
                self.counts["replayed"] += 1
                return entry.graph.replay(inputs, self._upload)
            if entry.refused is None and entry.eager_runs >= self.warmup_steps:
                self._make_room()
                entry.graph = self._capture(step, inputs, entry)
                if entry.graph is not None:
                    self.counts["captured"] += 1
                    return entry.graph.replay(inputs, self._upload)
                self.refusals[signature] = entry.refused
            entry.eager_runs += 1
            return self._eager(step, inputs)

    # --- internals ------------------------------------------------------------------------

    def _entry(self, signature: Hashable) -> _Signature:
        entry = self._signatures.get(signature)
        if entry is None:
            entry = self._signatures[signature] = _Signature()
        self._signatures.move_to_end(signature)
        return entry

    def _make_room(self) -> None:
        """Drop the least recently used graphs until another fits."""
        held = [entry for entry in self._signatures.values() if entry.graph is not None]
        for entry in held[: max(0, len(held) - self.max_graphs + 1)]:
            entry.graph = None

    def _on_stream(self):
        return contextlib.nullcontext() if self._join is None else self._join.scope()

    def _eager(self, step: Callable[..., Any], inputs: Sequence[np.ndarray]) -> Any:
        self.counts["eager"] += 1
        return step(*(backend.to_device(array, self.device) for array in inputs))

    def _capture(self, step: Callable[..., Any], inputs: list, entry: _Signature):
        """The graph of ``step`` on static buffers holding ``inputs``, or None (the reason
        kept in ``entry.refused``) when the step cannot be captured."""
        on_cuda = self.mode == "cuda"
        capture = _Capture() if on_cuda else _EmulatedCapture()
        pool = backend.new_memory_pool() if on_cuda else None
        restore = self.host_state() if self.host_state is not None else None
        xp = self.device.xp
        with _allocating(pool):
            statics = [xp.empty(array.shape, dtype=array.dtype) for array in inputs]
        for static, array in zip(statics, inputs, strict=True):
            self._upload.copy(array, static)
        stream = self._join.stream if on_cuda else None
        try:
            with (
                _allocating(pool),
                backend.capture_scope(capture),
                device_waits.no_device_waits(),
            ):
                if on_cuda:
                    backend.begin_capture(stream)
                try:
                    outputs = step(*statics)
                    graph = backend.end_capture(stream) if on_cuda else None
                finally:
                    if on_cuda:
                        backend.abandon_capture(stream)  # after an error: still capturing
        except Exception as error:  # any failure: the step runs eagerly (and raises again)
            if restore is not None:
                restore()
            entry.refused = f"{type(error).__name__}: {error}"
            logger.warning(
                "a training step of inputs %s cannot be captured in a CUDA graph; it runs "
                "eagerly (%s)",
                [array.shape for array in inputs],
                entry.refused,
            )
            return None
        launch = (lambda: graph.launch(stream)) if on_cuda else capture.launch
        return _Graph(capture, statics, outputs, launch, (pool, graph))


def _allocating(pool: Any):
    return contextlib.nullcontext() if pool is None else backend.allocating_from(pool)
