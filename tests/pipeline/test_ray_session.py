"""Connecting to Ray sets none of this process' logging: no logger's level, and
no handler outside Ray's own logger. (With configure_logging=False, `ray.init`
still empties the "ray" logger's handlers; a Ray module it imports sets
"filelock" to WARNING when imported.)"""

import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Every logger's level and handlers (the root's included), before and after a
# local Ray session starts, in a fresh interpreter; prints those that changed.
_CODE = """
import logging
from tff_fedadamom.pipeline.ray_session import ray_session

def loggers():
  named = dict(logging.root.manager.loggerDict)
  named["<root>"] = logging.root
  return {n: (l.level, () if n == "ray" else tuple(l.handlers), l.propagate)
          for n, l in named.items() if isinstance(l, logging.Logger) and n != "filelock"}

import ray  # its import-time loggers exist before the comparison
before = loggers()
with ray_session(None):
  after = loggers()
changed = {n for n in before if after.get(n) != before[n]}
print(sorted(changed))
"""


def test_a_local_session_leaves_logging_alone():
  env = {**os.environ, "PYTHONPATH": REPO, "RAY_ADDRESS": ""}
  out = subprocess.run([sys.executable, "-c", _CODE], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  assert out.stdout.strip().splitlines()[-1] == "[]"
