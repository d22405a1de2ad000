"""Fashion-MNIST from local IDX files (Debian's ``dataset-fashion-mnist`` or a directory).

Nothing is downloaded: the files come from, in this order, the ``directory`` argument, the
``$BIGDL_PY_DATA`` directory (``$BIGDL_PY_DATA/fashion-mnist`` or ``$BIGDL_PY_DATA``
itself), or Debian's package in ``/usr/share/datasets/fashion-mnist``.
"""

from __future__ import annotations

import os

import numpy as np

from bigdl_py.data.idx import load_mnist, mnist_file

DEBIAN_DIRECTORY = "/usr/share/datasets/fashion-mnist"
DATA_ENVIRONMENT_VARIABLE = "BIGDL_PY_DATA"

#: Mean and standard deviation of the training images scaled to [0, 1].
FASHION_MNIST_MEAN = 0.2860
FASHION_MNIST_STD = 0.3530

FASHION_MNIST_CLASSES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)


def fashion_mnist_search_path(directory: str | os.PathLike | None = None) -> list[str]:
    """The directories searched, in order. An explicit ``directory`` is the only one
    searched, so a typo never silently falls back to another copy."""
    if directory is not None:
        return [os.fspath(directory)]
    candidates = []
    data_root = os.environ.get(DATA_ENVIRONMENT_VARIABLE)
    if data_root:
        candidates += [os.path.join(data_root, "fashion-mnist"), data_root]
    candidates.append(DEBIAN_DIRECTORY)
    return candidates


def find_fashion_mnist(split: str = "train", directory: str | os.PathLike | None = None) -> str:
    """The first directory of the search path holding the images and labels of ``split``.

    Raises
    ------
    FileNotFoundError
        Listing every directory searched and how to install the data.
    """
    searched = fashion_mnist_search_path(directory)
    for candidate in searched:
        if all(mnist_file(candidate, split, kind) for kind in ("images", "labels")):
            return candidate
    places = "\n".join(f"  {place}" for place in searched)
    raise FileNotFoundError(
        f"Fashion-MNIST {split} files not found. Looked in:\n{places}\n"
        "Install them with `sudo apt-get install dataset-fashion-mnist` (files land in "
        f"{DEBIAN_DIRECTORY}), or put the four *-ubyte.gz files in a directory and pass it "
        f"(directory=... / --data DIR) or set ${DATA_ENVIRONMENT_VARIABLE}."
    )


def fashion_mnist_raw(
    split: str = "train", directory: str | os.PathLike | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The raw arrays of a Fashion-MNIST split.

    Returns
    -------
    images : numpy.ndarray
        uint8, shape ``(N, 28, 28)`` (N = 60000 for train, 10000 for test).
    labels : numpy.ndarray
        int64 class indices in [0, 10); names in ``FASHION_MNIST_CLASSES``.
    """
    return load_mnist(find_fashion_mnist(split, directory), split)


def fashion_mnist(
    split: str = "train", directory: str | os.PathLike | None = None, normalize: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """A Fashion-MNIST split ready for ``ArrayDataset(features, labels)``.

    Parameters
    ----------
    split : {'train', 'test'}
    directory : str or path-like, optional
        Where the IDX files are; by default ``$BIGDL_PY_DATA`` then Debian's directory.
    normalize : bool
        Standardise with the *training-set* statistics (mean 0.2860, std 0.3530), for both
        splits; when ``False`` the pixels are only scaled to [0, 1].

    Returns
    -------
    features : numpy.ndarray
        float32, shape ``(N, 1, 28, 28)``.
    labels : numpy.ndarray
        int64, shape ``(N,)``.
    """
    images, labels = fashion_mnist_raw(split, directory)
    features = images.astype(np.float32)[:, None]
    # In place: the training set as float32 is 188 MB, so avoid temporaries.
    features *= np.float32(1.0 / 255.0)
    if normalize:
        features -= np.float32(FASHION_MNIST_MEAN)
        features /= np.float32(FASHION_MNIST_STD)
    return features, labels
