"""Data for training: ``Sample``, ``MiniBatch``, in-memory datasets, batch transforms, and
readers for IDX (MNIST, Fashion-MNIST), Parquet and Arrow.

Depends only on NumPy, pyarrow and :mod:`bigdl_py.backend`.
"""

from bigdl_py.data.arrow_io import (
    read_arrow,
    read_arrow_table,
    read_parquet,
    write_arrow,
    write_parquet,
)
from bigdl_py.data.arrow_tables import arrays_to_table, column_to_numpy, table_to_arrays
from bigdl_py.data.dataset import ArrayDataset
from bigdl_py.data.fashion import (
    FASHION_MNIST_CLASSES,
    FASHION_MNIST_MEAN,
    FASHION_MNIST_STD,
    fashion_mnist,
    fashion_mnist_raw,
    find_fashion_mnist,
)
from bigdl_py.data.idx import IDXFormatError, load_mnist, read_idx, write_idx
from bigdl_py.data.sample import MiniBatch, Sample, split_bounds
from bigdl_py.data.seeding import BatchRandom
from bigdl_py.data.transforms import (
    Compose,
    Normalize,
    RandomCrop,
    RandomHorizontalFlip,
    ToFloat,
    Transform,
)

__all__ = [
    "FASHION_MNIST_CLASSES",
    "FASHION_MNIST_MEAN",
    "FASHION_MNIST_STD",
    "ArrayDataset",
    "BatchRandom",
    "Compose",
    "IDXFormatError",
    "MiniBatch",
    "Normalize",
    "RandomCrop",
    "RandomHorizontalFlip",
    "Sample",
    "ToFloat",
    "Transform",
    "arrays_to_table",
    "column_to_numpy",
    "fashion_mnist",
    "fashion_mnist_raw",
    "find_fashion_mnist",
    "load_mnist",
    "read_arrow",
    "read_arrow_table",
    "read_idx",
    "read_parquet",
    "split_bounds",
    "table_to_arrays",
    "write_arrow",
    "write_idx",
    "write_parquet",
]
