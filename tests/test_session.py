"""The entry point's Session sets the environment its process and children need;
a sweep trial that runs in its own process hands its settings to one."""

import os
import subprocess
import sys

from tff_fedadamom.session import Session
from tuning.trainable import trial_session
from tuning.workers import worker_env

MARK = "TFF_FEDADAMOM_SESSION_TEST"


def test_apply_sets_the_environment_a_child_process_inherits(monkeypatch):
  monkeypatch.setenv(MARK, "before")  # restored when the test ends
  session = Session(environ={MARK: "after"})  # the test run's threads: applied already
  assert session.apply() is session
  assert os.environ[MARK] == "after"
  child = subprocess.run([sys.executable, "-c", f"import os; print(os.environ['{MARK}'])"],
                         capture_output=True, text=True, check=True)
  assert child.stdout.strip() == "after"


def test_a_session_without_environ_leaves_the_environment_alone():
  before = dict(os.environ)
  Session().apply()
  assert dict(os.environ) == before
  assert hash(Session(threads=2)) == hash(Session(threads=2, environ={MARK: "x"}))


def test_a_trial_in_its_own_process_sizes_its_threads_and_devices():
  cpu = trial_session(3, gpu=False)
  assert cpu.threads == 3 and cpu.environ == worker_env(3, [])
  assert cpu.environ["CUDA_VISIBLE_DEVICES"] == ""  # kept off the node's GPUs
  gpu = trial_session(2, gpu=True)
  # Ray shows a GPU trial its devices: the session leaves them as Ray set them.
  assert gpu.threads == 2 and "CUDA_VISIBLE_DEVICES" not in gpu.environ
  assert gpu.environ["TF_NUM_INTEROP_THREADS"] == "2"
  assert gpu.environ["TF_NUM_INTRAOP_THREADS"] == "1"
