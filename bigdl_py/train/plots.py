"""Draw training and validation curves from summary event files to a PNG (matplotlib, Agg)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from bigdl_py.nn.serialization import atomic_write
from bigdl_py.train.summary import Summary, event_files, read_scalars

#: Tags left out by default: they describe speed and settings, not learning.
_NOT_CURVES = ("Throughput", "LearningRate")


def _sources(sources: Any) -> list[tuple[str, str]]:
    """``(label, directory with event files)`` for each summary or directory given.

    A directory without event files stands for its sub-directories that have some, so the
    run directory ``<log_dir>/<app_name>`` gives both its ``train`` and ``validation`` parts.
    """
    if isinstance(sources, (Summary, str, os.PathLike)):
        sources = [sources]
    found = []
    for source in sources:
        if isinstance(source, Summary):
            source.flush()
            found.append((source.kind, source.directory))
            continue
        directory = os.fspath(source)
        if event_files(directory):
            found.append((os.path.basename(os.path.normpath(directory)), directory))
            continue
        children = sorted(
            name
            for name in (os.listdir(directory) if os.path.isdir(directory) else [])
            if event_files(os.path.join(directory, name))
        )
        if not children:
            raise FileNotFoundError(
                f"no TensorBoard event files in {directory} or its sub-directories"
            )
        found.extend((name, os.path.join(directory, name)) for name in children)
    return found


def plot_curves(
    sources: Any,
    path: str | os.PathLike,
    tags: Sequence[str] | None = None,
    title: str | None = None,
) -> str:
    """Plot scalar curves (loss, accuracy, ...) from summaries into one PNG file.

    Parameters
    ----------
    sources : Summary, directory, or a sequence of them
        ``TrainSummary``/``ValidationSummary`` objects, summary directories, or a run
        directory ``<log_dir>/<app_name>`` (its ``train`` and ``validation`` parts).
    path : str or PathLike
        The PNG file to write.
    tags : sequence of str, optional
        Which scalars to draw, one panel each; by default every tag found except
        ``Throughput`` and ``LearningRate``, ``Loss`` first. A tag found in several sources
        (the train and validation ``Loss``) is drawn once per source in its panel.
    title : str, optional
        A title over the figure.

    Returns
    -------
    str
        ``path``.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    curves = [(label, read_scalars(directory)) for label, directory in _sources(sources)]
    if tags is None:
        found = {tag for _, scalars in curves for tag in scalars if tag not in _NOT_CURVES}
        tags = sorted(found, key=lambda tag: (tag != "Loss", tag))
    if not tags:
        raise ValueError("no scalar curves to plot (the summaries are empty)")
    figure = Figure(figsize=(5.0 * len(tags), 3.8), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, len(tags), squeeze=False)[0]
    for axis, tag in zip(axes, tags, strict=True):
        for label, scalars in curves:
            # Write order: a resumed run's record of a step replaces the interrupted one's.
            latest = {step: value for step, value, _ in scalars.get(tag, [])}
            if not latest:
                continue
            steps = sorted(latest)
            values = [latest[step] for step in steps]
            points = steps
            style = "-" if len(points) > 20 else "o-"
            axis.plot(steps, values, style, label=label, markersize=3, linewidth=1.2)
        axis.set_title(tag)
        axis.set_xlabel("iteration")
        axis.grid(True, alpha=0.3)
        if axis.get_legend_handles_labels()[0]:
            axis.legend()
    if title:
        figure.suptitle(title)
    path = os.fspath(path)
    atomic_write(path, lambda handle: figure.savefig(handle, format="png", dpi=100))
    return path


def save_image_grid(
    images: Any, path: str | os.PathLike, columns: int = 8, value_range: tuple = (-1.0, 1.0)
) -> str:
    """Tile grey images ``(N, 1, H, W)`` or ``(N, H, W)`` into one PNG, ``columns`` a row.

    Values are mapped from ``value_range`` to black..white (clipped). The file is written
    to a temporary name and renamed, so a reader never sees half a picture.
    """
    import numpy as np
    from matplotlib.image import imsave

    images = np.asarray(images, dtype=np.float32)
    if images.ndim == 4 and images.shape[1] == 1:
        images = images[:, 0]
    if images.ndim != 3 or len(images) == 0:
        raise ValueError(
            f"save_image_grid wants grey images (N, H, W) or (N, 1, H, W), got {images.shape}"
        )
    low, high = value_range
    images = np.clip((images - low) / (high - low), 0.0, 1.0)
    count, height, width = images.shape
    rows = -(-count // columns)
    grid = np.ones((rows * (height + 2) + 2, columns * (width + 2) + 2), dtype=np.float32)
    for index, image in enumerate(images):
        top = 2 + (index // columns) * (height + 2)
        left = 2 + (index % columns) * (width + 2)
        grid[top : top + height, left : left + width] = image
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    atomic_write(
        path, lambda handle: imsave(handle, grid, cmap="gray", vmin=0.0, vmax=1.0, format="png")
    )
    return path
