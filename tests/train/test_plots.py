"""Curves and image grids are written as whole PNG files, through the atomic writer."""

from __future__ import annotations

import os

import numpy as np
import pytest

from bigdl_py.train import TrainSummary, plot_curves, save_image_grid

pytest.importorskip("matplotlib")


def test_an_image_grid_is_a_png_of_the_tiles(tmp_path):
    from matplotlib.image import imread

    images = np.linspace(-1.0, 1.0, 5 * 4 * 3, dtype=np.float32).reshape(5, 1, 4, 3)
    path = save_image_grid(images, tmp_path / "grid.png", columns=2)
    picture = imread(path)
    # 3 rows of 2 tiles, each 4 x 3 pixels with a 2-pixel border
    assert picture.shape[:2] == (3 * (4 + 2) + 2, 2 * (3 + 2) + 2)
    assert os.listdir(tmp_path) == ["grid.png"]


def test_curves_replace_an_older_picture_whole(tmp_path):
    summary = TrainSummary(str(tmp_path / "logs"), "run")
    for step in range(1, 6):
        summary.add_scalar("Loss", 1.0 / step, step)
    summary.flush()
    path = tmp_path / "curves.png"
    path.write_bytes(b"an older picture")
    plot_curves(summary, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(os.listdir(tmp_path)) == ["curves.png", "logs"]
