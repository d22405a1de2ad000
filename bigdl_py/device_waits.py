"""Where the host may wait for a device, and checks that wait for the next place it may.

A GPU runs what the host queued, in order, while the host goes on queuing. Reading device
data back (``bool(x.any())``, ``int(x.max())``, ``float(loss)``, ``.item()``, ``.get()``)
makes the host wait until the device has run everything queued before it: the next step
cannot be queued meanwhile, and the device idles while the host catches up. A training
step must therefore read nothing back. The training loop marks its steps with
:func:`no_device_waits` and the places where it reads on purpose (validation, the end of an
epoch, a checkpoint, the end of training) with :func:`device_sync_point`.

Two things use the marks:

* Checks of device data inside a step (a label out of range on the device, an id outside an
  embedding's rows) do not read it there: :func:`check` keeps the device's
  answer (a 0-d boolean array) with a message and the step it came from, and
  :func:`raise_deferred_checks` reads the answers at the next sync point and raises the
  first failed one, naming its step. Outside a step (a user calling a loss directly) the
  check reads at once, as before. Inside a step captured in a CUDA graph the check is
  handed to the capture (``bigdl_py.step_graph``), which keeps on the device the number of
  the first replayed step that failed, and copies of the check's evidence from that step.
* The ``strict`` test device (``bigdl_py.strict_device``) raises :class:`DeviceSyncError`
  on any read of its arrays inside a step, so a test catches a wait the moment it is
  written. CuPy's arrays are not policed (the check would cost every read).

The marks are per thread: Spark's one-task mode trains one replica per thread.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

from bigdl_py import backend


class DeviceSyncError(RuntimeError):
    """Device data was read back to the host inside a training step (a device wait)."""


class _Marks(threading.local):
    """This thread's position: inside how many steps and sync points, and which step."""

    def __init__(self):
        self.modes: list[bool] = []  # innermost last: True in a step, False at a sync point
        self.step_name = ""
        self.step_number = 0
        self.pending: list = []
        self.counter: ReadCount | None = None


_marks = _Marks()


@contextlib.contextmanager
def no_device_waits() -> Iterator[None]:
    """Code inside must not read device data back (a training step); marks nest, the
    innermost one rules (validation's batches inside its sync point are such a region)."""
    modes = _marks.modes
    modes.append(True)
    try:
        yield
    finally:
        modes.pop()


@contextlib.contextmanager
def device_sync_point(reason: str = "") -> Iterator[None]:
    """A place inside :func:`no_device_waits` where the host may wait for the device.

    ``reason`` says why (for readers; e.g. ``"validation"``)."""
    del reason
    modes = _marks.modes
    modes.append(False)
    try:
        yield
    finally:
        modes.pop()


def waits_forbidden() -> bool:
    """Whether the calling thread's innermost mark is a step (not a sync point)."""
    modes = _marks.modes
    return bool(modes) and modes[-1]


class ReadCount:
    """How many reads of device data :func:`counting_reads` saw inside steps."""

    def __init__(self):
        self.reads = 0


@contextlib.contextmanager
def counting_reads() -> Iterator[ReadCount]:
    """Inside the block, a read of device data inside a step is counted instead of raised
    (a measurement: ``bench/gpu.py`` counts the waits a step makes on the strict device)."""
    previous, counter = _marks.counter, ReadCount()
    _marks.counter = counter
    try:
        yield counter
    finally:
        _marks.counter = previous


def check_read(what: str) -> None:
    """Raise :class:`DeviceSyncError` when reading device data (``what``) would make the
    host wait inside a step; the strict device calls this on every read."""
    if waits_forbidden() and _marks.counter is not None:
        _marks.counter.reads += 1
    elif waits_forbidden():
        name = str(_marks.step_name)
        step = f" ({name})" if name else ""
        raise DeviceSyncError(
            f"{what} reads device data back to the host inside a training step{step}: the "
            "host would wait for the device. Keep the value on the device, check it on the "
            "host before the copy, or read it at a sync point (device_waits.check)"
        )


def current_step() -> tuple[int, Any]:
    """The number of the step being queued and its name as :func:`begin_step` got it (not
    formatted: ``str()`` it only to print it)."""
    return _marks.step_number, _marks.step_name


def begin_step(name: Any) -> None:
    """The host starts queuing a new step, named ``str(name)`` (``"iteration 12 (epoch 2,
    batch 3 of 10)"``) in the errors of the checks it defers (formatted only then)."""
    marks = _marks
    marks.step_name = name
    marks.step_number += 1


def step_name() -> str:
    """The name :func:`begin_step` gave the step now being queued (``""``: none)."""
    return str(_marks.step_name)


def step_number() -> int:
    """How many steps this thread has begun (:func:`begin_step`)."""
    return _marks.step_number


class _DeferredCheck:
    """A device answer to read later: ``failed`` (0-d bool array) and how to explain it."""

    __slots__ = ("failed", "error", "evidence", "step_name")

    def __init__(self, failed: Any, error: Callable[..., Exception], evidence: tuple, name: Any):
        self.failed, self.error, self.evidence, self.step_name = failed, error, evidence, name

    def error_if_failed(self) -> Exception | None:
        """Read the answer (a device wait): the error, its message naming the step, or None."""
        if not bool(self.failed):
            return None
        return name_step(self.error(*self.evidence), self.step_name)


def name_step(error: Exception, name: Any) -> Exception:
    """``error`` with ``[in <step name>]`` appended to its message (``name`` "": as is)."""
    name = str(name)
    if name:
        error.args = (f"{error.args[0] if error.args else ''} [in {name}]", *error.args[1:])
    return error


def check(failed: Any, error: Callable[..., Exception], *evidence: Any) -> None:
    """Raise ``error(*evidence)`` when ``failed`` (a boolean, or a 0-d boolean array) is true.

    A host value, or any value outside a step, is read at once. A device value inside a
    step is kept, and read at the next :func:`raise_deferred_checks` (a sync point).
    ``error`` builds the exception; it may read device data (it runs where reading is
    allowed) and is called only when the check failed. ``evidence`` are the device arrays
    its message reads: pass them (rather than reading them from a closure) so that a step
    replayed from a CUDA graph, whose arrays the next replay overwrites, reports the values
    of the step that failed.
    """
    if backend.is_device_array(failed):
        capture = backend.active_capture()
        if capture is not None:
            capture.defer_check(failed, error, evidence)
            return
        if waits_forbidden():
            _marks.pending.append(_DeferredCheck(failed, error, evidence, _marks.step_name))
            return
    if failed:
        raise error(*evidence)


def defer_once(entry: Any) -> None:
    """Have the next :func:`raise_deferred_checks` call ``entry.error_if_failed()`` (an
    exception or None), unless ``entry`` is already waiting for it."""
    pending = _marks.pending
    if not any(waiting is entry for waiting in pending):
        pending.append(entry)


def raise_deferred_checks() -> None:
    """Read the answers of the checks deferred so far (waits for the device) and raise the
    first failed one's error, its message naming the step it came from; forget them all."""
    pending, _marks.pending = _marks.pending, []
    if not pending:
        return
    with device_sync_point("deferred checks"):
        errors = [check.error_if_failed() for check in pending]  # each entry reads once
    first = next((error for error in errors if error is not None), None)
    if first is not None:
        raise first


def discard_deferred_checks() -> None:
    """Forget the checks deferred so far without reading them (a run that failed)."""
    _marks.pending = []
