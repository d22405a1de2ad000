"""Model files are checked, not trusted (issue 16, items 9, 11, 17; issue 27, items 9, 13, 18)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from memory_checks import traced_peak

from bigdl_py import nn
from bigdl_py.autograd import Tensor
from bigdl_py.nn import serialization
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
    refused = "declares (more weights than the file holds|layers too large)"
    with traced_peak() as peak, pytest.raises(ValueError, match=refused):
        nn.load(saved)
    # 1.6 GB and 160 GB of weights declared; refusing them allocates next to nothing.
    assert peak["bytes"] < 20_000_000


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


# --- issue 27 item 9: files written while recurrent layers were batch-major by default ----------
def test_a_version_1_file_rebuilds_recurrent_layers_with_the_default_of_its_time(tmp_path, rng):
    with nn.init.seeded(0):
        saved_model = nn.ModuleDict(
            {
                "lstm": nn.LSTM(3, 4, batch_first=True),
                "gru": nn.GRU(3, 4, 2, True, False),  # batch_first given, by position
                "bidirectional": nn.LSTM(3, 4, bidirectional=True, batch_first=True),
            }
        )
    path = str(tmp_path / "old.bigdl")
    nn.save(saved_model, path)

    def as_version_1(architecture):
        # What version 1 wrote for nn.LSTM(3, 4) and nn.LSTM(3, 4, bidirectional=True):
        # no batch_first, since True was the default then.
        architecture["version"] = 1
        for _, entry in architecture["model"]["args"][0]["__dict__"]:
            entry["__module__"]["kwargs"].pop("batch_first", None)

    _rewrite(path, as_version_1)
    loaded = nn.load(path)
    assert {name: layer.batch_first for name, layer in loaded.items()} == {
        "lstm": True,
        "gru": False,
        "bidirectional": True,
    }
    batch_major = Tensor(rng.normal(size=(2, 5, 3)).astype(np.float32))
    for name, layer in loaded.items():
        np.testing.assert_array_equal(
            layer(batch_major)[0].numpy(), saved_model[name](batch_major)[0].numpy()
        )


def test_a_current_file_without_batch_first_is_time_major(tmp_path):
    path = str(tmp_path / "new.bigdl")
    nn.save(nn.GRU(3, 4), path)
    assert nn.load(path).batch_first is False


# --- issue 27 item 13: every array building makes is counted -----------------------------------
class _KeepsATable(nn.Module):
    """A user class that allocates its buffer itself, not through bigdl_py's allocators."""

    def __init__(self, size):
        super().__init__()
        self.register_buffer("table", Tensor(np.zeros(size, np.float32)))


def _declare(tmp_path, module, edit_model):
    """A model file of ``module`` whose architecture ``edit_model`` changes, with no arrays."""
    path = str(tmp_path / "declared.bigdl")
    nn.save(module, path)
    _rewrite(path, lambda architecture: edit_model(architecture["model"]), lambda a: a.clear())
    return path


@pytest.mark.parametrize(
    "module, edit_model",
    [
        (nn.GroupNorm(1, 2), lambda model: model.update(args=[1, 200_000_000])),
        (nn.LayerNorm(2), lambda model: model.update(args=[[20_000, 20_000]])),
        (nn.BatchNorm2d(2), lambda model: model.update(args=[200_000_000])),
        (nn.BatchNorm1d(2, affine=False), lambda model: model.update(args=[200_000_000])),
        (nn.InstanceNorm2d(2, track_running_stats=True), lambda m: m.update(args=[200_000_000])),
        (nn.Embedding(2, 2), lambda model: model.update(args=[200_000, 1_000])),
        (nn.LSTM(2, 2), lambda model: model.update(args=[2, 20_000])),
        (
            nn.TransformerEncoder(nn.TransformerEncoderLayer(4, 2, 8), 1),
            lambda model: model["args"].__setitem__(1, 10_000_000),
        ),
    ],
    ids=[
        "group_norm_affine",
        "layer_norm_affine",
        "batch_norm_buffers",
        "batch_norm_buffers_only",
        "instance_norm_buffers",
        "embedding",
        "lstm",
        "encoder_stack",
    ],
)
def test_a_declared_layer_is_refused_before_its_arrays_are_allocated(tmp_path, module, edit_model):
    path = _declare(tmp_path, module, edit_model)
    refused = r"declared\.bigdl: the stored architecture declares more weights than the file holds"
    with traced_peak() as peak, pytest.raises(ValueError, match=refused):
        nn.load(path)
    # Each declares 0.8 GB or more; refusing it allocates next to nothing.
    assert peak["bytes"] < 20_000_000


def test_arrays_a_registered_class_makes_itself_are_counted_when_kept(tmp_path):
    nn.register_module(_KeepsATable)
    path = _declare(tmp_path, _KeepsATable(4), lambda model: model.update(args=[5_000_000]))
    with pytest.raises(ValueError, match="declares more weights than the file holds"):
        nn.load(path)


def test_a_model_with_buffers_and_shared_layers_still_loads(tmp_path):
    shared = nn.Linear(3, 3)
    model = nn.Sequential(shared, nn.BatchNorm1d(3), shared, nn.GroupNorm(1, 3))
    path = str(tmp_path / "ok.bigdl")
    nn.save(model, path)
    loaded = nn.load(path)
    assert loaded[0] is loaded[2]
    assert list(loaded.state_dict()) == list(model.state_dict())


# --- issue 27 item 18: malformed architecture files ----------------------------------------------
def _write_architecture(path, text):
    with open(path, "wb") as file:
        write_npz(file, {}, {ARCHITECTURE_MEMBER: text.encode("utf-8")})


@pytest.mark.parametrize(
    "version, message",
    [
        ('"2"', r"model format version '2' is not a positive integer"),
        ("null", r"model format version None is not a positive integer"),
        ("true", r"model format version True is not a positive integer"),
        ("0", r"model format version 0 is not a positive integer"),
        ("1.0", r"model format version 1.0 is not a positive integer"),
        ("99", r"was written by a newer bigdl_py \(model format version 99"),
    ],
)
def test_a_bad_format_version_is_named(tmp_path, version, message):
    path = str(tmp_path / "model.bigdl")
    model = '{"class": "ReLU", "id": 0, "args": [], "kwargs": {}}'
    _write_architecture(
        path, f'{{"format": "bigdl_py.model", "version": {version}, "model": {model}}}'
    )
    with pytest.raises(ValueError, match=message) as raised:
        nn.load(path)
    assert path in str(raised.value)


@pytest.mark.parametrize(
    "text, message",
    [
        ("[1, 2]", "architecture.json holds a JSON list, not the object nn.save writes"),
        ('"model"', "architecture.json holds a JSON str"),
        ('{"format": "bigdl_py.model", "version": 1, "model": [1]}', "no module object under"),
    ],
)
def test_an_architecture_that_is_not_an_object_is_named(tmp_path, text, message):
    path = str(tmp_path / "model.bigdl")
    _write_architecture(path, text)
    with pytest.raises(ValueError, match=message) as raised:
        nn.load(path)
    assert path in str(raised.value)


def _nested_sequentials(levels: int) -> str:
    """A model file's architecture text: ``levels`` Sequentials, each inside the next."""
    module = '{"class": "ReLU", "id": 0, "args": [], "kwargs": {}}'
    for level in range(1, levels + 1):
        module = f'{{"class": "Sequential", "id": {level}, "args": [{{"__module__": {module}}}]}}'
    return f'{{"format": "bigdl_py.model", "version": 1, "model": {module}}}'


def test_a_deeply_nested_architecture_is_named_not_a_recursion_error(tmp_path):
    # 400 Sequentials, each inside the next: beyond what Python's recursion limit lets the
    # JSON reader (and the rebuilding) descend.
    path = str(tmp_path / "deep.bigdl")
    _write_architecture(path, _nested_sequentials(400))
    with pytest.raises(ValueError, match="architecture.json is nested too deeply") as raised:
        nn.load(path)
    assert path in str(raised.value)


def test_the_nesting_bound_does_not_depend_on_the_recursion_limit(tmp_path):
    # 150 Sequentials (452 levels of JSON) read fine under a raised recursion limit (another
    # library may have raised it); the file is refused all the same, by the fixed bound.
    path = str(tmp_path / "deep.bigdl")
    _write_architecture(path, _nested_sequentials(150))
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(20_000)
    try:
        with pytest.raises(ValueError, match=r"nested too deeply \(\d+ levels of JSON, at most"):
            nn.load(path)
    finally:
        sys.setrecursionlimit(limit)


def test_running_out_of_stack_while_rebuilding_is_named_too(saved, monkeypatch):
    # JSON that read fine can still be too deep to rebuild when load is called from deep in
    # a program's stack; the rebuilding's RecursionError gets the same clear error.
    def too_deep(*args, **kwargs):
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(serialization, "module_from_config", too_deep)
    with pytest.raises(ValueError, match="stored architecture is nested too deeply to rebuild"):
        nn.load(saved)


def test_a_safetensors_file_is_named_as_one_with_the_call_that_loads_it(tmp_path):
    pytest.importorskip("safetensors")
    path = str(tmp_path / "weights.safetensors")
    nn.save_safetensors(nn.Linear(3, 2), path)
    with pytest.raises(
        ValueError, match=r"is a safetensors file .*load_safetensors\(model, path\)"
    ) as raised:
        nn.load(path)
    assert "corrupt" not in str(raised.value)
