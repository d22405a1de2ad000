"""Model save/load without pickle: the architecture as JSON, the weights as ``.npy`` arrays.

``save(model, path)`` writes one zip file (the ``.npz`` layout, so ``numpy.load`` reads the
weights too) holding ``architecture.json`` and one ``<dotted name>.npy`` per parameter and
buffer. The architecture is each module's class *name* and the arguments its constructor was
called with (``Module._init_args``), nested modules recursively; a functional-graph
``Model`` stores its wiring (``Model.graph_spec``) and its layers.

``load(path)`` only looks class names up in a registry — every public Module class of
``bigdl_py.nn`` plus the classes registered with :func:`register_module` — and calls those
constructors with the stored plain values. It never imports a module or runs stored code,
so a crafted file can at worst name a class that is not there, which raises.

Files carry a format version. When a constructor default changes, the version goes up and
files of older versions are rebuilt with the old default where they relied on it, so a
saved model behaves as it did (version 2: ``LSTM``/``GRU`` became time-major by default).

The helpers :func:`atomic_write`, :func:`write_npz` and :func:`read_npz` are shared with
training checkpoints (``bigdl_py.train.checkpoint``).
"""

from __future__ import annotations

import contextlib
import inspect
import io
import json
import os
import tempfile
import zipfile
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import IO, Any

import numpy as np

from bigdl_py import backend
from bigdl_py.nn import _build_budget
from bigdl_py.nn._safetensors_header import is_safetensors_file
from bigdl_py.nn.graph import Model as GraphModel
from bigdl_py.nn.module import Module

__all__ = ["load", "register_module", "save"]

FORMAT = "bigdl_py.model"
# 2: LSTM and GRU default to batch_first=False (PyTorch's); version 1 files load as saved.
FORMAT_VERSION = 2
ARCHITECTURE_MEMBER = "architecture.json"
# JSON nesting an architecture may have (objects and lists inside one another). Real models
# stay far below it (a Sequential of blocks of layers is ~15); a fixed bound, rather than
# Python's recursion limit, makes a crafted file fail the same way in every process.
MAX_ARCHITECTURE_NESTING = 300

_registered: dict[str, type] = {}


# --- safe files -----------------------------------------------------------------------------
def atomic_write(
    path: str | os.PathLike, write: Callable[[IO[bytes]], None], *, durable: bool = True
) -> None:
    """Write a file so that ``path`` holds either its old content or the complete new one.

    ``write(file)`` fills a temporary file in the same directory (its name starts with a dot,
    so no pattern of the final names matches it), which is then renamed over ``path``
    (atomic on POSIX). With ``durable`` (models, checkpoints) the file is fsync'ed before the
    rename and the directory after it, so the rename survives a crash; without it (a training
    run's scratch files, rebuilt after a crash anyway) readers still never see a file half
    written, and the write costs no disk flush. On any error the temporary file is removed
    and ``path`` is untouched.

    This is the package's one atomic writer: models, checkpoints, images, and the Spark
    runs' data and optimizer-state files all go through it.
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    handle, temporary = tempfile.mkstemp(
        prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory
    )
    try:
        with os.fdopen(handle, "wb") as file:
            write(file)
            if durable:
                file.flush()
                os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    if durable:
        fsync_directory(directory)


def fsync_directory(directory: str) -> None:
    """Make renames inside ``directory`` durable (a no-op where directories cannot be opened)."""
    try:
        descriptor = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)


def write_npz(
    file: IO[bytes], arrays: Mapping[str, Any], extra_members: Mapping[str, bytes] | None = None
) -> None:
    """Write ``arrays`` in NumPy's ``.npz`` layout with pickling refused, plus raw members.

    Unlike ``numpy.savez`` this never pickles: an object array raises ``ValueError``.
    """
    with zipfile.ZipFile(file, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
        for name, member in (extra_members or {}).items():
            archive.writestr(name, member)
        for name, value in arrays.items():
            array = np.asarray(backend.as_numpy(value))
            if array.dtype.hasobject:
                raise ValueError(f"cannot store array {name!r}: dtype {array.dtype} needs pickle")
            with archive.open(f"{name}.npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, array, allow_pickle=False)


def read_npz(path: str | os.PathLike) -> tuple[dict[str, np.ndarray], dict[str, bytes]]:
    """Read a file written by :func:`write_npz`: ``(arrays, other members)``; no pickle.

    Raises
    ------
    ValueError
        Naming the file, when it is not a zip archive, is truncated, or a member's CRC or
        array header is bad.
    """
    path = os.fspath(path)
    arrays: dict[str, np.ndarray] = {}
    members: dict[str, bytes] = {}
    try:
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                data = archive.read(info)  # checks the member's CRC-32
                if info.filename.endswith(".npy"):
                    arrays[info.filename[: -len(".npy")]] = np.lib.format.read_array(
                        io.BytesIO(data), allow_pickle=False
                    )
                else:
                    members[info.filename] = data
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, ValueError, OSError) as error:
        if isinstance(error, FileNotFoundError):
            raise
        raise ValueError(f"{path} is corrupt or truncated: {error}") from error
    return arrays, members


# --- the registry of classes load may build -------------------------------------------------
def register_module(cls: type, name: str | None = None) -> type:
    """Allow :func:`save`/:func:`load` to store and rebuild modules of class ``cls``.

    Call it (or use it as a decorator) in the code that saves *and* in the code that loads.
    The class is stored by ``name`` (default ``"<module>.<qualname>"``); loading looks that
    name up here and never imports anything.

    Raises
    ------
    TypeError
        If ``cls`` is not a Module subclass.
    ValueError
        If another class is already registered under ``name``.
    """
    if not (isinstance(cls, type) and issubclass(cls, Module)):
        raise TypeError(f"register_module expects a Module subclass, got {cls!r}")
    name = name or f"{cls.__module__}.{cls.__qualname__}"
    existing = _registry().get(name)
    if existing is not None and existing is not cls:
        raise ValueError(
            f"register_module: {name!r} already names {existing.__module__}."
            f"{existing.__qualname__}; pass another name= for {cls.__qualname__}"
        )
    _registered[name] = cls
    return cls


def _builtin_classes() -> dict[str, type]:
    """Every public Module class of ``bigdl_py.nn``, by class name."""
    import bigdl_py.nn as nn_package

    return {
        name: value
        for name, value in vars(nn_package).items()
        if isinstance(value, type) and issubclass(value, Module) and not name.startswith("_")
    }


def _registry() -> dict[str, type]:
    return {**_builtin_classes(), **_registered}


def _class_name(module: Module, names: Mapping[type, str]) -> str:
    if type(module) in names:
        return names[type(module)]
    raise TypeError(
        f"cannot save a {type(module).__qualname__}: its class is not known to "
        "bigdl_py.nn.save; call bigdl_py.nn.register_module("
        f"{type(module).__qualname__}) before saving and before loading"
    )


# --- architecture as JSON ---------------------------------------------------------------------
class _Encoder:
    """Turns a module tree into JSON values; a module met twice becomes a reference."""

    def __init__(self):
        self.ids: dict[int, int] = {}
        self.names = {cls: name for name, cls in _registry().items()}

    def module(self, module: Module) -> dict:
        if id(module) in self.ids:
            return {"__ref__": self.ids[id(module)]}
        self.ids[id(module)] = len(self.ids)
        config: dict[str, Any] = {
            "class": _class_name(module, self.names),
            "id": self.ids[id(module)],
            "training": bool(module.training),
        }
        if isinstance(module, GraphModel):
            # A graph's constructor takes placeholder nodes; store its wiring instead.
            config["graph"] = module.graph_spec()
            config["layers"] = {name: self.module(child) for name, child in module.named_children()}
            return config
        if "_init_args" not in module.__dict__:
            raise TypeError(
                f"cannot save {type(module).__qualname__}: it records no constructor arguments "
                "(was Module.__init__ bypassed?)"
            )
        args, kwargs = module._init_args
        where = type(module).__qualname__
        config["args"] = [self.value(value, where) for value in args]
        config["kwargs"] = {key: self.value(value, where) for key, value in kwargs.items()}
        return config

    def value(self, value: Any, where: str) -> Any:
        if value is None or isinstance(value, (bool, int, str)):
            return value
        if isinstance(value, float):
            return value if np.isfinite(value) else {"__float__": repr(value)}
        if isinstance(value, np.generic) and not isinstance(value, np.flexible):
            return self.value(value.item(), where)
        if isinstance(value, Module):
            return {"__module__": self.module(value)}
        if isinstance(value, tuple):
            return {"__tuple__": [self.value(item, where) for item in value]}
        if isinstance(value, list):
            return [self.value(item, where) for item in value]
        if isinstance(value, Mapping) and all(isinstance(key, str) for key in value):
            return {"__dict__": [[key, self.value(item, where)] for key, item in value.items()]}
        is_scalar_type = isinstance(value, type) and issubclass(value, np.generic)
        if isinstance(value, np.dtype) or is_scalar_type:
            return {"__dtype__": np.dtype(value).name}
        if isinstance(value, backend.Device):
            return {"__device__": str(value)}
        raise TypeError(
            f"cannot save {where}: a constructor argument of type {type(value).__name__} "
            f"({value!r}) is not a plain value (None, bool, int, float, str, list, tuple, dict, "
            "dtype, device or Module)"
        )


class _Decoder:
    """Rebuilds modules from :class:`_Encoder` output using only the class registry."""

    def __init__(self, path: str, format_version: int = FORMAT_VERSION):
        self.path = path
        self.format_version = format_version
        self.built: dict[int, Module] = {}
        self.classes = _registry()

    def module(self, config: Mapping) -> Module:
        if "__ref__" in config:
            return self.built[int(config["__ref__"])]
        name = config.get("class")
        cls = self.classes.get(name)
        if cls is None and _register_project_models():
            self.classes = _registry()
            cls = self.classes.get(name)
        if cls is None:
            raise ValueError(
                f"{self.path}: unknown module class {name!r}; load builds only bigdl_py.nn "
                "classes and classes registered with bigdl_py.nn.register_module"
            )
        if "graph" in config:
            layers = {key: self.module(child) for key, child in config["layers"].items()}
            module = cls.from_graph_spec(config["graph"], layers)
        else:
            args = [self.value(item) for item in config.get("args", [])]
            kwargs = {key: self.value(item) for key, item in config.get("kwargs", {}).items()}
            kwargs = _with_old_defaults(cls, args, kwargs, self.format_version)
            module = cls(*args, **kwargs)
        training = config.get("training", True)
        if not isinstance(training, bool):  # "false" would be truthy: check, never coerce
            raise ValueError(
                f"{self.path}: module {name!r} has training={training!r}; expected true or false"
            )
        module.train(training)
        self.built[int(config["id"])] = module
        return module

    def value(self, value: Any) -> Any:
        if isinstance(value, list):
            return [self.value(item) for item in value]
        if not isinstance(value, dict):
            return value
        if "__module__" in value:
            return self.module(value["__module__"])
        if "__tuple__" in value:
            return tuple(self.value(item) for item in value["__tuple__"])
        if "__dict__" in value:
            return OrderedDict((key, self.value(item)) for key, item in value["__dict__"])
        if "__float__" in value:
            return float(value["__float__"])
        if "__dtype__" in value:
            return np.dtype(value["__dtype__"])
        if "__device__" in value:
            return backend.device(value["__device__"])
        raise ValueError(f"{self.path}: unknown value encoding {sorted(value)}")


def _defaults_before() -> dict[int, dict[type, dict[str, Any]]]:
    """Constructor defaults that changed, keyed by the format version that changed them.

    A file of an older version stores only the arguments its code passed; where it left
    one of these out, the module was built with the old default, and is built so again.
    Exact classes only: a registered subclass has its own signature and defaults.
    """
    from bigdl_py.nn.recurrent import GRU, LSTM

    # Version 2: recurrent layers became time-major by default, as in PyTorch.
    return {2: {LSTM: {"batch_first": True}, GRU: {"batch_first": True}}}


def _with_old_defaults(cls: type, args: list, kwargs: dict, format_version: int) -> dict:
    """``kwargs`` plus the old defaults, of a file older than their change, that it relied on."""
    for changed_in, classes in _defaults_before().items():
        old_defaults = classes.get(cls)
        if format_version >= changed_in or old_defaults is None:
            continue
        given = inspect.signature(cls).bind_partial(*args, **kwargs).arguments
        kwargs = {**{k: v for k, v in old_defaults.items() if k not in given}, **kwargs}
    return kwargs


def module_config(module: Module) -> dict:
    """The architecture of ``module`` as JSON values (see :func:`save`)."""
    return _Encoder().module(module)


def module_from_config(
    config: Mapping,
    source: str = "<config>",
    max_values: int | None = None,
    format_version: int = FORMAT_VERSION,
) -> Module:
    """Build a module (fresh weights) from :func:`module_config` output.

    ``max_values`` bounds the array values the built modules may hold (``_build_budget``):
    ``load`` passes about what the file stores, so a small file declaring a huge layer fails
    at once instead of filling gigabytes that its stored weights would then not fit.
    ``format_version`` is the file's: constructor defaults that changed since are given
    their old values where the file relied on them (:func:`_defaults_before`).
    """
    from bigdl_py.nn import init

    budget = contextlib.nullcontext()
    if max_values is not None:
        budget = _build_budget.limit(max_values, source)
    # Building draws initial weights; a private stream keeps the user's seeded one untouched.
    with budget, init.seeded(0) as generator:
        if max_values is not None:
            # init's draws all go through this module-level generator (init._generator).
            init._default_generator = _ReservingGenerator(generator)
        return _Decoder(source, format_version).module(config)


class _ReservingGenerator:
    """A random generator whose draws first ask the build budget for room: a draw of many
    values that no parameter holds (a registered class's own) is refused before it runs."""

    def __init__(self, generator: np.random.Generator):
        self._generator = generator

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._generator, name)
        if not callable(method):
            return method

        def draw(*args: Any, **kwargs: Any) -> Any:
            size = kwargs.get("size")
            _build_budget.reserve(1 if size is None else tuple(np.atleast_1d(size)))
            return method(*args, **kwargs)

        return draw


def _register_project_models() -> bool:
    """Import bigdl_py.models, whose modules register the project's own models (GAN, NCF,
    ResNet...) on import; True the first time. A fixed module: nothing named by the file
    is ever imported."""
    global _project_models_imported
    if _project_models_imported:
        return False
    _project_models_imported = True
    import bigdl_py.models  # noqa: F401

    return True


_project_models_imported = False


# --- save / load --------------------------------------------------------------------------------
def save(model: Module, path: str | os.PathLike) -> None:
    """Save ``model``'s architecture and weights to ``path`` (written atomically).

    Parameters
    ----------
    model : Module
        Built from ``bigdl_py.nn`` classes and classes registered with
        :func:`register_module`, with plain constructor arguments.
    path : str or PathLike
        The file to write (any extension; ``.bigdl`` is conventional).

    Raises
    ------
    TypeError
        Naming the module and the argument that cannot be stored.

    Notes
    -----
    A module is stored as the constructor call that built it, so a setting changed by
    assignment after construction (``layer.p = 0.2``) is not stored, while parameters and
    buffers always are. Containers keep their recorded arguments in step with ``append``
    and friends; a graph ``Model`` stores its wiring, whose constant arguments must be
    JSON values.
    """
    architecture = {"format": FORMAT, "version": FORMAT_VERSION, "model": module_config(model)}
    member = json.dumps(architecture, indent=1, allow_nan=False).encode("utf-8")
    state = model.state_dict()  # members are '<name>.npy', so no name clashes with the JSON
    atomic_write(path, lambda file: write_npz(file, state, {ARCHITECTURE_MEMBER: member}))


def load(path: str | os.PathLike, device: str | backend.Device = "cpu") -> Module:
    """Rebuild a model saved by :func:`save` and move it to ``device``.

    Runs no stored code: classes are looked up by name in the registry only.

    Parameters
    ----------
    path : str or PathLike
    device : str or Device
        ``'cpu'`` (default), ``'cuda'`` or ``'cuda:<n>'``.

    Raises
    ------
    ValueError
        Naming the file and the problem: it is corrupt or truncated, is not a bigdl_py
        model (a safetensors file is named as one, with the call that loads it), has a
        malformed, too deeply nested or newer-version architecture, names an unknown
        class, declares more weights than it stores, or its weights do not fit.

    Notes
    -----
    A file of an older format version is rebuilt with the constructor defaults of its time
    (version 1: ``LSTM``/``GRU`` default to ``batch_first=True``), so it behaves as saved.
    """
    path = os.fspath(path)
    try:
        arrays, members = read_npz(path)
    except ValueError:
        _refuse_safetensors(path)
        raise
    architecture = _read_architecture(path, members)
    version = architecture["version"]
    # Building may create what the file stores and some slack (layers that own no stored
    # array, rounding); far more means the architecture does not match the weights.
    stored = sum(int(array.size) for array in arrays.values())
    try:
        model = module_from_config(architecture["model"], path, 2 * stored + 1_000_000, version)
    except (KeyError, TypeError, IndexError, AttributeError) as error:
        raise ValueError(f"{path}: cannot rebuild the stored architecture: {error!r}") from error
    except RecursionError:
        raise ValueError(
            f"{path}: the stored architecture is nested too deeply to rebuild (modules inside "
            "modules beyond Python's recursion limit); the file is damaged or crafted"
        ) from None
    except MemoryError:
        raise ValueError(
            f"{path}: the stored architecture declares layers too large to allocate, while the "
            f"file stores {stored:,} weight values; it does not match its weights"
        ) from None
    try:
        model.load_state_dict(arrays)
    except ValueError as error:
        raise ValueError(f"{path}: the weights do not fit the architecture: {error}") from None
    _keep_saved_dtypes(model, arrays, path)
    return model.to(device)


def _read_architecture(path: str, members: Mapping[str, bytes]) -> dict:
    """The parsed, checked ``architecture.json`` of a model file: a JSON object of this
    format with a version this bigdl_py reads and a module object."""
    try:
        architecture = json.loads(members[ARCHITECTURE_MEMBER].decode("utf-8"))
    except (KeyError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path} is not a bigdl_py model file ({error!r})") from None
    except RecursionError:
        raise ValueError(
            f"{path}: {ARCHITECTURE_MEMBER} is nested too deeply (beyond what Python's "
            "recursion limit lets JSON read); the file is damaged or crafted"
        ) from None
    if not isinstance(architecture, dict):
        raise ValueError(
            f"{path}: {ARCHITECTURE_MEMBER} holds a JSON {type(architecture).__name__}, not "
            "the object nn.save writes; this is not a bigdl_py model file"
        )
    if architecture.get("format") != FORMAT:
        raise ValueError(
            f"{path} is not a bigdl_py model file (format {architecture.get('format')!r})"
        )
    version = architecture.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ValueError(
            f"{path}: model format version {version!r} is not a positive integer (nn.save "
            f"writes {FORMAT_VERSION}); the file is damaged or was not written by bigdl_py"
        )
    if version > FORMAT_VERSION:
        raise ValueError(
            f"{path} was written by a newer bigdl_py (model format version {version}; this "
            f"one reads up to {FORMAT_VERSION})"
        )
    if not isinstance(architecture.get("model"), dict):
        raise ValueError(
            f"{path}: {ARCHITECTURE_MEMBER} has no module object under 'model' (got "
            f"{type(architecture.get('model')).__name__}); the file is damaged"
        )
    depth = _nesting_depth(architecture)
    if depth > MAX_ARCHITECTURE_NESTING:
        raise ValueError(
            f"{path}: {ARCHITECTURE_MEMBER} is nested too deeply ({depth} levels of JSON, at "
            f"most {MAX_ARCHITECTURE_NESTING}); the file is damaged or crafted"
        )
    return architecture


def _nesting_depth(value: Any) -> int:
    """How deeply JSON objects and lists nest in ``value`` (walked without recursion)."""
    deepest, pending = 0, [(value, 1)]
    while pending:
        item, depth = pending.pop()
        children = item.values() if isinstance(item, dict) else item
        if isinstance(item, (dict, list)):
            deepest = max(deepest, depth)
            pending.extend((child, depth + 1) for child in children)
    return deepest


def _refuse_safetensors(path: str) -> None:
    """Raise a clear error when ``path``, which is no model zip, is a safetensors file."""
    if is_safetensors_file(path):
        raise ValueError(
            f"{path} is a safetensors file (weights by name, no architecture), not a model "
            "file written by bigdl_py.nn.save: build the model in code, then call "
            "bigdl_py.nn.load_safetensors(model, path)"
        )


def _keep_saved_dtypes(model: Module, arrays: Mapping[str, np.ndarray], path: str) -> None:
    """Give each tensor its saved dtype (a model cast after construction, e.g. ``.double()``).

    The floating-point arrays of a file must share one dtype: one float16 array among
    float32 ones is damage or a mistake, not a model bigdl_py wrote.
    """
    floating: dict[np.dtype, str] = {}
    for key, array in arrays.items():
        if np.issubdtype(array.dtype, np.floating):
            floating.setdefault(array.dtype, key)
    if len(floating) > 1:
        examples = ", ".join(f"{key} is {dtype}" for dtype, key in floating.items())
        raise ValueError(f"{path}: the stored weights mix floating-point dtypes ({examples})")
    for module_name, module in model.named_modules():
        for registry in (module._parameters, module._buffers):
            for name, value in registry.items():
                key = f"{module_name}.{name}" if module_name else name
                if value is not None and key in arrays and value.dtype != arrays[key].dtype:
                    value.data = np.array(arrays[key], copy=True)
