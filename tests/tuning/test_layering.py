"""Each module of the sweep layer imports alone. (Its place in the layers and
the absence of import cycles are checked with the rest, in tests/test_layering.py.)"""

import os
import subprocess
import sys

import pytest

from tests.helpers import ROOT as REPO
from tests.helpers import package_modules as _modules

TUNING = sorted(m for m, _ in _modules() if m == "tuning" or m.startswith("tuning."))


def test_the_tuning_modules_are_found():
  assert {"tuning", "tuning.sweep", "tuning.checks"} <= set(TUNING)


@pytest.mark.parametrize("module", TUNING)
def test_each_tuning_module_imports_alone(module):
  """Imported first in a fresh interpreter, each module must load: a cycle that
  only works in one import order fails here."""
  result = subprocess.run([sys.executable, "-c", f"import {module}"], cwd=REPO,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": REPO})
  assert result.returncode == 0, result.stderr[-3000:]
