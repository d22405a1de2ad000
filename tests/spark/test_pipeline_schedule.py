"""GPipe's schedule as ticks (``modes/pipeline/schedule.py``): every micro-batch passes every
stage once each way, one tick after its neighbour, and the tick counts."""

from __future__ import annotations

import itertools

import pytest

from bigdl_py.spark.modes.pipeline.schedule import TickPlan


@pytest.mark.parametrize(
    "stages, micro_batches", list(itertools.product((1, 2, 3, 4), (1, 2, 5, 8)))
)
@pytest.mark.parametrize("clipping_by_norm", (False, True))
def test_each_micro_batch_flows_forward_then_back_through_neighbours(
    stages, micro_batches, clipping_by_norm
):
    plan = TickPlan(stages, micro_batches, clipping_by_norm)
    iterations = 3
    forward, backward = {}, {}
    updates, exchanges, squares = [], set(), set()
    for tick in range(plan.chain_ticks(iterations)):
        for stage in range(stages):
            events = plan.events(stage, tick, iterations)
            if events.forward is not None:
                key = (events.iteration, stage, events.forward)
                assert key not in forward
                forward[key] = tick
            if events.backward is not None:
                key = (events.iteration, stage, events.backward)
                assert key not in backward
                backward[key] = tick
            if events.update:
                updates.append((tick, stage, events.iteration))
            if events.exchange:
                exchanges.add((tick, events.iteration))
            if events.squares:
                squares.add((tick, events.iteration))
    every = set(itertools.product(range(iterations), range(stages), range(micro_batches)))
    assert set(forward) == every and set(backward) == every
    for iteration, stage, micro_batch in every:
        key = (iteration, stage, micro_batch)
        assert backward[key] >= forward[key]
        if stage > 0:  # the activation arrives from the stage before, one tick earlier
            assert forward[key] == forward[(iteration, stage - 1, micro_batch)] + 1
        if stage < stages - 1:  # its gradient from the stage after, one tick earlier
            assert backward[key] == backward[(iteration, stage + 1, micro_batch)] + 1
        else:
            assert (backward[key] == forward[key]) == (micro_batch == micro_batches - 1)
        assert backward[key] == plan.backward_tick(stage, micro_batch) + (
            iteration * plan.iteration_ticks
        )
    # Micro-batches go forward in order and backward in reverse, one a tick per stage.
    for iteration, stage in itertools.product(range(iterations), range(stages)):
        ticks = [forward[(iteration, stage, m)] for m in range(micro_batches)]
        assert ticks == list(range(ticks[0], ticks[0] + micro_batches))
        ticks = [backward[(iteration, stage, m)] for m in reversed(range(micro_batches))]
        assert ticks == list(range(ticks[0], ticks[0] + micro_batches))
    # Everyone updates iteration i in one tick, after the exchange (and the squares), and
    # before stage 0's first forward of iteration i + 1 (in the same tick).
    last_tick = plan.chain_ticks(iterations) - 1
    for iteration in range(iterations):
        tick = (iteration + 1) * plan.iteration_ticks
        assert sorted(u for u in updates if u[2] == iteration + 1) == [
            (tick, stage, iteration + 1) for stage in range(stages)
        ]
        (exchange,) = [t for t, i in exchanges if i == iteration]
        assert exchange == tick - 1 - clipping_by_norm
        assert [t for t, i in squares if i == iteration] == ([tick - 1] if clipping_by_norm else [])
        # The exchange is the iteration's last backward (stage 0's of micro-batch 0).
        assert exchange == max(
            backward[(iteration, s, m)] for s in range(stages) for m in range(micro_batches)
        )
        if iteration + 1 < iterations:
            assert forward[(iteration + 1, 0, 0)] == tick
    assert plan.events(0, last_tick, iterations).end
    assert plan.chain_ticks(iterations) == iterations * (2 * plan.fill - 1 + clipping_by_norm) + 1


def test_the_bubble_is_gpipes():
    assert TickPlan(4, 8).bubble_fraction == pytest.approx(3 / 11)
    assert TickPlan(1, 8).bubble_fraction == 0
