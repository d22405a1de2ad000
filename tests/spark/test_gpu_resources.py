"""GPU discovery (scripts/get_gpus_resources.sh) and the task-side device choice (spark/gpu.py).

The script runs for real with a fake ``nvidia-smi`` on PATH; the device choice runs against a
stand-in TaskContext, with CUDA's presence patched where a test needs it either way.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from bigdl_py import backend
from bigdl_py.spark import gpu

REPO = Path(__file__).resolve().parents[2]
DISCOVERY_SCRIPT = REPO / "scripts" / "get_gpus_resources.sh"


def _fake_bin(tmp_path: Path, nvidia_smi_body: str | None) -> Path:
    """A folder for PATH holding the tools the script needs, plus a fake nvidia-smi."""
    folder = tmp_path / "bin"
    folder.mkdir()
    for tool in ("bash", "grep", "tr", "sed"):
        found = subprocess.run(["which", tool], capture_output=True, text=True, check=True)
        (folder / tool).symlink_to(found.stdout.strip())
    if nvidia_smi_body is not None:
        script = folder / "nvidia-smi"
        script.write_text("#!/bin/sh\n" + nvidia_smi_body)
        script.chmod(0o755)
    return folder


def _discover(tmp_path, nvidia_smi_body, visible_devices=None) -> dict:
    env = {"PATH": str(_fake_bin(tmp_path, nvidia_smi_body))}
    if visible_devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible_devices
    done = subprocess.run(
        ["bash", str(DISCOVERY_SCRIPT)], env=env, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


THREE_GPUS = 'if [ "$1" = "--query-gpu=index" ]; then printf "0\\n1\\n2\\n"; else exit 2; fi\n'


def test_discovery_lists_every_gpu_nvidia_smi_reports(tmp_path):
    assert _discover(tmp_path, THREE_GPUS) == {"name": "gpu", "addresses": ["0", "1", "2"]}


def test_discovery_without_nvidia_smi_reports_no_gpu(tmp_path):
    assert _discover(tmp_path, None) == {"name": "gpu", "addresses": []}


def test_discovery_with_a_failing_nvidia_smi_reports_no_gpu(tmp_path):
    failing = 'echo "NVIDIA-SMI has failed because it could not communicate" >&2; exit 9\n'
    assert _discover(tmp_path, failing) == {"name": "gpu", "addresses": []}


@pytest.mark.parametrize(
    ("visible", "addresses"),
    [
        ("2,0", ["0", "1"]),  # CUDA renumbers the visible devices 0..k-1
        ("", []),  # set but empty: no device
        ("1,7,0", ["0"]),  # the list stops at the first index that is not a GPU here
        ("0,-1,1", ["0"]),
        ("GPU-8e1f5c1a-0000,MIG-4f2a", ["0", "1"]),  # UUIDs count as given
    ],
)
def test_discovery_respects_cuda_visible_devices(tmp_path, visible, addresses):
    assert _discover(tmp_path, THREE_GPUS, visible)["addresses"] == addresses


def test_discovery_script_is_executable():
    assert os.access(DISCOVERY_SCRIPT, os.X_OK)


# --- the task side --------------------------------------------------------------------------


class FakeTaskContext:
    """Only what gpu.py reads of a pyspark.TaskContext: ``resources()``."""

    def __init__(self, **resources):
        from pyspark.resource import ResourceInformation

        self._resources = {
            name: ResourceInformation(name, list(addresses))
            for name, addresses in resources.items()
        }

    def resources(self):
        return self._resources


@pytest.fixture
def cuda_present(monkeypatch):
    monkeypatch.setattr(backend, "cuda_available", lambda: True)


@pytest.fixture
def cuda_absent(monkeypatch):
    monkeypatch.setattr(backend, "cuda_available", lambda: False)


def test_task_gpu_addresses_read_the_gpu_resource():
    context = FakeTaskContext(gpu=["3", "1"], fpga=["0"])
    assert gpu.task_gpu_addresses(context) == ["3", "1"]
    assert gpu.task_gpu_addresses(FakeTaskContext(fpga=["0"])) == []


def test_task_gpu_addresses_outside_a_task_are_empty():
    assert gpu.task_gpu_addresses() == []  # the driver has no TaskContext


@pytest.mark.parametrize("request_", ["auto", "gpu", "cuda", "GPU"])
def test_task_device_uses_the_first_assigned_gpu(cuda_present, request_):
    assert gpu.task_device(request_, FakeTaskContext(gpu=["2", "3"])) == "cuda:2"


def test_task_device_without_spark_gpus(cuda_present):
    context = FakeTaskContext()
    assert gpu.task_device("auto", context) == "cpu"
    assert gpu.task_device("gpu", context) == "cuda:0"  # local mode: everyone shares device 0
    assert gpu.task_device("cuda:1", context) == "cuda:1"
    assert gpu.task_device("cpu", FakeTaskContext(gpu=["0"])) == "cpu"


def test_task_device_gpu_required_without_cupy_names_the_setting(cuda_absent):
    with pytest.raises(RuntimeError, match=r"device='gpu'.*\['1'\].*bigdl_py\[gpu\]"):
        gpu.task_device("gpu", FakeTaskContext(gpu=["1"]))
    with pytest.raises(RuntimeError, match="device='cuda:0'"):
        gpu.task_device("cuda:0", FakeTaskContext())


def test_task_device_auto_without_cupy_falls_back_to_cpu(cuda_absent):
    assert gpu.task_device("auto", FakeTaskContext()) == "cpu"
    with pytest.warns(RuntimeWarning, match="assigned this task GPU"):
        assert gpu.task_device("auto", FakeTaskContext(gpu=["0"])) == "cpu"


def test_task_device_rejects_bad_requests_and_addresses(cuda_present):
    with pytest.raises(ValueError, match="unknown device 'tpu'"):
        gpu.task_device("tpu", FakeTaskContext())
    with pytest.raises(ValueError, match="bad device index"):
        gpu.check_device_request("cuda:x")
    with pytest.raises(ValueError, match="discoveryScript"):
        gpu.task_device("gpu", FakeTaskContext(gpu=["GPU-1234"]))


def test_bind_task_device_on_cpu_returns_the_cpu_device():
    assert gpu.bind_task_device("auto", FakeTaskContext()) == backend.CPU
