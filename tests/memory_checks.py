"""A memory bound for tests: the peak of traced allocations inside a block.

Tests bound memory, never wall time: the machines are shared and noisy, so a time bound
fails under load (or passes on a fast machine whatever the code does), while the peak of
allocations is a property of the code alone. tracemalloc sees Python's allocations and
NumPy's array buffers. A plain module (not conftest), so test files import it by name.
"""

from __future__ import annotations

import contextlib
import tracemalloc
from collections.abc import Iterator


@contextlib.contextmanager
def traced_peak() -> Iterator[dict]:
    """The peak of the traced allocations inside the block, in ``peak["bytes"]`` once it
    ends (also when it ends with an error, e.g. inside ``pytest.raises``)."""
    peak: dict = {}
    tracemalloc.start()
    try:
        yield peak
    finally:
        peak["bytes"] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
