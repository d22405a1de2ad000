"""Model save/load: architecture as JSON plus weights, no pickle, no code run on load."""

from __future__ import annotations

import json
import os
import sys
import zipfile

import numpy as np
import pytest

from bigdl_py import nn
from bigdl_py.autograd import Tensor
from bigdl_py.nn import serialization


def lenet(dtype=None):
    return nn.Sequential(
        nn.Conv2d(1, 6, 5, dtype=dtype),
        nn.Tanh(),
        nn.MaxPool2d(2),
        nn.Conv2d(6, 12, 5, dtype=dtype),
        nn.Tanh(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(192, 100, dtype=dtype),
        nn.Tanh(),
        nn.Dropout(0.5),
        nn.Linear(100, 10, dtype=dtype),
        nn.LogSoftmax(),
    )


def outputs(model, inputs):
    model.eval()
    return model(Tensor(inputs)).numpy()


@pytest.fixture
def images(rng):
    return rng.normal(size=(4, 1, 28, 28)).astype(np.float32)


def test_lenet_round_trips_with_equal_outputs(tmp_path, images):
    model = lenet()
    path = tmp_path / "lenet.bigdl"
    nn.save(model, path)
    loaded = nn.load(path)
    assert type(loaded) is nn.Sequential and repr(loaded) == repr(model)
    np.testing.assert_array_equal(outputs(loaded, images), outputs(model, images))
    assert list(loaded.state_dict()) == list(model.state_dict())


def test_the_file_is_an_npz_of_weights_plus_readable_json(tmp_path):
    model = lenet()
    path = tmp_path / "lenet.bigdl"
    nn.save(model, path)
    weights = np.load(path, allow_pickle=False)
    np.testing.assert_array_equal(weights["0.weight"], model.state_dict()["0.weight"])
    architecture = json.loads(weights["architecture.json"])
    assert architecture["format"] == "bigdl_py.model"
    layers = architecture["model"]["args"]
    assert [layer["__module__"]["class"] for layer in layers][:3] == ["Conv2d", "Tanh", "MaxPool2d"]
    assert layers[0]["__module__"]["args"] == [1, 6, 5]


def test_nested_named_containers_training_flags_and_shared_modules(tmp_path, rng):
    shared = nn.Linear(3, 3)
    model = nn.Sequential(
        {"encoder": nn.Sequential(nn.Linear(4, 3), nn.ReLU()), "shared": shared, "again": shared}
    )
    model.eval()
    nn.save(model, tmp_path / "m")
    loaded = nn.load(tmp_path / "m")
    assert loaded.shared is loaded.again  # one module, referenced twice
    assert not loaded.training and not loaded.encoder[0].training
    inputs = rng.normal(size=(2, 4)).astype(np.float32)
    np.testing.assert_array_equal(outputs(loaded, inputs), outputs(model, inputs))


def test_a_graph_model_round_trips(tmp_path, rng):
    a, b = nn.Input(shape=(4,), name="a"), nn.Input(shape=(3,), name="b")
    shared = nn.Linear(4, 5)
    left = nn.Tanh()(shared(a))
    right = nn.Tanh()(shared(nn.Linear(3, 4)(b)))
    model = nn.Model(inputs=[a, b], outputs=[nn.Linear(10, 2)(nn.Concat(1)([left, right])), left])
    nn.save(model, tmp_path / "graph")
    loaded = nn.load(tmp_path / "graph")
    x = Tensor(rng.normal(size=(2, 4)).astype(np.float32))
    y = Tensor(rng.normal(size=(2, 3)).astype(np.float32))
    for expected, actual in zip(model(x, y), loaded(x, y), strict=True):
        np.testing.assert_array_equal(actual.numpy(), expected.numpy())


def test_saved_dtypes_survive_even_after_a_cast(tmp_path, images):
    model = lenet().double()
    nn.save(model, tmp_path / "m")
    loaded = nn.load(tmp_path / "m")
    assert all(parameter.dtype == np.float64 for parameter in loaded.parameters())
    np.testing.assert_array_equal(
        outputs(loaded, images.astype(np.float64)), outputs(model, images.astype(np.float64))
    )


def test_loading_does_not_disturb_the_seeded_initialisation_stream(tmp_path):
    nn.save(lenet(), tmp_path / "m")
    nn.init.manual_seed(3)
    expected = nn.Linear(5, 5).weight.numpy()
    nn.init.manual_seed(3)
    nn.load(tmp_path / "m")
    np.testing.assert_array_equal(nn.Linear(5, 5).weight.numpy(), expected)


class Scaled(nn.Module):
    def __init__(self, inner: nn.Module, factor: float = 2.0):
        super().__init__()
        self.inner = inner
        self.factor = factor

    def forward(self, x):
        return self.inner(x) * self.factor


def test_user_classes_must_be_registered_and_then_round_trip(tmp_path, rng):
    model = Scaled(nn.Linear(3, 2), factor=float("inf"))
    with pytest.raises(TypeError, match="register_module\\(Scaled\\)"):
        nn.save(model, tmp_path / "m")
    assert not os.path.exists(tmp_path / "m")
    nn.register_module(Scaled)
    model = Scaled(nn.Linear(3, 2), factor=0.5)
    nn.save(model, tmp_path / "m")
    loaded = nn.load(tmp_path / "m")
    assert isinstance(loaded, Scaled) and loaded.factor == 0.5
    inputs = rng.normal(size=(2, 3)).astype(np.float32)
    np.testing.assert_array_equal(outputs(loaded, inputs), outputs(model, inputs))


def test_register_module_refuses_clashes_and_non_modules():
    nn.register_module(Scaled, name="test.Scaled")
    nn.register_module(Scaled, name="test.Scaled")  # the same class again is fine

    class Other(nn.Module):
        pass

    with pytest.raises(ValueError, match="'test.Scaled' already names"):
        nn.register_module(Other, name="test.Scaled")
    with pytest.raises(TypeError, match="expects a Module subclass"):
        nn.register_module(dict)


def test_arguments_that_are_not_plain_values_are_refused_at_save(tmp_path):
    nn.register_module(Scaled)
    with pytest.raises(TypeError, match="cannot save Scaled: a constructor argument of type"):
        nn.save(Scaled(nn.Linear(2, 2), factor=lambda x: x), tmp_path / "m")


def crafted(path, model_config, arrays=None):
    architecture = {"format": "bigdl_py.model", "version": 1, "model": model_config}
    with open(path, "wb") as file:
        serialization.write_npz(
            file, arrays or {}, {"architecture.json": json.dumps(architecture).encode()}
        )


@pytest.mark.parametrize("name", ["os.system", "subprocess.Popen", "crafted_module_xyz.Evil"])
def test_a_crafted_file_naming_an_unknown_class_raises_without_importing(tmp_path, name):
    path = tmp_path / "evil.bigdl"
    crafted(path, {"class": name, "id": 0, "args": ["echo pwned"], "kwargs": {}})
    with pytest.raises(ValueError, match=f"unknown module class '{name}'"):
        nn.load(path)
    assert "crafted_module_xyz" not in sys.modules


def test_a_crafted_nested_class_is_refused_too(tmp_path):
    path = tmp_path / "evil.bigdl"
    inner = {"__module__": {"class": "builtins.eval", "id": 1, "args": ["1"], "kwargs": {}}}
    crafted(path, {"class": "Sequential", "id": 0, "args": [inner], "kwargs": {}})
    with pytest.raises(ValueError, match="unknown module class 'builtins.eval'"):
        nn.load(path)


def test_a_malformed_architecture_is_a_value_error_naming_the_file(tmp_path):
    path = tmp_path / "odd.bigdl"
    crafted(path, {"class": "Linear", "args": [3, 2]})  # no "id"
    with pytest.raises(ValueError, match="odd.bigdl: cannot rebuild the stored architecture"):
        nn.load(path)
    crafted(path, {"class": "Linear", "id": 0, "args": [3], "kwargs": {}})  # too few arguments
    with pytest.raises(ValueError, match="cannot rebuild.*out_features"):
        nn.load(path)


def test_pickled_arrays_are_refused(tmp_path):
    path = tmp_path / "pickled.bigdl"
    with zipfile.ZipFile(path, "w") as archive:
        with archive.open("0.weight.npy", "w") as member:
            np.lib.format.write_array(member, np.array([object()], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match="corrupt or truncated"):
        nn.load(path)


def test_truncated_and_foreign_files_are_named_in_the_error(tmp_path):
    path = tmp_path / "lenet.bigdl"
    nn.save(lenet(), path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=f"{path} is corrupt or truncated"):
        nn.load(path)
    foreign = tmp_path / "weights.npz"
    np.savez(foreign, w=np.zeros(3))
    with pytest.raises(ValueError, match="is not a bigdl_py model file"):
        nn.load(foreign)


def test_weights_that_do_not_fit_are_reported(tmp_path):
    path = tmp_path / "m"
    crafted(
        path,
        {"class": "Linear", "id": 0, "args": [3, 2], "kwargs": {}},
        {"weight": np.zeros((5, 5), np.float32), "bias": np.zeros(2, np.float32)},
    )
    with pytest.raises(ValueError, match="weights do not fit the architecture.*weight"):
        nn.load(path)


def test_a_failed_save_leaves_the_previous_file_intact(tmp_path, monkeypatch):
    path = tmp_path / "m"
    nn.save(nn.Linear(2, 2), path)
    before = path.read_bytes()

    def broken(file, arrays, extra_members=None):
        file.write(b"half a file")
        raise OSError("disk full")

    monkeypatch.setattr(serialization, "write_npz", broken)
    with pytest.raises(OSError, match="disk full"):
        nn.save(nn.Linear(2, 2), path)
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["m"]


@pytest.mark.gpu
def test_load_onto_a_gpu(tmp_path, images):
    from bigdl_py import backend

    if not backend.cuda_available():
        pytest.skip("no CUDA device")
    model = lenet()
    nn.save(model, tmp_path / "m")
    loaded = nn.load(tmp_path / "m", device="cuda")
    assert all(p.device.type == "cuda" for p in loaded.parameters())
    np.testing.assert_allclose(
        backend.as_numpy(outputs(loaded, backend.to_device(images, "cuda"))),
        outputs(model, images),
        rtol=1e-4,
        atol=1e-5,
    )
