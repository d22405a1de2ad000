"""The wire format of array slices: exact round trips, and fp16/bf16 compression bounds."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from bigdl_py.spark import wire

FLOAT16_UNIT_ROUNDOFF = 2.0**-11  # 11 significant bits
BFLOAT16_UNIT_ROUNDOFF = 2.0**-8  # 8 significant bits

array_dtypes = st.sampled_from([np.float16, np.float32, np.float64, np.int32, np.int64, np.uint8])


@settings(max_examples=40, deadline=None)
@given(
    hnp.arrays(
        dtype=array_dtypes,
        shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5),
    ),
    st.sampled_from([4, 5]),
)
def test_uncompressed_round_trip_is_exact_through_pickle(array, protocol):
    payload = pickle.loads(pickle.dumps(wire.encode(array), protocol=protocol))
    decoded = wire.decode(payload)
    assert decoded.dtype == array.dtype
    assert decoded.shape == array.shape
    np.testing.assert_array_equal(decoded, array)


def test_float32_wire_is_the_same_as_no_compression():
    array = np.linspace(-3, 3, 11, dtype=np.float32)
    assert wire.encode(array, "float32").tag == wire.encode(array).tag == "raw"


def test_plain_ndarray_passes_through_decode():
    array = np.arange(4.0)
    assert wire.decode(array) is array


def test_non_contiguous_input_is_encoded_by_value():
    array = np.arange(24, dtype=np.float32).reshape(4, 6)[:, ::2]
    np.testing.assert_array_equal(wire.round_to_wire(array, None), array)


finite_float32 = hnp.arrays(
    np.float32,
    hnp.array_shapes(min_dims=1, max_dims=1, max_side=64),
    elements=st.floats(-6e4, 6e4, width=32, allow_subnormal=False),
)


@settings(max_examples=40, deadline=None)
@given(finite_float32)
def test_float16_wire_error_is_within_half_an_ulp(array):
    decoded = wire.round_to_wire(array, "float16")
    assert decoded.dtype == np.float32
    # float16's relative rounding error is 2**-11; below its normal range the spacing is
    # fixed at 2**-24, so the absolute error there is at most 2**-25.
    bound = np.maximum(np.abs(array) * FLOAT16_UNIT_ROUNDOFF, 2.0**-25)
    assert np.all(np.abs(decoded - array) <= bound)


@settings(max_examples=40, deadline=None)
@given(
    hnp.arrays(
        np.float32,
        hnp.array_shapes(min_dims=1, max_dims=2, max_side=16),
        elements=st.floats(-(2.0**127), 2.0**127, width=32, allow_subnormal=False),
    )
)
def test_bfloat16_wire_error_is_within_half_an_ulp(array):
    decoded = wire.round_to_wire(array, "bfloat16")
    assert decoded.shape == array.shape
    bound = np.abs(array).astype(np.float64) * BFLOAT16_UNIT_ROUNDOFF
    assert np.all(np.abs(decoded.astype(np.float64) - array) <= bound)


def test_bfloat16_rounds_ties_to_even():
    # 1 + 2**-8 lies half-way between bf16 neighbours 1 and 1 + 2**-7: the even one is 1.
    # 1 + 3 * 2**-8 lies half-way between 1 + 2**-7 and 1 + 2**-6: the even one is the latter.
    halfway = np.array([1 + 2.0**-8, 1 + 3 * 2.0**-8, -(1 + 2.0**-8)], dtype=np.float32)
    expected = np.array([1.0, 1 + 2.0**-6, -1.0], dtype=np.float32)
    np.testing.assert_array_equal(wire.round_to_wire(halfway, "bfloat16"), expected)


def test_bfloat16_keeps_nan_inf_and_signed_zero():
    # 0x7F800001 is a NaN whose payload sits in the low bits the rounding drops: the plain
    # formula would round it into the exponent and produce +inf.
    special = np.array([0x7F800001, 0xFF800001, 0x7FC00000], dtype=np.uint32).view(np.float32)
    values = np.concatenate([special, np.array([np.inf, -np.inf, -0.0], dtype=np.float32)])
    decoded = wire.round_to_wire(values, "bfloat16")
    assert np.isnan(decoded[:3]).all()
    assert np.signbit(decoded[1]) and not np.signbit(decoded[0])
    assert decoded[3] == np.inf and decoded[4] == -np.inf
    assert decoded[5] == 0 and np.signbit(decoded[5])


def test_bfloat16_matches_torch_bit_for_bit(torch, rng):
    values = np.concatenate(
        [
            rng.standard_normal(4096).astype(np.float32) * 10.0 ** rng.integers(-30, 30, 4096),
            np.array([1 + 2.0**-8, 1 + 3 * 2.0**-8, 3.3e38, -3.4e38], dtype=np.float32),
        ]
    ).astype(np.float32)
    ours = wire.float32_to_bfloat16_bits(values)
    theirs = torch.from_numpy(values).to(torch.bfloat16).view(torch.int16).numpy()
    np.testing.assert_array_equal(ours, theirs.view(np.uint16))


def test_compressed_payload_carries_half_the_bytes():
    array = np.ones(1000, dtype=np.float32)
    assert wire.encode(array, "float16").nbytes == 2000
    assert wire.encode(array, "bfloat16").nbytes == 2000
    assert len(pickle.dumps(wire.encode(array, "bfloat16"), protocol=5)) < 2200


def test_float64_input_decodes_to_float64():
    array = np.array([1.0, 2.5, -3.25])
    for wire_dtype in ("float16", "bfloat16"):
        decoded = wire.round_to_wire(array, wire_dtype)
        assert decoded.dtype == np.float64
        np.testing.assert_array_equal(decoded, array)  # exactly representable values


def test_compressing_integers_is_an_error():
    with pytest.raises(ValueError, match="floating-point arrays only.*int32"):
        wire.encode(np.arange(3, dtype=np.int32), "float16")


def test_unknown_wire_dtype_is_an_error():
    with pytest.raises(ValueError, match="wire_dtype must be.*'int8'"):
        wire.encode(np.zeros(2, dtype=np.float32), "int8")
