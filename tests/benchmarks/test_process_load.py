"""benchmarks/process_load.py's `--warm-trial` mode runs through the trial
worker's own steps (`TrialWorker._plan`, `_parts`) and times a first round. In
a process of its own: the worker applies its session, and the timeline wraps
the project's functions for the rest of the process."""

import os
import re
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_warm_trial_times_a_first_round_in_a_trial_worker():
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=REPO)
  proc = subprocess.run([sys.executable, "benchmarks/process_load.py", "--warm-trial"],
                        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  out = proc.stdout
  found = re.search(r"first round starts ([\d.]+) s, ends ([\d.]+) s after the worker", out)
  assert found, out
  start, end = map(float, found.groups())
  assert 0 <= start <= end
  # The timeline shows the parts taken from the worker's cache and the round run.
  for step in ("PartsCache.get", "run_rounds", "ClientFold.__call__"):
    assert step in out, out
