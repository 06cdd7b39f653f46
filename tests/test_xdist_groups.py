"""The suite's xdist grouping works on a real two-worker run: the tests sharing
a module fixture all run in one worker, which sets the fixture up once."""

import os
import subprocess
import sys
import textwrap

from tests.helpers import ROOT


_MODULE = textwrap.dedent("""
    import os
    import pytest

    LOG = os.environ["XDIST_GROUPS_LOG"]

    def _log(line):
      with open(LOG, "a") as f:
        f.write(line + "\\n")

    @pytest.fixture(scope="module")
    def shared():
      _log("setup")
      yield

    @pytest.mark.parametrize("i", range(6))
    def test_shared(shared, i):
      _log(f"shared {os.environ['PYTEST_XDIST_WORKER']}")

    @pytest.mark.parametrize("i", range(6))
    def test_alone(i):
      _log(f"alone {os.environ['PYTEST_XDIST_WORKER']}")
""")


def test_tests_sharing_a_module_fixture_run_in_one_worker_that_sets_it_up_once(tmp_path):
  (tmp_path / "test_grouped.py").write_text(_MODULE)
  log = tmp_path / "log"
  env = dict(os.environ, XDIST_GROUPS_LOG=str(log), PYTHONPATH=ROOT)
  proc = subprocess.run(
      [sys.executable, "-m", "pytest", "-q", "-p", "tests.xdist_groups", "-p", "no:randomly",
       "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup", "--rootdir", str(tmp_path),
       str(tmp_path / "test_grouped.py")],
      cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  lines = log.read_text().splitlines()
  assert lines.count("setup") == 1, lines
  shared = {line.split()[1] for line in lines if line.startswith("shared")}
  alone = [line for line in lines if line.startswith("alone")]
  assert len(shared) == 1 and len(alone) == 6, lines
