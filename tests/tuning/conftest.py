"""Shared fixtures of the sweep tests: a tiny base experiment, sweep files, and a
check that no TFF worker_binary started by a test outlives it.

Every process a test starts (Ray's workers included) inherits `TUNING_TEST_TOKEN`,
so a leftover worker_binary is recognised by its environment, not by its name.
"""

import os
import time
import uuid

import pytest
import yaml

from tests import process_table as processes


TOKEN = f"tuning-test-{uuid.uuid4().hex[:12]}"
os.environ["TUNING_TEST_TOKEN"] = TOKEN


def rounds_reported_again(results, metrics=("test/accuracy", "test/loss", "train/loss",
                                             "objective")):
  """Asserts that every round a trial (a Tune `Result`) reported more than once
  has the same `metrics` each time (a restarted trial runs the rounds after its
  latest checkpoint again); returns how many reports were repeats."""
  again = 0
  for result in results:
    seen = {}
    for row in result.metrics_dataframe.to_dict("records"):
      values = tuple(row[k] for k in metrics)
      if row["round"] in seen:
        again += 1
        assert seen[row["round"]] == values, (row["round"], seen[row["round"]], values)
      seen[row["round"]] = values
  return again


def write_sweep(directory, raw, name="sweep.yaml"):
  path = os.path.join(str(directory), name)
  with open(path, "w") as f:
    yaml.safe_dump(raw, f, sort_keys=False)
  return path


def our_worker_binaries():
  """PIDs of live worker_binary processes started under this test session, other
  than the test process's own (its descendants: tests/conftest.py ends the
  session's default context's at session end)."""
  table = processes.stats()
  own = set(processes.descendants(os.getpid(), table))
  found = []
  for proc in table:
    if not proc.running or proc.pid in own:
      continue
    if b"worker_binary" not in (processes.cmdline(proc.pid) or b""):
      continue
    if any(TOKEN.encode() in item for item in processes.environ(proc.pid) or ()):
      found.append(proc.pid)
  return found


def assert_no_worker_binaries_left(timeout_s: float = 15.0) -> None:
  """Fails unless every worker_binary this session started outside this
  process's own descendants has ended (within `timeout_s`)."""
  deadline = time.monotonic() + timeout_s
  while our_worker_binaries() and time.monotonic() < deadline:
    time.sleep(0.5)
  left = our_worker_binaries()
  assert not left, f"worker_binary processes left behind: {left}"


@pytest.fixture
def no_leftover_workers():
  """Fails a test that leaves a TFF worker_binary of its own behind."""
  yield
  assert_no_worker_binaries_left()


@pytest.fixture(scope="module")
def shared_ray():
  """A local Ray kept for a module's sweeps, where what a sweep does alone is
  not the subject: no sweep starts (and ends) a Ray of its own. The module's
  other tests must not need Ray to be down."""
  from tff_fedadamom.runtime.ray_session import ray_session

  with ray_session(None):
    yield
  assert_no_worker_binaries_left()
