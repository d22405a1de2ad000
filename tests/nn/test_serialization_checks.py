"""Model files are checked, not trusted (issue 16, items 9, 11, 17)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import numpy as np
import pytest

from bigdl_py import nn
from bigdl_py.nn.serialization import ARCHITECTURE_MEMBER, read_npz, write_npz


def _rewrite(path, change_architecture=None, change_arrays=None):
    """Rewrite a saved model file with its architecture or arrays changed (a hand edit)."""
    arrays, members = read_npz(path)
    architecture = json.loads(members[ARCHITECTURE_MEMBER])
    if change_architecture:
        change_architecture(architecture)
    if change_arrays:
        change_arrays(arrays)
    member = json.dumps(architecture).encode("utf-8")
    with open(path, "wb") as file:
        write_npz(file, arrays, {ARCHITECTURE_MEMBER: member})


@pytest.fixture
def saved(tmp_path):
    path = str(tmp_path / "model.bigdl")
    nn.save(nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2)), path)
    return path


@pytest.mark.parametrize("flag", ["false", 0, None])
def test_a_training_flag_that_is_not_a_boolean_is_refused(saved, flag):
    def edit(architecture):
        architecture["model"]["training"] = flag

    _rewrite(saved, edit)
    with pytest.raises(ValueError, match=rf"training={flag!r}; expected true or false"):
        nn.load(saved)


def test_a_saved_evaluation_mode_loads_as_evaluation_mode(saved):
    model = nn.load(saved)
    model.eval()
    nn.save(model, saved)
    assert nn.load(saved).training is False


def test_one_float16_weight_among_float32_is_refused(saved):
    def edit(arrays):
        arrays["2.weight"] = arrays["2.weight"].astype(np.float16)

    _rewrite(saved, change_arrays=edit)
    with pytest.raises(ValueError, match=r"mix floating-point dtypes .*2\.weight is float16"):
        nn.load(saved)


def test_a_whole_model_cast_to_float64_still_loads(saved):
    model = nn.load(saved).double()
    nn.save(model, saved)
    assert nn.load(saved)[0].weight.dtype == np.float64


@pytest.mark.parametrize("size", [20_000, 200_000])
def test_a_small_file_declaring_a_huge_layer_fails_before_allocating(saved, size):
    def edit(architecture):
        architecture["model"]["args"][0]["__module__"]["args"] = [size, size]

    _rewrite(saved, edit)
    started = time.perf_counter()
    refused = "declares (more weights than the file holds|layers too large)"
    with pytest.raises(ValueError, match=refused):
        nn.load(saved)
    # A filled 200000 x 200000 layer would take minutes and 149 GiB; refusing takes no time.
    assert time.perf_counter() - started < 5


def test_loading_leaves_the_users_random_stream_alone(saved):
    nn.init.manual_seed(3)
    expected = nn.init.default_generator().uniform()
    nn.init.manual_seed(3)
    nn.load(saved)
    assert nn.init.default_generator().uniform() == expected


def test_the_projects_own_models_load_without_importing_them_first(tmp_path):
    """A GAN file (train_gan.py's gan.bigdl) loads in a fresh process that imported only nn."""
    from bigdl_py.models.gan import mlp_gan

    path = str(tmp_path / "gan.bigdl")
    nn.save(mlp_gan(8, 16), path)
    code = (
        "import sys; import bigdl_py.nn as nn; "
        "assert 'bigdl_py.models.gan' not in sys.modules; "
        f"print(type(nn.load({path!r})).__name__)"
    )
    completed = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert completed.stdout.strip() == "GAN"
