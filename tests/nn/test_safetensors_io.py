"""PyTorch weights in and out through safetensors: names, dtypes, errors, torch parity."""

from __future__ import annotations

import json
import os
import struct

import numpy as np
import pytest

from bigdl_py import nn
from bigdl_py.autograd import Tensor

safetensors_numpy = pytest.importorskip("safetensors.numpy")


def small_cnn():
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(8, 4, 3),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(4 * 2 * 2, 5),
    )


def torch_small_cnn(torch):
    tnn = torch.nn
    return tnn.Sequential(
        tnn.Conv2d(3, 8, 3, padding=1),
        tnn.BatchNorm2d(8),
        tnn.ReLU(),
        tnn.MaxPool2d(2),
        tnn.Conv2d(8, 4, 3),
        tnn.ReLU(),
        tnn.Flatten(),
        tnn.Linear(4 * 2 * 2, 5),
    )


def evaluate(model, inputs):
    model.eval()
    return model(Tensor(inputs)).numpy()


def train_torch_batch_norm(torch, model, inputs):
    """One training-mode pass so the running statistics are not their initial values."""
    model.train()
    with torch.no_grad():
        model(torch.from_numpy(inputs))
    model.eval()


@pytest.fixture
def images(rng):
    return rng.normal(size=(2, 3, 8, 8)).astype(np.float32)


def test_round_trip_keeps_every_tensor_and_its_dtype(tmp_path, images):
    model = small_cnn()
    model(Tensor(images))  # moves the running statistics and num_batches_tracked
    path = tmp_path / "cnn.safetensors"
    nn.save_safetensors(model, path)
    fresh = small_cnn()
    missing, unexpected = nn.load_safetensors(fresh, path)
    assert (missing, unexpected) == ([], [])
    expected, loaded = model.state_dict(), fresh.state_dict()
    assert list(loaded) == list(expected)
    for name in expected:
        assert loaded[name].dtype == expected[name].dtype, name
        np.testing.assert_array_equal(loaded[name], expected[name], err_msg=name)
    np.testing.assert_array_equal(evaluate(fresh, images), evaluate(model, images))
    assert os.listdir(tmp_path) == ["cnn.safetensors"]  # the temporary file is gone


def test_file_names_are_state_dict_names_and_metadata_says_pytorch(tmp_path):
    model = small_cnn()
    path = tmp_path / "cnn.safetensors"
    nn.save_safetensors(model, path)
    with open(path, "rb") as file:
        (length,) = struct.unpack("<Q", file.read(8))
        header = json.loads(file.read(length))
    assert header.pop("__metadata__") == {"format": "pt"}
    assert set(header) == set(model.state_dict())
    assert header["1.num_batches_tracked"]["dtype"] == "I64"
    assert header["1.num_batches_tracked"]["shape"] == []
    assert header["0.weight"]["dtype"] == "F32"


def test_loads_a_state_dict_pytorch_wrote_and_outputs_match(tmp_path, torch, images):
    safetensors_torch = pytest.importorskip("safetensors.torch")
    torch.manual_seed(0)
    reference = torch_small_cnn(torch)
    train_torch_batch_norm(torch, reference, images)
    path = tmp_path / "torch.safetensors"
    safetensors_torch.save_file(reference.state_dict(), str(path))
    model = small_cnn()
    nn.load_safetensors(model, path)
    with torch.no_grad():
        expected = reference(torch.from_numpy(images)).numpy()
    np.testing.assert_allclose(evaluate(model, images), expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(
        model.state_dict()["1.num_batches_tracked"],
        reference.state_dict()["1.num_batches_tracked"].numpy(),
    )


def test_pytorch_loads_what_bigdl_py_wrote(tmp_path, torch, images):
    safetensors_torch = pytest.importorskip("safetensors.torch")
    model = small_cnn()
    model(Tensor(images))
    path = tmp_path / "bigdl.safetensors"
    nn.save_safetensors(model, path)
    reference = torch_small_cnn(torch)
    reference.load_state_dict(safetensors_torch.load_file(str(path)))
    reference.eval()
    with torch.no_grad():
        expected = reference(torch.from_numpy(images)).numpy()
    np.testing.assert_allclose(evaluate(model, images), expected, rtol=1e-5, atol=1e-5)


def write_state(path, arrays):
    safetensors_numpy.save_file({k: np.asarray(v, order="C") for k, v in arrays.items()}, path)


def test_every_name_and_shape_problem_is_listed_in_one_error(tmp_path):
    model = small_cnn()
    state = model.state_dict()
    del state["0.bias"], state["7.bias"]
    state["4.weight"] = np.zeros((4, 8, 5, 5), np.float32)
    state["extra.weight"] = np.zeros(3, np.float32)
    path = tmp_path / "bad.safetensors"
    write_state(path, state)
    with pytest.raises(ValueError) as raised:
        nn.load_safetensors(small_cnn(), path)
    message = str(raised.value)
    for part in ("0.bias", "7.bias", "extra.weight", "4.weight", "(4, 8, 5, 5)", "(4, 8, 3, 3)"):
        assert part in message


def test_non_strict_skips_missing_and_unexpected_names_and_returns_them(tmp_path):
    source = small_cnn()
    state = source.state_dict()
    del state["7.bias"]
    state["head.weight"] = np.ones(2, np.float32)
    path = tmp_path / "partial.safetensors"
    write_state(path, state)
    model = small_cnn()
    bias_before = model.state_dict()["7.bias"]
    missing, unexpected = nn.load_safetensors(model, path, strict=False)
    assert (missing, unexpected) == (["7.bias"], ["head.weight"])
    np.testing.assert_array_equal(model.state_dict()["0.weight"], state["0.weight"])
    np.testing.assert_array_equal(model.state_dict()["7.bias"], bias_before)


def test_non_strict_still_refuses_a_shape_mismatch(tmp_path):
    state = small_cnn().state_dict()
    state["7.weight"] = np.zeros((5, 3), np.float32)
    path = tmp_path / "shape.safetensors"
    write_state(path, state)
    with pytest.raises(ValueError, match=r"7\.weight: file \(5, 3\) vs model \(5, 16\)"):
        nn.load_safetensors(small_cnn(), path, strict=False)


def test_floats_are_cast_to_the_model_dtype(tmp_path):
    state = {
        name: array.astype(np.float64) if array.dtype == np.float32 else array
        for name, array in small_cnn().state_dict().items()
    }
    path = tmp_path / "double.safetensors"
    write_state(path, state)
    model = small_cnn()
    nn.load_safetensors(model, path)
    loaded = model.state_dict()
    assert loaded["0.weight"].dtype == np.float32
    np.testing.assert_array_equal(loaded["0.weight"], state["0.weight"].astype(np.float32))


def test_bfloat16_is_widened_exactly(tmp_path, torch):
    safetensors_torch = pytest.importorskip("safetensors.torch")
    layer = torch.nn.Linear(3, 2).to(torch.bfloat16)
    path = tmp_path / "bf16.safetensors"
    safetensors_torch.save_file(layer.state_dict(), str(path))
    model = nn.Linear(3, 2)
    nn.load_safetensors(model, path)
    np.testing.assert_array_equal(
        model.weight.numpy(), layer.weight.detach().to(torch.float32).numpy()
    )


def test_integers_into_a_parameter_and_floats_into_a_counter_are_refused(tmp_path):
    state = small_cnn().state_dict()
    state["0.weight"] = state["0.weight"].astype(np.int32)
    state["1.num_batches_tracked"] = np.zeros((), np.float32)
    path = tmp_path / "kinds.safetensors"
    write_state(path, state)
    with pytest.raises(ValueError) as raised:
        nn.load_safetensors(small_cnn(), path)
    message = str(raised.value)
    assert "0.weight: file dtype I32 cannot load into model dtype float32" in message
    assert "1.num_batches_tracked: file dtype F32 cannot load into model dtype int64" in message


def test_a_torch_save_file_is_refused_with_how_to_convert(tmp_path, torch):
    path = tmp_path / "model.pt"
    torch.save(torch.nn.Linear(3, 2).state_dict(), str(path))
    with pytest.raises(ValueError, match="safetensors.torch.save_file") as raised:
        nn.load_safetensors(nn.Linear(3, 2), path)
    assert "zip archive" in str(raised.value)


def test_a_legacy_pickle_is_refused_without_unpickling(tmp_path):
    path = tmp_path / "legacy.pt"
    # A pickle (protocol 2) that would call os.system if it were ever unpickled.
    path.write_bytes(b"\x80\x02cos\nsystem\nq\x00X\x04\x00\x00\x00trueq\x01\x85q\x02Rq\x03.")
    with pytest.raises(ValueError, match="is a pickle.*safetensors.torch.save_file"):
        nn.load_safetensors(nn.Linear(3, 2), path)


def test_a_bigdl_py_model_file_is_refused_as_a_zip(tmp_path):
    path = tmp_path / "model.bigdl"
    nn.save(nn.Linear(3, 2), path)
    with pytest.raises(ValueError, match="zip archive"):
        nn.load_safetensors(nn.Linear(3, 2), path)


def test_a_truncated_file_is_refused(tmp_path):
    path = tmp_path / "cut.safetensors"
    nn.save_safetensors(small_cnn(), path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 10])
    with pytest.raises(ValueError, match="truncated"):
        nn.load_safetensors(small_cnn(), path)
    path.write_bytes(b"\x05\x00")
    with pytest.raises(ValueError, match="too short"):
        nn.load_safetensors(small_cnn(), path)


def test_bad_metadata_raises_and_leaves_the_old_file(tmp_path):
    path = tmp_path / "kept.safetensors"
    nn.save_safetensors(nn.Linear(3, 2), path)
    before = path.read_bytes()
    with pytest.raises(TypeError, match="metadata must map str to str"):
        nn.save_safetensors(nn.Linear(3, 2), path, metadata={"epoch": 3})
    assert path.read_bytes() == before


def save_torch_state(torch, module, path):
    safetensors_torch = pytest.importorskip("safetensors.torch")
    safetensors_torch.save_file(module.state_dict(), str(path))


def test_a_bidirectional_two_layer_lstm_loads_pytorch_weights(tmp_path, torch, rng):
    torch.manual_seed(0)
    reference = torch.nn.LSTM(5, 8, num_layers=2, bidirectional=True, batch_first=True)
    path = tmp_path / "lstm.safetensors"
    save_torch_state(torch, reference, path)
    model = nn.LSTM(5, 8, num_layers=2, bidirectional=True, batch_first=True)
    assert list(model.state_dict()) == list(reference.state_dict())
    nn.load_safetensors(model, path)
    sequence = rng.normal(size=(3, 6, 5)).astype(np.float32)
    output, (hidden, cell) = model(Tensor(sequence))
    with torch.no_grad():
        expected, (expected_hidden, expected_cell) = reference(torch.from_numpy(sequence))
    np.testing.assert_allclose(output.numpy(), expected.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(hidden.numpy(), expected_hidden.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(cell.numpy(), expected_cell.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("layer_name", ["LSTM", "GRU", "RNN"])
def test_recurrent_layers_built_with_defaults_read_pytorchs_time_major_input(
    tmp_path, torch, rng, layer_name
):
    """Issue 27 item 9: both sides built with default arguments agree on (T, N, F)."""
    torch.manual_seed(0)
    reference = getattr(torch.nn, layer_name)(5, 8, num_layers=2)
    path = tmp_path / "recurrent.safetensors"
    save_torch_state(torch, reference, path)
    model = getattr(nn, layer_name)(5, 8, num_layers=2)
    assert model.batch_first is False and reference.batch_first is False
    nn.load_safetensors(model, path)
    steps, batch = 6, 3  # unequal, so reading the axes the other way round cannot pass
    sequence = rng.normal(size=(steps, batch, 5)).astype(np.float32)
    output, final = model(Tensor(sequence))
    with torch.no_grad():
        expected, expected_final = reference(torch.from_numpy(sequence))
    assert output.shape == tuple(expected.shape) == (steps, batch, 8)
    np.testing.assert_allclose(output.numpy(), expected.numpy(), rtol=1e-5, atol=1e-6)
    finals = final if layer_name == "LSTM" else (final,)
    expected_finals = expected_final if layer_name == "LSTM" else (expected_final,)
    for ours, theirs in zip(finals, expected_finals, strict=True):
        np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-5, atol=1e-6)


def test_a_bidirectional_relu_rnn_loads_pytorch_weights(tmp_path, torch, rng):
    torch.manual_seed(0)
    settings = {"num_layers": 2, "nonlinearity": "relu", "bidirectional": True}
    reference = torch.nn.RNN(5, 8, batch_first=True, **settings)
    path = tmp_path / "rnn.safetensors"
    save_torch_state(torch, reference, path)
    model = nn.RNN(5, 8, batch_first=True, **settings)
    assert list(model.state_dict()) == list(reference.state_dict())
    nn.load_safetensors(model, path)
    sequence = rng.normal(size=(3, 6, 5)).astype(np.float32)
    output, hidden = model(Tensor(sequence))
    with torch.no_grad():
        expected, expected_hidden = reference(torch.from_numpy(sequence))
    np.testing.assert_allclose(output.numpy(), expected.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(hidden.numpy(), expected_hidden.numpy(), rtol=1e-5, atol=1e-6)


def test_a_transformer_encoder_loads_pytorch_weights(tmp_path, torch, rng):
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 4, 32, batch_first=True)
    reference = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    path = tmp_path / "encoder.safetensors"
    save_torch_state(torch, reference, path)
    model = nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 4, 32, batch_first=True), 2)
    assert list(model.state_dict()) == list(reference.state_dict())
    nn.load_safetensors(model, path)
    model.eval()
    sequence = rng.normal(size=(2, 7, 16)).astype(np.float32)
    with torch.no_grad():
        expected = reference(torch.from_numpy(sequence)).numpy()
    np.testing.assert_allclose(model(Tensor(sequence)).numpy(), expected, rtol=1e-4, atol=1e-5)


# --- issue 27 item 17: damaged headers are the documented ValueError, naming file and tensor ----
GOOD_ENTRIES = {
    "weight": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
    "bias": {"dtype": "F32", "shape": [2], "data_offsets": [24, 32]},
}


def write_header(path, header, data=bytes(32)):
    """A safetensors file with ``header`` as its JSON header (as a damaged file might hold)."""
    text = json.dumps(header).encode("utf-8")
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)
    return path


def with_entry(name, **fields):
    return {**GOOD_ENTRIES, name: {**GOOD_ENTRIES.get(name, {}), **fields}}


def test_the_handmade_good_header_loads(tmp_path):
    # The damaged headers below each break one rule of this one.
    path = write_header(tmp_path / "good.safetensors", GOOD_ENTRIES)
    assert nn.load_safetensors(nn.Linear(3, 2), path) == ([], [])


@pytest.mark.parametrize(
    "header, message",
    [
        ([1, 2], r"not a safetensors file \(its header is a JSON list, not an object"),
        ("weights", r"not a safetensors file \(its header is a JSON str"),
        (
            with_entry("weight", data_offsets=[0, 20]),
            r"tensor 'weight': its byte range \[0, 20\) holds 20 bytes, but shape \[2, 3\] of F32 "
            r"needs 24",
        ),
        (
            with_entry("bias", data_offsets=[16, 24]),
            r"the byte range \[16, 24\) of tensor 'bias' overlaps tensor 'weight'",
        ),
        (
            with_entry("bias", shape=[1], data_offsets=[28, 32]),
            r"the byte range \[28, 32\) of tensor 'bias' leaves a gap after tensor 'weight'",
        ),
        (
            with_entry("bias", dtype="I64"),
            r"tensor 'bias': its byte range \[24, 32\) holds 8 bytes, but shape \[2\] of I64",
        ),
        (with_entry("bias", shape=[-2]), r"tensor 'bias': 'shape' must be a list of integers"),
        (with_entry("bias", shape=[True, 2]), r"tensor 'bias': 'shape' must be a list"),
        (with_entry("bias", data_offsets=[24.5, 32]), r"tensor 'bias': 'data_offsets' must be"),
        (with_entry("bias", data_offsets=[24, 32, 40]), r"tensor 'bias': 'data_offsets' must be"),
        (with_entry("bias", dtype=5), r"tensor 'bias': 'dtype' must be one of the format's"),
        (with_entry("extra", dtype="Q9", shape=[0], data_offsets=[32, 32]), r"tensor 'extra'"),
        ({**GOOD_ENTRIES, "extra": "x"}, r"tensor 'extra': expected an object, got 'x'"),
        ({**GOOD_ENTRIES, "__metadata__": {"epoch": 3}}, r"'__metadata__' must map strings"),
        ({**GOOD_ENTRIES, "__metadata__": [1]}, r"'__metadata__' must map strings to strings"),
    ],
    ids=[
        "list",
        "string",
        "range_shorter_than_shape",
        "overlap",
        "gap",
        "dtype_wider_than_range",
        "negative_extent",
        "bool_extent",
        "float_offset",
        "three_offsets",
        "dtype_not_a_string",
        "unknown_dtype_of_an_unwanted_tensor",
        "entry_not_an_object",
        "metadata_not_strings",
        "metadata_a_list",
    ],
)
@pytest.mark.parametrize("strict", [True, False])
def test_a_damaged_header_is_a_value_error_naming_file_and_tensor(
    tmp_path, header, message, strict
):
    path = write_header(tmp_path / "damaged.safetensors", header)
    with pytest.raises(ValueError, match=message) as raised:
        nn.load_safetensors(nn.Linear(3, 2), path, strict=strict)
    assert str(path) in str(raised.value)


def test_data_after_the_last_tensor_is_named(tmp_path):
    path = write_header(tmp_path / "long.safetensors", GOOD_ENTRIES, bytes(40))
    with pytest.raises(ValueError, match=r"its tensors end at byte \d+ but the file has") as raised:
        nn.load_safetensors(nn.Linear(3, 2), path)
    assert str(path) in str(raised.value)


def test_a_refusal_by_the_safetensors_library_is_a_value_error_naming_the_file(
    tmp_path, monkeypatch
):
    # Should the library refuse a file the header checks passed (a rule it adds later), the
    # caller still gets the documented ValueError with the file and the tensor being read.
    safetensors = pytest.importorskip("safetensors")
    path = tmp_path / "model.safetensors"
    nn.save_safetensors(nn.Linear(3, 2), path)

    def refusing_open(*args, **kwargs):
        raise safetensors.SafetensorError("Error while deserializing header: a new rule")

    monkeypatch.setattr(safetensors, "safe_open", refusing_open)
    with pytest.raises(ValueError, match="the safetensors library refused the file: .*new rule"):
        nn.load_safetensors(nn.Linear(3, 2), path)
