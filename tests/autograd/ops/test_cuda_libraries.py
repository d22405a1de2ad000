"""Finding NVIDIA's libraries and binding handles to streams (``cuda_libraries``), without a
GPU: the search order, the failures a warning names, and when a handle is made and bound."""

from __future__ import annotations

import os
import threading

import pytest

from bigdl_py.autograd.ops import cuda_libraries


def _touch(path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    open(path, "w").close()
    return str(path)


def test_candidates_are_the_named_file_alone(tmp_path, monkeypatch):
    monkeypatch.setenv("SOME_LIBRARY", "/opt/mine/libcudnn.so.9")
    wheel = _touch(tmp_path / "site" / "nvidia/cudnn/lib/libcudnn.so.9")
    paths = cuda_libraries.candidate_paths(
        "SOME_LIBRARY", ("nvidia/cudnn/lib/libcudnn.so.9",), "libcudnn.so.9", [str(tmp_path)]
    )
    assert paths == ["/opt/mine/libcudnn.so.9"]
    assert wheel not in paths


def test_candidates_are_the_wheels_in_order_then_the_soname(tmp_path, monkeypatch):
    monkeypatch.delenv("SOME_LIBRARY", raising=False)
    first, second = tmp_path / "first", tmp_path / "second"
    cu13 = _touch(first / "nvidia/cu13/lib/libcublas.so.13")
    old_layout = _touch(second / "nvidia/cublas/lib/libcublas.so.13")
    paths = cuda_libraries.candidate_paths(
        "SOME_LIBRARY",
        ("nvidia/cu13/lib/libcublas.so.13", "nvidia/cublas/lib/libcublas.so.13"),
        "libcublas.so.13",
        [str(first), str(second), str(first)],
    )
    assert paths == [cu13, old_layout, "libcublas.so.13"]


def test_a_missing_wheel_leaves_the_linker_search(tmp_path, monkeypatch):
    monkeypatch.delenv("SOME_LIBRARY", raising=False)
    paths = cuda_libraries.candidate_paths(
        "SOME_LIBRARY", ("nvidia/cudnn/lib/libcudnn.so.9",), "libcudnn.so.9", [str(tmp_path)]
    )
    assert paths == ["libcudnn.so.9"]


def test_load_first_returns_the_first_that_loads_and_names_the_failures():
    def load(path):
        if path != "good":
            raise OSError(f"cannot open {path}")
        return "library"

    library, failures = cuda_libraries.load_first(["bad", "worse", "good", "never"], load)
    assert library == "library"
    assert failures == ["bad: cannot open bad", "worse: cannot open worse"]
    assert cuda_libraries.load_first(["bad"], load) == (None, ["bad: cannot open bad"])


def test_site_directories_exist_and_are_unique():
    directories = cuda_libraries.site_directories()
    assert directories and len(directories) == len(set(directories))
    assert all(os.path.isdir(d) for d in directories)


@pytest.fixture
def fake_cuda(monkeypatch):
    """A current device and stream the test sets, for StreamHandles."""
    state = {"device": 0, "stream": 0}
    monkeypatch.setattr(cuda_libraries, "current_device", lambda: state["device"])
    monkeypatch.setattr(cuda_libraries, "current_stream", lambda: state["stream"])
    return state


def test_a_handle_is_bound_only_when_the_stream_changes(fake_cuda):
    made, bindings = [], []

    def create():
        made.append(len(made) + 100)
        return made[-1]

    handles = cuda_libraries.StreamHandles(create, lambda b, s: bindings.append((b.handle, s)))
    for _ in range(3):
        assert handles.current().handle == 100
    fake_cuda["stream"] = 7
    handles.current()
    handles.current()
    fake_cuda["stream"] = 0
    handles.current()
    assert made == [100]
    assert bindings == [(100, 0), (100, 7), (100, 0)]  # each change once, no call repeats


def test_each_device_and_thread_has_its_own_handle(fake_cuda):
    made = []

    def create():
        made.append(object())
        return made[-1]

    handles = cuda_libraries.StreamHandles(create, lambda bound, stream: None)
    first = handles.current().handle
    fake_cuda["device"] = 1
    second = handles.current().handle
    fake_cuda["device"] = 0
    assert handles.current().handle is first and second is not first
    from_thread = []
    thread = threading.Thread(target=lambda: from_thread.append(handles.current().handle))
    thread.start()
    thread.join()
    assert from_thread[0] is not first
    assert len(made) == 3
