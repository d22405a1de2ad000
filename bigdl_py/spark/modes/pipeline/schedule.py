"""GPipe's synchronous schedule as ticks: what each stage does in each Spark stage of a job.

A *tick* is one Spark stage of the job: every partition runs one task, and what a task
sends reaches its destination in the next tick, through the shuffle between them. With
``K`` stages and ``M`` micro-batches, ``L = M + K - 1`` ticks fill and drain the pipe in
each direction (Huang et al. 2019, figure 2):

* forward — at tick ``s`` stage ``k`` runs micro-batch ``s - k`` (when ``0 <= s - k < M``)
  and sends its output to stage ``k + 1``;
* backward — from tick ``L - 1`` on, in reverse order: at tick ``s`` stage ``k`` runs the
  backward of micro-batch ``M - 1 - (s - (L - 1) - (K - 1 - k))`` and sends its input's
  gradient to stage ``k - 1``. The last stage runs micro-batch ``M - 1`` forward and
  backward in the same tick (its loss needs nothing from another stage), so the two
  phases share tick ``L - 1``;
* the exchange — at tick ``2L - 2`` (stage 0's last backward) every partition sends what
  the update needs: its gradient to its replicas (``replicas`` > 1), the last stages'
  losses to everyone;
* with global-norm clipping one more tick, where every partition sums its replicas'
  gradients and sends the squares of its stage's to everyone (the norm is the whole
  gradient's);
* the update — every stage steps its own slice in the next tick, which is also the next
  iteration's tick 0 (stage 0's first forward runs on the new weights in the same task).

So an iteration takes ``2L - 1`` ticks (``2L`` with global-norm clipping) and ``c``
chained iterations ``c`` times that plus one (the last update). Every stage is busy in
``2M`` of the ``2L`` forward and backward tick-halves: GPipe's bubble is
``(K - 1) / (M + K - 1)`` of each stage's time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple


class TickEvents(NamedTuple):
    """What one stage does in one tick of a chain (:meth:`TickPlan.events`)."""

    iteration: int  # the chain's iteration (0-based) the forward/backward belong to
    update: bool  # first, step iteration ``iteration - 1``'s slice (the previous one's)
    forward: int | None  # micro-batch run forward, or None
    backward: int | None  # micro-batch run backward (after the forward in the same tick)
    exchange: bool  # send the gradient to the replicas and the losses to everyone
    squares: bool  # sum the replicas' gradients, send the squared norm to everyone
    end: bool  # the chain's last tick: the update only, then the chain's result


@dataclass(frozen=True)
class TickPlan:
    """The ticks of ``K = stages`` and ``M = micro_batches``; ``clipping_by_norm`` adds the
    squares tick."""

    stages: int
    micro_batches: int
    clipping_by_norm: bool = False

    @property
    def fill(self) -> int:
        """``L``: ticks for a micro-batch stream to pass every stage in one direction."""
        return self.micro_batches + self.stages - 1

    @property
    def exchange_tick(self) -> int:
        """The tick of stage 0's last backward, when everyone sends what the update needs."""
        return 2 * self.fill - 2

    @property
    def iteration_ticks(self) -> int:
        """Ticks from one iteration's tick 0 to the next one's."""
        return self.exchange_tick + (2 if self.clipping_by_norm else 1)

    def chain_ticks(self, iterations: int) -> int:
        """Spark stages of a job of ``iterations`` chained iterations."""
        return iterations * self.iteration_ticks + 1

    def forward(self, stage: int, tick: int) -> int | None:
        """The micro-batch stage ``stage`` runs forward at iteration tick ``tick``."""
        micro_batch = tick - stage
        return micro_batch if 0 <= micro_batch < self.micro_batches else None

    def backward(self, stage: int, tick: int) -> int | None:
        """The micro-batch stage ``stage`` runs backward at iteration tick ``tick``."""
        behind = tick - (self.fill - 1) - (self.stages - 1 - stage)
        micro_batch = self.micro_batches - 1 - behind
        if tick < self.fill - 1 or not 0 <= micro_batch < self.micro_batches:
            return None
        return micro_batch

    def backward_tick(self, stage: int, micro_batch: int) -> int:
        """The iteration tick at which ``stage`` runs ``micro_batch`` backward."""
        return (self.fill - 1) + (self.stages - 1 - stage) + (self.micro_batches - 1 - micro_batch)

    def events(self, stage: int, tick: int, iterations: int) -> TickEvents:
        """What ``stage`` does at tick ``tick`` (0-based) of a chain of ``iterations``."""
        iteration, local = divmod(tick, self.iteration_ticks)
        if iteration >= iterations:  # the last tick: iteration ``iterations - 1``'s update
            return TickEvents(iterations, True, None, None, False, False, True)
        return TickEvents(
            iteration,
            update=local == 0 and iteration > 0,
            forward=self.forward(stage, local),
            backward=self.backward(stage, local),
            exchange=local == self.exchange_tick,
            squares=self.clipping_by_norm and local == self.exchange_tick + 1,
            end=False,
        )

    @property
    def bubble_fraction(self) -> float:
        """GPipe's idle share of each stage's time: ``(K - 1) / (M + K - 1)``."""
        return (self.stages - 1) / self.fill
