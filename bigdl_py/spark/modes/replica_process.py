"""A replica trained in a forked child process: one-task's replicas beyond the task's own,
and a whole-executor task's (:func:`forward_backward_on_replicas`).

Why processes: the autograd's Python between NumPy calls holds the GIL, so replicas on
threads of one process overlap poorly; with the second replica in a child process a
LeNet-5 step took two thirds of the time it took on a thread (``bench/RESULTS.md``). The
child reads the weights and writes its gradient through shared memory, and the pipe
carries only the share's indices and the loss.

The child is forked from the task's worker with the replica already built (its model, its
memory-mapped data), and serves requests until its pipe closes: when the parent drops the
:class:`ReplicaProcess` (the worker cache lets go of the run), or the parent dies. Its
arithmetic is :func:`bigdl_py.spark.replica.forward_backward`'s on that replica, so the
gradients equal a thread's bit for bit.
"""

from __future__ import annotations

import mmap
import multiprocessing
import pickle
import traceback
import weakref

import numpy as np

from bigdl_py import backend
from bigdl_py.optim.sharding import all_slice_bounds
from bigdl_py.spark import worker
from bigdl_py.spark.replica import Replica, forward_backward

# The parent's ends of every helper's pipe in this process: a child closes its copies of them
# (all inherited through fork), so a helper sees its pipe close when its own parent lets go.
_parent_connections: weakref.WeakSet = weakref.WeakSet()


def processes_available(device: str) -> bool:
    """Whether replicas may run in forked children: host arrays only (a child cannot share a
    GPU context it inherits), and a platform that forks."""
    return device == "cpu" and "fork" in multiprocessing.get_all_start_methods()


def _shared_vector(size: int, dtype) -> np.ndarray:
    """A vector in anonymous shared memory: a forked child sees the parent's writes."""
    dtype = np.dtype(dtype)
    buffer = mmap.mmap(-1, max(1, size * dtype.itemsize))
    return np.frombuffer(buffer, dtype=dtype, count=size)


class ReplicaProcess:
    """``replica`` in a forked child: :meth:`start` sends it a share, :meth:`finish` takes
    back its gradient, summed loss and sample count, as ``forward_backward`` returns them."""

    def __init__(self, replica: Replica):
        flat = replica.flat
        self.partition = replica.partition
        self.weights = _shared_vector(flat.size, flat.dtype)
        self.gradient = _shared_vector(flat.size, flat.dtype)
        context = multiprocessing.get_context("fork")
        self.connection, child_connection = context.Pipe()
        _parent_connections.add(self.connection)
        self.process = context.Process(
            target=_serve,
            args=(replica, child_connection, self.weights, self.gradient),
            name=f"bigdl_py-replica-{replica.partition}",
            daemon=True,
        )
        self.process.start()
        child_connection.close()
        self.requests = 0
        self._closer = weakref.finalize(self, _stop, self.connection, self.process)

    def alive(self) -> bool:
        return self.process.is_alive() and not self.connection.closed

    def start(
        self,
        weights,
        indices,
        batch_size: int,
        iteration: int,
        micro_batches: int,
        frozen,
        rows: tuple | None = None,
    ):
        """Hand the child one forward-backward; it runs while the caller computes its own.
        ``indices`` index the child's replica's data, or, with ``rows`` (``(features,
        labels)``, sent with the request), the rows."""
        self.requests += 1
        self.weights[...] = weights
        request = (
            self.requests,
            np.asarray(indices),
            batch_size,
            iteration,
            micro_batches,
            frozen,
            rows,
        )
        try:
            self.connection.send(request)
        except OSError:  # the child is gone: its pipe is broken
            raise self._died() from None

    def finish(self) -> tuple[np.ndarray, float, int] | BaseException:
        """The started request's ``(gradient, loss_sum, count)``, or the error it raised.

        The gradient is a view of the shared buffer, valid until the next :meth:`start`.
        Replies to earlier requests (left unread when the task stopped early) are skipped.
        """
        while True:
            try:
                number, outcome = self.connection.recv()
            except (EOFError, OSError):
                return self._died()
            if number == self.requests:
                break
        if isinstance(outcome, BaseException):
            return outcome
        loss_sum, count = outcome
        return self.gradient, loss_sum, count

    def _died(self) -> RuntimeError:
        self.close()
        return RuntimeError(
            f"one-task: the process training partition {self.partition}'s replica died "
            f"(exit code {self.process.exitcode}); the task fails and Spark retries it"
        )

    def close(self) -> None:
        self._closer()


def _stop(connection, process) -> None:
    """Close the pipe (the child then returns) and reap the child."""
    connection.close()
    process.join(timeout=5)
    if process.is_alive():
        process.kill()
        process.join()


def _serve(replica: Replica, connection, weights: np.ndarray, gradient: np.ndarray) -> None:
    """The child's loop: one forward-backward per request, until the pipe closes."""
    for inherited in list(_parent_connections):
        inherited.close()
    with backend.blas_threads(1):
        while True:
            try:
                request = connection.recv()
            except (EOFError, OSError):
                return
            number, indices, batch_size, iteration, micro_batches, frozen, rows = request
            try:
                if rows is not None:
                    replica.use_rows(*rows)
                result, loss_sum, count = forward_backward(
                    replica, weights, indices, batch_size, iteration, micro_batches, frozen
                )
                gradient[...] = result
                outcome = (loss_sum, count)
            except Exception as error:  # the parent raises it in the task
                outcome = error
            if isinstance(outcome, BaseException) and not _travels(outcome):
                text = "".join(traceback.format_exception(outcome))
                outcome = RuntimeError(text)  # its text, where the error itself cannot travel
            try:
                connection.send((number, outcome))
            except OSError:  # the parent is gone: nobody waits for the reply
                return


def _travels(error: BaseException) -> bool:
    """Whether ``error`` survives the pipe: some exception classes pickle but cannot be
    rebuilt (their ``__init__`` takes other arguments), which would fail in the parent."""
    try:
        pickle.loads(pickle.dumps(error))
    except Exception:
        return False
    return True


def train_with_helpers(
    helpers,
    pieces,
    train_own,
    weights,
    batch_size: int,
    iteration: int,
    micro_batches: int,
    frozen,
    rows=None,
):
    """Piece 0 on this thread (``train_own(0)``) while each helper process trains its own
    piece (``forward_backward``'s arguments); the results in piece order. ``rows``, when
    given, are each helper's piece's ``(features, labels)``. Every helper's reply is read
    before any error is raised, so none is left in its pipe for the next iteration."""
    rows = rows or [None] * len(helpers)
    for helper, piece, piece_rows in zip(helpers, pieces, rows, strict=True):
        helper.start(weights, piece, batch_size, iteration, micro_batches, frozen, piece_rows)
    try:
        own = train_own(0)
    finally:
        outcomes = [helper.finish() for helper in helpers]
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome
    return [own, *outcomes]


def forward_backward_on_replicas(spec, count: int):
    """A :func:`~bigdl_py.spark.replica.forward_backward` that trains a partition's share on
    ``count`` replicas at once: the task's own and ``count - 1`` helper processes forked
    from it (kept in the worker between tasks), each on a contiguous piece of the share
    with one BLAS thread, their gradients added in piece order. The sum is the share's
    gradient, as micro-batches' is (each piece normalises its own batch); the task's
    replica keeps the running statistics. What a whole-executor task of ``count`` CPUs
    runs: one gradient per executor enters the AllReduce.
    """

    def train(replica, weights, local_indices, batch_size, iteration, micro_batches, frozen):
        if replica.features is None:
            replica.use_host_data()
        key = ("replica helpers", replica.partition, count)
        helpers = worker.lookup(spec.run_id, key)
        if helpers is None or not all(helper.alive() for helper in helpers):
            helpers = [ReplicaProcess(replica) for _ in range(count - 1)]
            worker.store(spec.run_id, key, helpers)
        local_indices = np.asarray(local_indices)
        pieces = [local_indices[a:b] for a, b in all_slice_bounds(len(local_indices), count)]
        # The helpers' pieces travel as rows: the rows the task trains on may have come with
        # its input (no shared disk), which a helper forked earlier never saw.
        rows = [
            (tuple(np.asarray(array[piece]) for array in replica.features), replica.labels[piece])
            for piece in pieces[1:]
        ]
        local = [np.arange(len(piece)) for piece in pieces[1:]]

        def train_own(_):
            gradient, loss_sum, samples = forward_backward(
                replica, weights, pieces[0], batch_size, iteration, micro_batches, frozen
            )
            return np.array(gradient), loss_sum, samples

        with backend.blas_threads(1):
            results = train_with_helpers(
                helpers,
                local,
                train_own,
                weights,
                batch_size,
                iteration,
                micro_batches,
                frozen,
                rows,
            )
        gradient = results[0][0]
        for other, _, _ in results[1:]:
            gradient += other
        return gradient, float(sum(r[1] for r in results)), int(sum(r[2] for r in results))

    return train
