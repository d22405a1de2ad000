"""backend.keep_freed_memory: freed multi-MB arrays are reused, not faulted in again.

Each check runs in a fresh interpreter: the setting is process-wide and cannot be undone.
"""

import os
import subprocess
import sys

import pytest

import bigdl_py

# The child imports the same bigdl_py as this process.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(bigdl_py.__file__)))

# Touches ten fresh 40 MB arrays after two warm-up ones and prints the minor page faults.
# Under glibc's defaults an array above 32 MB is always a fresh mmap, faulted in again
# (hundreds of faults each, fewer with transparent huge pages).
FAULTS = """
import resource, sys
import numpy as np
from bigdl_py import backend
applied = backend.keep_freed_memory() if sys.argv[1] == "call" else None
def faults(count):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(count):
        array = np.empty(10 << 20, dtype=np.float32)
        array[...] = 1.0
        del array
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
faults(2)
print(applied, faults(10))
"""


def _run(how: str, **environment) -> tuple[str, int]:
    result = subprocess.run(
        [sys.executable, "-c", FAULTS, how],
        env=dict(os.environ, PYTHONPATH=ROOT, **environment),
        capture_output=True,
        text=True,
        check=True,
    )
    applied, faults = result.stdout.split()
    return applied, int(faults)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_kept_memory_comes_back_without_page_faults():
    applied, faults = _run("call")
    assert applied == "True"
    assert faults < 10
    # Opt-in: importing bigdl_py alone leaves glibc's defaults, which fault.
    _, default_faults = _run("import", BIGDL_PY_KEEP_FREED_MEMORY="")
    assert default_faults >= 10
    # ... and the environment variable applies it on import.
    _, opted_in_faults = _run("import", BIGDL_PY_KEEP_FREED_MEMORY="1")
    assert opted_in_faults < 10
