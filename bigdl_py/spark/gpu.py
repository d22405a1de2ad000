"""Which device a Spark task computes on, from the GPUs Spark's resource scheduling gave it.

With ``spark.executor.resource.gpu.amount`` and ``spark.task.resource.gpu.amount`` set (see
``conf/spark-gpu.conf``), every executor runs ``scripts/get_gpus_resources.sh`` to discover
its GPUs and Spark hands each task the addresses it may use, readable in the task as
``TaskContext.get().resources()["gpu"].addresses``. The discovery script prints CUDA
ordinals as the executor's CUDA runtime numbers them (``0..k-1`` of the devices visible
through ``CUDA_VISIBLE_DEVICES``), so an address is the index to give CuPy as is.

Device requests, as every bigdl_py Spark entry point takes them:

``"cpu"``
    Always the CPU.
``"auto"``
    The task's first GPU when Spark assigned one and CuPy can use it, else the CPU.
``"gpu"`` / ``"cuda"``
    A GPU or an error: the task's first assigned GPU, or ``cuda:0`` where Spark assigns no
    GPUs (local mode, or a cluster without GPU scheduling, where every task shares device 0).
``"cuda:<n>"``
    That device, whatever Spark assigned.
"""

from __future__ import annotations

import warnings
from typing import Any

from bigdl_py import backend

GPU_RESOURCE = "gpu"

_REQUESTS = ("cpu", "auto", "gpu", "cuda")


def check_device_request(requested: str) -> str:
    """``requested`` normalised (``'GPU'`` -> ``'gpu'``), or a ValueError naming the choices.

    Entry points call it on the driver so that a typo fails before any task starts.
    """
    text = str(requested).strip().lower()
    valid = text in _REQUESTS
    if text.startswith("cuda:"):
        backend.device(text)  # raises for a bad index
        valid = True
    if not valid:
        raise ValueError(
            f"unknown device {requested!r}: expected 'cpu', 'auto', 'gpu', 'cuda' or 'cuda:<n>'"
        )
    return text


def task_gpu_addresses(context: Any = None) -> list[str]:
    """The GPU addresses Spark assigned to the running task (empty outside a task).

    Parameters
    ----------
    context : pyspark.TaskContext, optional
        The task's context; by default ``TaskContext.get()``. Anything with a
        ``resources()`` method returning ``{name: ResourceInformation}`` works (tests pass
        a stand-in).

    Returns
    -------
    list of str
        The addresses in the order Spark listed them; ``[]`` on the driver, or when the
        task was given no ``gpu`` resource.
    """
    if context is None:
        from pyspark import TaskContext

        context = TaskContext.get()
        if context is None:
            return []
    gpu = context.resources().get(GPU_RESOURCE)
    return list(gpu.addresses) if gpu is not None else []


def _cuda_ordinal(address: str) -> int:
    """A Spark GPU address as a CUDA device ordinal; a clear error for anything else."""
    text = str(address).strip()
    if not text.isdigit():
        raise ValueError(
            f"Spark assigned GPU address {address!r}, which is not a CUDA device ordinal; the "
            "GPU discovery script (spark.executor.resource.gpu.discoveryScript, see "
            'scripts/get_gpus_resources.sh) must print addresses such as "0", "1"'
        )
    return int(text)


def _missing_cuda_message(requested: str, addresses: list[str]) -> str:
    assigned = f"Spark assigned this task GPU(s) {addresses}, but " if addresses else ""
    return (
        f"device={requested!r} was requested, but {assigned}CuPy cannot use a CUDA device in "
        "this executor's Python (install a GPU extra on every executor, "
        "pip install 'bigdl_py[gpu]' for CUDA 12 or 'bigdl_py[gpu-cuda13]' for CUDA 13, and "
        "check the CUDA driver); use device='cpu' or device='auto' to "
        "run on the CPU instead"
    )


def task_device(requested: str = "auto", context: Any = None) -> str:
    """The device the running task should compute on: ``'cpu'`` or ``'cuda:<n>'``.

    Parameters
    ----------
    requested : str
        ``'cpu'``, ``'auto'``, ``'gpu'`` (or ``'cuda'``), or an explicit ``'cuda:<n>'``; see
        the module docstring for what each means.
    context : pyspark.TaskContext, optional
        The task's context (default ``TaskContext.get()``).

    Returns
    -------
    str

    Raises
    ------
    ValueError
        For an unknown request, or a Spark GPU address that is not an ordinal.
    RuntimeError
        When a GPU is required (``'gpu'``, ``'cuda'``, ``'cuda:<n>'``) but CuPy or CUDA is
        missing in this process.
    """
    text = check_device_request(requested)
    if text == "cpu":
        return "cpu"
    if text.startswith("cuda:"):
        if not backend.cuda_available():
            raise RuntimeError(_missing_cuda_message(requested, []))
        return str(backend.device(text))
    addresses = task_gpu_addresses(context)
    if not backend.cuda_available():
        if text == "auto":
            if addresses:
                warnings.warn(
                    _missing_cuda_message("auto", addresses) + "; running on the CPU",
                    RuntimeWarning,
                    stacklevel=2,
                )
            return "cpu"
        raise RuntimeError(_missing_cuda_message(requested, addresses))
    if addresses:
        return f"cuda:{_cuda_ordinal(addresses[0])}"
    return "cpu" if text == "auto" else "cuda:0"


def bind_task_device(requested: str = "auto", context: Any = None) -> backend.Device:
    """Choose the task's device (:func:`task_device`) and make it CuPy's current device.

    Making it current matters for arrays CuPy creates without an explicit device (in
    library code and in user code alike): they land on the task's GPU, not on GPU 0.

    Returns
    -------
    bigdl_py.backend.Device
    """
    chosen = backend.device(task_device(requested, context))
    if chosen.type == "cuda":
        backend.cupy_module().cuda.Device(chosen.index or 0).use()
    return chosen
