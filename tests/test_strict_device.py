"""The strict device: host memory posing as a GPU that refuses reads inside a step."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from bigdl_py import backend, device_waits
from bigdl_py.strict_device import StrictArray


@pytest.fixture
def values():
    return backend.to_device(np.arange(6, dtype=np.float32).reshape(2, 3), "strict")


def test_the_strict_device_is_a_device_that_takes_the_gpu_route(values):
    assert backend.device("strict") == backend.STRICT
    assert backend.device_of(values) == backend.STRICT
    assert backend.is_device_array(values) and not backend.is_cupy_array(values)
    assert backend.array_module(values) is backend.STRICT.xp
    assert not backend.is_device_array(np.zeros(2))


def test_results_stay_on_the_device_as_cupy_keeps_them(values):
    xp = backend.array_module(values)
    for result in (
        values.sum(),  # a full reduction: a 0-d array, not a host scalar
        values[0, 1],  # one element: a 0-d array too
        xp.exp(values) + 1,
        values.mean(axis=0),
        xp.matmul(values, values.T),
        xp.zeros(3),
        xp.sqrt(2.0),
        values.astype(np.int64).reshape(-1),
        copy.deepcopy(values),
        xp.lib.stride_tricks.as_strided(values, shape=(3, 2), strides=(4, 12)),
    ):
        assert type(result) is StrictArray
    assert [type(row) for row in values] == [StrictArray, StrictArray]
    np.testing.assert_array_equal(backend.as_numpy(values.sum(axis=1)), [3, 12])


def test_writes_go_through_views_and_in_place_operators(values):
    xp = backend.array_module(values)
    target = xp.zeros((2, 3), dtype=np.float32)
    target += values
    target[:, 1] = np.array([5, 6])  # assigning host values copies them over, as in CuPy
    view = target.reshape(-1)
    view[0] = 9
    np.testing.assert_array_equal(target.get(), [[9, 5, 2], [3, 6, 5]])


@pytest.mark.parametrize(
    "read",
    [
        lambda x: bool(x.any()),
        lambda x: float(x.sum()),
        lambda x: int(x.max()),
        lambda x: x.sum().item(),
        lambda x: x.tolist(),
        lambda x: x.get(),
        lambda x: backend.as_numpy(x),
        lambda x: backend.to_device(x, "cpu"),
        lambda x: repr(x),
        lambda x: f"{x.sum():.3f}",
        lambda x: x[x > 1],  # CuPy sizes the result on the host
        lambda x: x.nonzero(),
        lambda x: backend.array_module(x).flatnonzero(x),
        lambda x: backend.array_module(x).unique(x),
        lambda x: backend.array_module(x).where(x > 1),
        lambda x: list(range(10))[x[0, 1].astype(np.int64)],
    ],
)
def test_every_read_back_inside_a_step_raises_and_is_allowed_at_a_sync_point(values, read):
    with device_waits.no_device_waits():
        with pytest.raises(device_waits.DeviceSyncError, match="inside a training step"):
            read(values)
        with device_waits.device_sync_point("test"):
            read(values)
    read(values)  # outside a step every read works


def test_what_never_reads_passes_inside_a_step(values):
    xp = backend.array_module(values)
    with device_waits.no_device_waits():
        mask = values > 1
        chosen = xp.where(mask, values, 0)
        total = chosen.sum() / values.size
        assert values.shape == (2, 3) and len(values) == 2 and values.dtype == np.float32
    assert float(total) == pytest.approx(14 / 6)


def test_implicit_host_conversion_and_mixing_are_refused_as_cupy_refuses_them(values):
    with pytest.raises(TypeError, match="Implicit conversion"):
        np.asarray(values)
    with pytest.raises(TypeError, match="Implicit conversion"):
        np.arange(6.0)[values.astype(np.int64)]
    with pytest.raises(TypeError, match="mix host and device"):
        values + np.ones(3)
    with pytest.raises(TypeError, match="mix host and device"):
        np.ones(3) * values
    assert type(values + np.float32(2)) is StrictArray  # NumPy scalars are fine


def test_the_device_name_is_parsed_and_an_unknown_one_lists_it():
    assert backend.device(" Strict ") == backend.STRICT
    with pytest.raises(ValueError, match="'strict'"):
        backend.device("tpu")
