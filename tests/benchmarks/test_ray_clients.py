"""benchmarks/ray_clients.py starts from a fresh interpreter: its imports resolve
from the repository root, and its options are parsed (the timed run itself is
a benchmark, not a test)."""

import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_help_runs_from_any_directory(tmp_path):
  proc = subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "ray_clients.py"),
                         "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "--clients" in proc.stdout and "--rounds" in proc.stdout
