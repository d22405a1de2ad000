"""Marks of training steps and sync points, and checks deferred to the next sync point."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from bigdl_py import backend, device_waits


def test_a_step_forbids_waits_and_a_sync_point_inside_it_allows_them():
    assert not device_waits.waits_forbidden()
    with device_waits.no_device_waits():
        assert device_waits.waits_forbidden()
        with device_waits.device_sync_point("validation"):
            assert not device_waits.waits_forbidden()
        assert device_waits.waits_forbidden()
    assert not device_waits.waits_forbidden()


def test_the_marks_belong_to_one_thread():
    seen = []
    with device_waits.no_device_waits():
        thread = threading.Thread(target=lambda: seen.append(device_waits.waits_forbidden()))
        thread.start()
        thread.join()
    assert seen == [False]


def test_a_check_outside_a_step_raises_at_once():
    failed = backend.to_device(np.array(True), "strict")
    with pytest.raises(IndexError, match="bad id"):
        device_waits.check(failed, lambda: IndexError("bad id"))
    device_waits.check(backend.to_device(np.array(False), "strict"), None)


def test_a_check_inside_a_step_waits_for_the_sync_point_and_names_its_step():
    xp = backend.STRICT.xp
    ids = backend.to_device(np.array([1, 7, 2]), "strict")
    with device_waits.no_device_waits():
        device_waits.begin_step("iteration 3")
        device_waits.check(ids.max() >= 10, lambda: IndexError("never"))
        device_waits.begin_step("iteration 4")
        high = ids.max()
        device_waits.check(high >= 5, lambda: IndexError(f"id {int(high)} >= 5"))
        device_waits.begin_step("")
        with pytest.raises(IndexError, match=r"id 7 >= 5 \[in iteration 4\]"):
            device_waits.raise_deferred_checks()
        device_waits.raise_deferred_checks()  # read once, then forgotten
        device_waits.check(xp.asarray(True), lambda: ValueError("dropped"))
        device_waits.discard_deferred_checks()
        device_waits.raise_deferred_checks()


def test_the_innermost_mark_rules():
    with device_waits.no_device_waits():
        with device_waits.device_sync_point("validation"):
            with device_waits.no_device_waits():  # validation's own batches
                assert device_waits.waits_forbidden()
            assert not device_waits.waits_forbidden()


def test_a_checks_evidence_goes_to_its_error_at_the_sync_point():
    xp = backend.STRICT.xp
    ids = backend.to_device(np.array([3, 12, 5]), "strict")
    with device_waits.no_device_waits():
        device_waits.begin_step("step 4")
        high = ids.max()
        device_waits.check(high >= 10, lambda high: IndexError(f"max {int(high)}"), high)
        ids[...] = xp.zeros(3, dtype=ids.dtype)  # the evidence, not the ids, is read
    with pytest.raises(IndexError, match=r"max 12 \[in step 4\]"):
        device_waits.raise_deferred_checks()


def test_counting_reads_counts_the_reads_inside_steps_instead_of_raising():
    value = backend.to_device(np.arange(3.0), "strict")
    with device_waits.counting_reads() as counter:
        float(value.sum())  # outside a step: no wait to count
        with device_waits.no_device_waits():
            float(value.sum())
            bool(value.any())
            with device_waits.device_sync_point("validation"):
                value.get()
    assert counter.reads == 2
    with device_waits.no_device_waits(), pytest.raises(device_waits.DeviceSyncError):
        float(value.sum())  # the count is over: reads raise again
