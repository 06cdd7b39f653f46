"""benchmarks/backend.py at a tiny size: both backends run, its table is complete,
and the two backends' states agree (the benchmark's sanity check)."""

import os
import re
import subprocess
import sys

import numpy as np
import pytest

from benchmarks import backend

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_max_relative_error_is_per_tensor():
  a = [np.array([1.0, 2.0]), np.array([[10.0, -20.0]]), np.zeros(3)]
  b = [np.array([1.0, 2.5]), np.array([[10.0, -20.0]]), np.zeros(3)]
  assert backend._max_relative_error(a, b) == pytest.approx(0.5 / 2.5)
  # Against an all-zero tensor the difference counts as it is.
  assert backend._max_relative_error([np.array([0.0, 1e-3])], [np.zeros(2)]) == \
      pytest.approx(1e-3)
  # A large tensor does not hide a small one's error.
  assert backend._max_relative_error([np.array([1e6]), np.array([1.1])],
                                     [np.array([1e6]), np.array([1.0])]) == pytest.approx(0.1)


def test_tiny_quickstart_run():
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
  proc = subprocess.run(
      [sys.executable, "benchmarks/backend.py", "--only", "a", "--tiny", "--rounds", "1",
       "--warmup", "0"],
      cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  out = proc.stdout
  assert "(a) quickstart CNN: Fashion-MNIST, 2 clients/round x 20 examples" in out
  assert "(b)" not in out
  for name in ("inprocess", "tff_cpp"):
    row = re.search(rf"^\s+{name}\s+([\d.]+)\s+([\d.]+)\s", out, re.M)
    assert row, out
    seconds, per_second = float(row.group(1)), float(row.group(2))
    # Both are printed to 3 decimals, rounded from the same measurement.
    assert seconds > 0.0005
    assert 1 / (seconds + 0.0005) - 0.0005 <= per_second <= 1 / (seconds - 0.0005) + 0.0005
  assert re.search(r"ratio inprocess/tff_cpp rounds/s: [\d.]+ +\(goal >= 1\.5: (met|NOT met)\)",
                   out), out
  error = re.search(r"max relative error per weight tensor, inprocess vs tff_cpp, one round from the same "
                    r"state: (\S+) \(worst of 1 rounds\)",
                    out)
  assert error, out
  assert float(error.group(1)) < 1e-4
