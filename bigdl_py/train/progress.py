"""Training progress: a tqdm bar on a terminal, plain log lines otherwise.

On a terminal each epoch gets a bar with the loss and samples/s. Anywhere else (a Spark
driver log, a notebook's captured stream, a CI job) progress goes to the ``bigdl_py.train``
logger as lines in BigDL's style, every ``log_interval`` iterations and at each epoch's end:

    [Epoch 1 12800/60000][Iteration 100] loss 0.6124, 2513.2 samples/s, lr 0.05

If nothing configured logging, those INFO lines go to stderr through a handler added to the
``bigdl_py`` logger; configure logging (or set that logger's level) to route or silence them.

Library code that trains on the user's behalf (the Spark ML stages, inside a
``CrossValidator`` perhaps hundreds of fits) passes ``iteration_level=logging.DEBUG``: the
per-iteration lines then go out at DEBUG and no bar is drawn, while epoch summaries,
validation results and checkpoints stay at INFO.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any, TextIO

logger = logging.getLogger("bigdl_py.train")

_POSTFIX_SECONDS = 0.5


def _ensure_visible(log: logging.Logger) -> None:
    """Give INFO lines a destination when the application configured none."""
    package = logging.getLogger("bigdl_py")
    if not log.hasHandlers():
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        package.addHandler(handler)
        if package.level == logging.NOTSET:
            package.setLevel(logging.INFO)


class Progress:
    """Reports training progress for the loop.

    Parameters
    ----------
    enabled : bool
        False reports nothing (warnings and errors still go to the logger).
    bar : bool, optional
        Force the tqdm bar on or off; by default on exactly when ``stream`` is a terminal.
    log_interval : int, optional
        Iterations between log lines without a bar (default: about ten lines per epoch).
    stream : file, optional
        Where the bar draws (default ``sys.stderr``).
    iteration_level : int
        The logging level of per-iteration lines (``logging.INFO``); below INFO, no bar is
        drawn unless ``bar=True``.
    """

    def __init__(
        self,
        enabled: bool = True,
        bar: bool | None = None,
        log_interval: int | None = None,
        stream: TextIO | None = None,
        iteration_level: int = logging.INFO,
    ):
        if log_interval is not None and int(log_interval) < 1:
            raise ValueError(f"log_interval must be >= 1, got {log_interval!r}")
        if not isinstance(iteration_level, int) or isinstance(iteration_level, bool):
            raise TypeError(
                f"iteration_level must be a logging level such as logging.DEBUG, got "
                f"{iteration_level!r}"
            )
        self.iteration_level = iteration_level
        self.enabled = bool(enabled)
        self.stream = stream
        self.log_interval = None if log_interval is None else int(log_interval)
        self._use_bar = bar
        self._bar: Any = None
        self._next_postfix = 0.0
        self._epoch_interval = 1

    def _stream(self) -> TextIO:
        return self.stream if self.stream is not None else sys.stderr

    def uses_bar(self) -> bool:
        if self._use_bar is not None:
            return self._use_bar
        if self.iteration_level < logging.INFO:
            return False  # a bar is per-iteration progress, which was asked to stay quiet
        isatty = getattr(self._stream(), "isatty", None)
        return bool(isatty and isatty())

    def start_epoch(self, epoch: int, done: int, total: int) -> None:
        """Epoch ``epoch`` (1-based) of ``total`` batches begins, ``done`` of them already run."""
        if not self.enabled:
            return
        self._epoch_interval = self.log_interval or max(1, total // 10)
        if self.uses_bar():
            from tqdm.auto import tqdm

            self.close()
            self._bar = tqdm(
                total=total,
                initial=done,
                desc=f"Epoch {epoch}",
                unit="batch",
                file=self._stream(),
                dynamic_ncols=True,
                leave=True,
            )
        else:
            _ensure_visible(logger)

    def iteration(
        self,
        epoch: int,
        iteration: int,
        samples_done: int,
        epoch_samples: int,
        loss: float,
        throughput: float,
        learning_rate: float | None,
    ) -> None:
        """One iteration finished (``epoch`` 1-based, ``iteration`` counted over the run)."""
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.update(1)
            now = time.monotonic()
            if now >= self._next_postfix:  # formatting the postfix costs more than the update
                self._next_postfix = now + _POSTFIX_SECONDS
                self._bar.set_postfix(
                    iteration=iteration,
                    loss=f"{loss:.4f}",
                    samples_s=f"{throughput:.0f}",
                    refresh=False,
                )
            return
        if iteration == 1 or iteration % self._epoch_interval == 0 or samples_done >= epoch_samples:
            if not logger.isEnabledFor(self.iteration_level):
                return
            rate = "" if learning_rate is None else f", lr {learning_rate:.6g}"
            logger.log(
                self.iteration_level,
                "[Epoch %d %d/%d][Iteration %d] loss %.4f, %.1f samples/s%s",
                epoch,
                samples_done,
                epoch_samples,
                iteration,
                loss,
                throughput,
                rate,
            )

    def end_epoch(self, epoch: int, seconds: float, samples: int) -> None:
        if not self.enabled:
            return
        self.close()
        self.message(
            f"Epoch {epoch} finished: {samples} samples in {seconds:.1f} s "
            f"({samples / max(seconds, 1e-9):.1f} samples/s)"
        )

    def message(self, text: str) -> None:
        """A line of news (validation results, checkpoints) that does not break the bar."""
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.write(text, file=self._stream())
        else:
            _ensure_visible(logger)
            logger.info("%s", text)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
