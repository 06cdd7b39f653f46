"""A program that uses the library, not the command, keeps its process as it was.

The program makes no set-up call: it builds a learning process, runs rounds in-process with evaluations and checkpoints, and
evaluates through `run_experiment`. Around those library calls nothing
process-wide may change: the environment, signal handlers, the hooks for
uncaught and unraisable exceptions, logging's root handlers and level,
TensorFlow's thread pools, TFF's execution context, Python's garbage collector.
And the interpreter's own exit, with its teardown, prints no traceback.
"""

import os
import subprocess
import sys

from tests.helpers import ROOT


PROGRAM = """
import gc, logging, os, signal, sys
import tff_fedadamom
import tensorflow as tf
from tensorflow_federated.python.core.impl.context_stack import context_stack_impl

def snapshot():
  stack = context_stack_impl.context_stack
  return dict(
      environ=dict(os.environ),
      signals={{int(s): signal.getsignal(s) for s in signal.valid_signals()
               if s not in (signal.SIGKILL, signal.SIGSTOP)}},
      hooks=(sys.excepthook, sys.unraisablehook),
      logging=(list(logging.getLogger().handlers), logging.getLogger().level),
      threads=(tf.config.threading.get_intra_op_parallelism_threads(),
               tf.config.threading.get_inter_op_parallelism_threads()),
      tff_context=(stack.current, list(stack._stack)),
      gc=(gc.isenabled(), gc.get_freeze_count(), gc.get_threshold()))

before = snapshot()
from tff_fedadamom.experiment import run_experiment
result = run_experiment({config!r}, progress=False)
after = snapshot()
changed = sorted(k for k in before if before[k] != after[k])
print("changed:", changed)
print("rounds:", result.summary["rounds_completed"], "accuracy:",
      result.summary["final_test_accuracy"] is not None)
"""


def _config(output_dir) -> dict:
  return {
      "seed": 1, "rounds": 3, "clients_per_round": 2, "eval_every": 2, "checkpoint_every": 1,
      "output_dir": str(output_dir),
      "data": {"name": "digits", "num_clients": 4},
      "model": {"name": "logistic"},
      "client": {"learning_rate": 0.1, "batch_size": 32},
      "server": {"optimizer": "fedadamom", "learning_rate": 1.0},
      "runtime": {"cache": False},
  }


def _library_program(tmp_path):
  program = PROGRAM.format(config=_config(tmp_path / "run"))
  return subprocess.run([sys.executable, "-c", program], cwd=tmp_path, capture_output=True,
                        text=True, timeout=600,
                        env={**os.environ, "PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "2"})


def test_a_library_run_changes_nothing_process_wide_and_exits_cleanly(tmp_path):
  out = _library_program(tmp_path)
  assert out.returncode == 0, out.stderr
  assert "changed: []" in out.stdout.splitlines(), out.stdout
  assert "rounds: 3 accuracy: True" in out.stdout.splitlines()
  # TFF's default context would fail in its __del__ at teardown ("Exception
  # ignored ... 'NoneType' object has no attribute 'Popen'") were it not
  # released at exit by the program's session.
  assert "Traceback" not in out.stderr and "Exception ignored" not in out.stderr, out.stderr

