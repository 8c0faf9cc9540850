"""Timing for the benchmarks: modes measured in alternating rounds, so a busy machine disturbs each alike."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Hashable
from typing import TypeVar

M = TypeVar("M", bound=Hashable)


def rounds(modes: dict[M, Callable[[], object]], count: int) -> dict[M, float]:
    """Median seconds per mode, rounds alternating the modes after one warm-up each."""
    seconds: dict[M, list[float]] = {mode: [] for mode in modes}
    for run in modes.values():
        run()
    for _ in range(count):
        for mode, run in modes.items():
            began = time.perf_counter()
            run()
            seconds[mode].append(time.perf_counter() - began)
    return {mode: statistics.median(values) for mode, values in seconds.items()}
