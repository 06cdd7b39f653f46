"""Timing several calls against each other on a shared machine."""

from __future__ import annotations

import time
from typing import Callable, Mapping


def interleaved(calls: Mapping[str, Callable[[], object]], repeats: int,
                warmups: int = 1) -> dict[str, list[float]]:
  """Seconds of each call, `repeats` times, after `warmups` untimed calls each.

  The calls are interleaved round-robin, and the one called first rotates each
  repeat, so load on a shared machine falls on all of them alike; the i-th
  times of two calls are a pair, for ratios of paired repeats.
  """
  for call in calls.values():
    for _ in range(warmups):
      call()  # traces and compiles what the first calls do
  names, times = list(calls), {name: [] for name in calls}
  for i in range(repeats):
    for name in names[i % len(names):] + names[:i % len(names)]:
      start = time.perf_counter()
      calls[name]()
      times[name].append(time.perf_counter() - start)
  return times
