"""The records labelled data comes in: one rule for training and validation."""

from __future__ import annotations

import numpy as np
import pytest

from bigdl_py.data import MiniBatch, Sample
from bigdl_py.data.records import labelled_batches, labelled_record

FEATURES = np.arange(26 * 3, dtype=np.float32).reshape(26, 3)
LABELS = np.arange(26) % 4


def test_each_kind_comes_as_a_sample_or_a_minibatch():
    sample = Sample(FEATURES[0], LABELS[0])
    batch = MiniBatch(FEATURES[:4], LABELS[:4])
    assert labelled_record(sample, "here") is sample
    assert labelled_record(batch, "here") is batch
    pair = labelled_record((FEATURES[1], LABELS[1]), "here")
    assert isinstance(pair, Sample)
    np.testing.assert_array_equal(pair.features[0], FEATURES[1])
    assert pair.label == LABELS[1]


@pytest.mark.parametrize(
    "record, error, message",
    [
        ("row", TypeError, r"partition 1, record 4: validation records must be Samples, \(f"),
        ((1, 2, 3), TypeError, "got tuple"),
        (Sample(FEATURES[0]), ValueError, "validation Sample has no label"),
        ((FEATURES[0], None), ValueError, "validation Sample has no label"),
        (MiniBatch(FEATURES[:2]), ValueError, "validation MiniBatch has no label"),
        (([1.0, 2.0], 0), TypeError, "list of 2 numbers"),
    ],
)
def test_other_records_are_refused_naming_where(record, error, message):
    with pytest.raises(error, match=message):
        labelled_record(record, "partition 1, record 4", "validation")


def test_batches_keep_the_order_and_the_size_of_every_kind():
    pairs = list(zip(FEATURES, LABELS, strict=True))
    records = [
        *[Sample(x, y) for x, y in pairs[:5]],
        MiniBatch(FEATURES[5:16], LABELS[5:16]),  # after the 5 Samples, cut into 4, 4, 3
        *pairs[16:26],
    ]
    batches = list(labelled_batches(records, 4, "partition 0"))
    assert [batch.size for batch in batches] == [4, 1, 4, 4, 3, 4, 4, 2]
    np.testing.assert_array_equal(np.concatenate([b.features[0] for b in batches]), FEATURES)
    np.testing.assert_array_equal(np.concatenate([b.labels for b in batches]), LABELS)
    assert list(labelled_batches([], 4, "partition 0")) == []


def test_a_bad_record_is_named_by_its_position():
    records = [(FEATURES[0], LABELS[0]), (FEATURES[1], LABELS[1]), object()]
    with pytest.raises(TypeError, match="partition 3, record 2: validation records"):
        list(labelled_batches(records, 2, "partition 3"))
