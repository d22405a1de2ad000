"""Whether operations record the graph: ``no_grad`` and ``enable_grad``."""

from __future__ import annotations

import contextlib
import functools
import threading

_state = threading.local()


def is_grad_enabled() -> bool:
    return getattr(_state, "enabled", True)


def _set_grad_enabled(enabled: bool) -> None:
    _state.enabled = enabled


class _GradMode(contextlib.ContextDecorator):
    """Context manager and decorator that sets grad mode and restores it on exit."""

    enabled = True

    def __enter__(self):
        self._previous = is_grad_enabled()
        _set_grad_enabled(self.enabled)
        return self

    def __exit__(self, *exc_info):
        _set_grad_enabled(self._previous)
        return False

    def __call__(self, function):
        @functools.wraps(function)
        def wrapper(*args, **kwargs):
            with self.__class__():
                return function(*args, **kwargs)

        return wrapper


class no_grad(_GradMode):  # noqa: N801 - lower case like torch.no_grad, used as a statement
    """Inside ``with no_grad():`` (or a function decorated by it) nothing is recorded."""

    enabled = False


class enable_grad(_GradMode):  # noqa: N801
    """Turn recording back on inside a ``no_grad`` block."""

    enabled = True
