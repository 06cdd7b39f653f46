"""The package's lazily imported public names."""

import subprocess
import sys

import tff_fedadamom


def test_every_public_name_resolves():
  for name in tff_fedadamom.__all__:
    assert getattr(tff_fedadamom, name) is not None, name


def test_in_process_learning_process_is_public():
  from tff_fedadamom.pipeline import inprocess

  assert tff_fedadamom.InProcessLearningProcess is inprocess.InProcessLearningProcess
  assert "InProcessLearningProcess" in dir(tff_fedadamom)


def test_import_does_not_load_tensorflow():
  code = "import sys, tff_fedadamom; print('tensorflow' in sys.modules)"
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  assert out.stdout.strip() == "False"


def test_light_modules_do_not_load_tensorflow():
  """The pipeline and optimizer packages import lazily: the sweep export and
  plots, the trainable's report hook and the optimizer names' package load no
  TensorFlow."""
  code = ("import sys, tff_fedadamom.pipeline, tff_fedadamom.optimizers, tuning.export, "
          "tuning.plots, tuning.trainable; print('tensorflow' in sys.modules)")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  assert out.stdout.strip() == "False"
