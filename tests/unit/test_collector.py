"""The operator's garbage-collector policy: survivors frozen out of the routine collections,
everything collected once in a while, with Python's real collector."""

from __future__ import annotations

import gc
import time
import weakref
from collections.abc import Iterator

import pytest

from compass.controllers.collector import Collector
from compass.controllers.policy_scheduler import PolicyScheduler
from compass.controllers.settings import OperatorSettings


class Node:
    """An object that can sit in a reference cycle."""

    other: Node | None = None


def cycle() -> Node:
    """One of two nodes that hold each other: garbage only a collection frees, once dropped."""
    first, second = Node(), Node()
    first.other, second.other = second, first
    return first


@pytest.fixture
def thawed() -> Iterator[None]:
    """The test's freezes undone, so that other tests' garbage is collected as usual."""
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_it_only_starts_its_clocks_then_freezes_each_period_and_thaws_each_longer_one(
    thawed: None,
) -> None:
    done: list[str] = []
    collector = Collector(
        freeze_s=60,
        thaw_s=900,
        collect=lambda generation: done.append(f"collect {generation}") or 0,
        freeze=lambda: done.append("freeze"),
        unfreeze=lambda: done.append("unfreeze"),
    )
    assert collector.step(1000.0) is None
    assert collector.step(1059.0) is None
    assert done == []
    assert collector.step(1060.0) == "frozen"
    assert done == ["collect 1", "freeze"]
    steps = [collector.step(1060.0 + s) for s in range(1, 841)]
    assert steps.count("frozen") == 13
    assert steps[-1] == "thawed"
    assert done[-3:] == ["unfreeze", "collect 2", "freeze"]
    assert collector.step(1901.0) is None  # both clocks start again at the thaw


def test_a_frozen_cycle_survives_full_collections_until_the_thaw(thawed: None) -> None:
    collector = Collector(freeze_s=1, thaw_s=10)
    collector.step(0.0)
    first = cycle()
    alive = weakref.ref(first)
    assert collector.step(1.0) == "frozen"
    assert gc.get_freeze_count() > 0
    del first
    gc.collect()
    assert alive() is not None, "a full collection scanned the permanent generation"
    assert collector.step(10.0) == "thawed"
    assert alive() is None, "the thaw's collection left a garbage cycle"
    assert gc.get_freeze_count() > 0, "what survived the thaw is frozen again"


def test_young_garbage_cycles_are_collected_before_a_freeze(thawed: None) -> None:
    collector = Collector(freeze_s=1, thaw_s=1000)
    collector.step(0.0)
    alive = weakref.ref(cycle())
    collector.step(1.0)
    assert alive() is None


def test_the_operators_scheduler_steps_a_collector_unless_the_setting_is_0() -> None:
    from compass.controllers.runtime import Runtime

    runtime = Runtime(OperatorSettings(gc_freeze_seconds=0))
    try:
        assert runtime.policy_scheduler().collector is None
    finally:
        runtime.stop()
    runtime = Runtime(OperatorSettings(gc_freeze_seconds=30))
    try:
        collector = runtime.policy_scheduler().collector
        assert collector is not None
        assert collector.freeze_s == 30
    finally:
        runtime.stop()
    assert PolicyScheduler(1.0).collector is None  # tests' schedulers leave the collector be


def test_a_stopped_scheduler_thaws_what_its_collector_froze(thawed: None) -> None:
    collector = Collector(freeze_s=0.05, thaw_s=1000)
    scheduler = PolicyScheduler(0.01, collector=collector).start()
    deadline = time.monotonic() + 5
    while gc.get_freeze_count() == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert gc.get_freeze_count() > 0, "the scheduler's thread never froze"
    scheduler.stop()
    assert gc.get_freeze_count() == 0
