"""``backend.allow_tf32``: TF32 settings for float32 GPU products and cuDNN layers, with
PyTorch's defaults, the start-up environment variables and clear errors."""

from __future__ import annotations

import pytest

from bigdl_py import backend


@pytest.fixture
def fresh_tf32(monkeypatch):
    """Settings read anew from the environment the test sets."""
    monkeypatch.setattr(backend, "_tf32", {})
    for variable in backend.TF32_VARIABLES.values():
        monkeypatch.delenv(variable, raising=False)
    return monkeypatch


def test_defaults_are_pytorchs(fresh_tf32):
    # torch.backends.cuda.matmul.allow_tf32 is False, torch.backends.cudnn.allow_tf32 True
    assert backend.allow_tf32() == {"matmul": False, "cudnn": True}


def test_the_oracle_has_the_same_defaults(fresh_tf32, torch):
    assert torch.backends.cuda.matmul.allow_tf32 is backend.allow_tf32()["matmul"]
    assert torch.backends.cudnn.allow_tf32 is backend.allow_tf32()["cudnn"]


def test_settings_change_and_are_reported(fresh_tf32):
    assert backend.allow_tf32(matmul=True) == {"matmul": True, "cudnn": True}
    assert backend.allow_tf32(cudnn=False) == {"matmul": True, "cudnn": False}
    assert backend.tf32_settings() == {"matmul": True, "cudnn": False}


@pytest.mark.parametrize(("text", "value"), [("1", True), ("on", True), ("No", False)])
def test_environment_variables_set_them_at_start_up(fresh_tf32, text, value):
    fresh_tf32.setenv("BIGDL_PY_TF32_MATMUL", text)
    fresh_tf32.setenv("BIGDL_PY_TF32_CUDNN", text)
    assert backend.allow_tf32() == {"matmul": value, "cudnn": value}


def test_a_bad_environment_value_is_named(fresh_tf32):
    fresh_tf32.setenv("BIGDL_PY_TF32_CUDNN", "maybe")
    with pytest.raises(ValueError, match="BIGDL_PY_TF32_CUDNN='maybe'"):
        backend.allow_tf32()
    fresh_tf32.setenv("BIGDL_PY_TF32_CUDNN", "0")
    assert backend.allow_tf32() == {"matmul": False, "cudnn": False}  # nothing half-read


def test_a_setting_must_be_a_bool(fresh_tf32):
    with pytest.raises(TypeError, match="matmul must be True or False, got 1"):
        backend.allow_tf32(matmul=1)
    assert backend.allow_tf32()["matmul"] is False
