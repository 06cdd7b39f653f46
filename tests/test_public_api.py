"""The package's lazily imported public names."""

import importlib
import subprocess
import sys

import pytest

import tff_fedadamom

# Where each public name is defined (the README's examples import them from the
# package root).
HOMES = {
    "InProcessLearningProcess": "tff_fedadamom.runtime.inprocess",
    "build_fedadamom": "tff_fedadamom.optimizers",
    "build_process": "tff_fedadamom.experiment",
    "build_server_optimizer": "tff_fedadamom.methods",
    "list_optimizers": "tff_fedadamom.methods",
    "load_config": "tff_fedadamom.config",
    "run_experiment": "tff_fedadamom.experiment",
}


def test_every_public_name_is_the_object_of_its_home_module():
  assert tff_fedadamom.__all__ == sorted(HOMES)
  for name, home in HOMES.items():
    public = getattr(tff_fedadamom, name)
    assert public is getattr(importlib.import_module(home), name), name
    assert callable(public) and public.__name__ == name, name
    assert name in dir(tff_fedadamom), name
  with pytest.raises(AttributeError, match="has no attribute 'build_fedadam'"):
    tff_fedadamom.build_fedadam  # noqa: B018 - the lookup is the test


def test_import_does_not_load_tensorflow():
  code = "import sys, tff_fedadamom; print('tensorflow' in sys.modules)"
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  assert out.stdout.strip() == "False"


def test_light_modules_do_not_load_tensorflow():
  """The pipeline and optimizer packages import lazily: the sweep export and
  plots, the trainable's report hook and the optimizer names' package load no
  TensorFlow."""
  code = ("import sys, tff_fedadamom.experiment, tff_fedadamom.optimizers, tuning.export, "
          "tuning.plots, tuning.trainable; print('tensorflow' in sys.modules)")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  assert out.stdout.strip() == "False"
