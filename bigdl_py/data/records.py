"""The records labelled data may come in (an RDD's rows, for training and for validation):
``Sample``s, ``(features, label)`` pairs and ``MiniBatch``es.

One rule for every reader of such records, so what training accepts, validation accepts too.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from bigdl_py.data.sample import MiniBatch, Sample

RECORD_KINDS = "Samples, (features, label) pairs or MiniBatches"


def labelled_record(record: Any, where: str, use: str = "training") -> Sample | MiniBatch:
    """One record of labelled data as a ``Sample`` or a ``MiniBatch``.

    Samples and MiniBatches come as they are; a ``(features, label)`` pair becomes a Sample.

    Parameters
    ----------
    record
        The record.
    where : str
        Where it is, for messages (``"partition 2, record 7"``).
    use : str
        What it is for, for messages (``"training"``, ``"validation"``).

    Raises
    ------
    TypeError
        For a record of another kind (a list of numbers as a pair's features included).
    ValueError
        For a Sample, pair or MiniBatch without a label.
    """
    if isinstance(record, MiniBatch):
        labelled = record.labels is not None
    elif isinstance(record, Sample):
        labelled = record.label is not None
    elif isinstance(record, tuple) and len(record) == 2:
        record = Sample(record[0], record[1])
        labelled = record.label is not None
    else:
        raise TypeError(
            f"{where}: {use} records must be {RECORD_KINDS}, got {type(record).__name__}"
        )
    if not labelled:
        raise ValueError(f"{where}: a {use} {type(record).__name__} has no label")
    return record


def labelled_batches(
    records: Iterable, batch_size: int, where: str, use: str = "validation"
) -> Iterator[MiniBatch]:
    """Records of labelled data (:func:`labelled_record`) as MiniBatches of at most
    ``batch_size`` samples, in the records' order.

    Runs of Samples are stacked ``batch_size`` at a time; a MiniBatch record is cut into
    pieces of ``batch_size`` (views), after the Samples before it.
    """
    pending: list[Sample] = []
    for position, record in enumerate(records):
        record = labelled_record(record, f"{where}, record {position}", use)
        if isinstance(record, Sample):
            pending.append(record)
            if len(pending) == batch_size:
                yield MiniBatch.from_samples(pending)
                pending = []
            continue
        if pending:
            yield MiniBatch.from_samples(pending)
            pending = []
        for start in range(0, record.size, batch_size):
            yield record.slice(start, min(start + batch_size, record.size))
    if pending:
        yield MiniBatch.from_samples(pending)
