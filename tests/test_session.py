"""The entry point's Session sets the environment its process and children need;
a library run needs none."""

import os
import subprocess
import sys

from tff_fedadamom.session import Session

MARK = "TFF_FEDADAMOM_SESSION_TEST"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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


# A function AutoGraph converts (a Python `if` on a tensor), then the paths of
# the files AutoGraph wrote for this process's converted functions.
CONVERT_A_FUNCTION = """
import tensorflow as tf
from tff_fedadamom.session import autograph_files

@tf.function
def bump(x):
  if x > 0:
    x += 1
  return x

assert int(bump(tf.constant(1))) == 2
written = autograph_files()
"""


def test_the_files_autograph_wrote_are_removed_and_the_converted_code_still_runs():
  import tensorflow as tf

  from tff_fedadamom.session import autograph_files, remove_autograph_files

  @tf.function
  def bump(x):
    if x > 0:  # a Python `if` on a tensor: AutoGraph converts `bump`
      x += 1
    return x

  before = set(autograph_files())
  assert int(bump(tf.constant(1))) == 2
  written = set(autograph_files()) - before
  assert written and all(os.path.exists(path) for path in written)
  removed = remove_autograph_files()
  assert written <= set(removed)
  assert not any(os.path.exists(path) for path in removed)
  assert int(bump(tf.constant(-3))) == -3  # a new trace of the converted code


def test_a_session_that_exits_with_its_parent_ends_when_the_parent_is_killed(tmp_path):
  """A child applies `Session(exit_with_parent=True)` and sleeps; its parent is
  killed with SIGKILL; the child ends within seconds instead of running on, and
  removes the files AutoGraph wrote for it (its exit handlers do not run)."""
  import signal
  import subprocess
  import sys
  import time

  from tff_fedadamom import process_table as processes

  pid_file, files = tmp_path / "child.pid", tmp_path / "autograph_files"
  child_py, parent_py = tmp_path / "child.py", tmp_path / "parent.py"
  child_py.write_text(
      "import os, time\n"
      "from tff_fedadamom.session import Session\n"
      "Session(threads=1, exit_with_parent=True).apply()\n"
      + CONVERT_A_FUNCTION +
      f"open({str(files)!r}, 'w').write('\\n'.join(written))\n"
      f"open({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
      "time.sleep(120)\n")
  parent_py.write_text(
      "import subprocess, sys, time\n"
      f"subprocess.Popen([sys.executable, {str(child_py)!r}])\n"
      "time.sleep(120)\n")
  script = parent_py.read_text()
  parent = subprocess.Popen([sys.executable, "-c", script],
                            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  try:
    deadline = time.monotonic() + 120
    while not pid_file.exists() or not pid_file.read_text():
      assert time.monotonic() < deadline, "the child never applied its session"
      time.sleep(0.2)
    child = int(pid_file.read_text())
  finally:
    parent.send_signal(signal.SIGKILL)
    parent.wait()
  deadline = time.monotonic() + 15
  while processes.still_running([child]) and time.monotonic() < deadline:
    time.sleep(0.2)
  left = processes.still_running([child])
  if left:
    os.kill(child, signal.SIGKILL)
  assert not left, "the child outlived its killed parent"
  written = files.read_text().split()
  assert written and not any(os.path.exists(path) for path in written)


STARTUP_PROGRAM = """
import gc, weakref
from tff_fedadamom.session import startup_imports

class Node:
  pass

def cycle():
  a, b = Node(), Node()
  a.other, b.other = b, a
  return a

gc.collect()
before = gc.get_freeze_count()
with startup_imports():
  inside = gc.isenabled()
  made = cycle()
  import json  # noqa: F401 - an import in the block
dead = weakref.ref(made)
del made
gc.collect()
after = cycle()
later = weakref.ref(after)
del after
gc.collect()
print(inside, gc.isenabled(), gc.get_freeze_count() > before, dead() is not None, later() is None)
gc.disable()
with startup_imports():
  pass
print(gc.isenabled())
gc.enable()
frozen = gc.get_freeze_count()
with startup_imports(enabled=False):  # a command called by a caller's program
  inside = gc.isenabled()
  kept = cycle()
print(inside, gc.isenabled(), gc.get_freeze_count() == frozen)
"""


def test_startup_imports_freeze_what_the_block_made_and_give_the_collector_back():
  """In the block the collector is off; what it made is frozen (a cycle made in
  it outlives a full collection); a cycle made after it is collected; the
  collector ends as it was before the block (on, or off). Not enabled, the
  block changes nothing."""
  child = subprocess.run([sys.executable, "-c", STARTUP_PROGRAM], capture_output=True,
                         text=True, check=True)
  assert child.stdout.split() == ["False", "True", "True", "True", "True", "False",
                                  "True", "True", "True"]


CLI_PROGRAM = """
import gc, sys
from tff_fedadamom import cli
sweep = {sweep!r}
gc.collect()
status = cli.main(["tune", sweep])
print("caller's program:", status, gc.isenabled(), gc.get_freeze_count())
status = cli.main(["tune", sweep], owns_process=True)
print("command's process:", status, gc.isenabled(), gc.get_freeze_count() > 0)
"""

# `python -m tuning.cli tune`, as its own entry point.
MODULE_PROGRAM = """
import gc, runpy, sys
sys.argv = ["tuning.cli", "tune", {sweep!r}]
try:
  runpy.run_module("tuning.cli", run_name="__main__")
except SystemExit as end:
  print("module's process:", end.code, gc.isenabled(), gc.get_freeze_count() > 0)
"""


def test_the_command_freezes_its_imports_only_in_a_process_of_its_own(tmp_path):
  """`cli.main` called by a program leaves its collector alone; as `entry`
  calls it (`owns_process`), its imports are frozen and the collector is on.
  Shown on `tune` with a sweep it refuses (its imports run, nothing else):
  `run` and `compare` pass the same `owns_process` to `startup_imports`; so
  does `python -m tuning.cli tune`."""
  sweep = tmp_path / "bad.yaml"
  sweep.write_text("name: bad\nbase: {}\noptimizers: [nosuch]\n"
                   f"resources: {{storage_path: {tmp_path / 'sweeps'}}}\n")
  child = subprocess.run([sys.executable, "-c", CLI_PROGRAM.format(sweep=str(sweep))],
                         capture_output=True, text=True, timeout=600,
                         env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
  assert child.returncode == 0, child.stderr
  lines = child.stdout.splitlines()
  assert "caller's program: 2 True 0" in lines, child.stdout
  assert "command's process: 2 True True" in lines, child.stdout
  module = subprocess.run([sys.executable, "-c", MODULE_PROGRAM.format(sweep=str(sweep))],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
  assert "module's process: 2 True True" in module.stdout.splitlines(), module.stderr


# A program as the README shows one: no set-up call, the library's names only.
LIBRARY_RUN = """
import logging, sys
logging.basicConfig(level=logging.WARNING)
from tff_fedadamom import load_config, run_experiment
config = load_config("configs/quickstart.yaml", overrides=[
    "rounds=1", "eval_every=1", "clients_per_round=2", "model.name=logistic",
    "data.name=digits", "data.num_clients=10", "client.max_examples=20",
    f"output_dir={sys.argv[1]}"])
summary = run_experiment(config, progress=False).summary
print("kernel_threads", summary["kernel_threads"], summary["status"])
"""


def test_a_library_run_needs_no_set_up_call_and_exits_cleanly(tmp_path):
  """A fresh program runs an experiment with no `Session` and no other set-up:
  it finishes, records the kernel threads it ran with (warning once when they
  are not one), and exits without a traceback or an 'Exception ignored'."""
  env = {k: v for k, v in os.environ.items() if not k.startswith("TF_NUM_")}
  out = subprocess.run([sys.executable, "-c", LIBRARY_RUN, str(tmp_path / "run")],
                       capture_output=True, text=True, cwd=REPO, env=env, timeout=600)
  text = out.stdout + out.stderr
  assert out.returncode == 0, text
  assert "Traceback" not in text and "Exception ignored" not in text, text
  threads = int(out.stdout.split("kernel_threads")[1].split()[0])
  assert threads == len(os.sched_getaffinity(0))  # TensorFlow's default: every CPU
  assert out.stdout.strip().endswith("completed"), text
  assert (text.count("TensorFlow runs each kernel on") == (threads != 1)), text
