"""Faults a long run meets: kill -9, signals, corrupt checkpoints and metrics files."""

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import yaml

from tests import process_table as processes
from tff_fedadamom.experiment import outputs, run_experiment
from tests.helpers import ROOT, relay_and_worker, saved_weights, tiny


def _start(config_path):
  # Its temporary files go beside its config: a run killed with SIGKILL never
  # removes the sources AutoGraph wrote for it (`session.remove_autograph_files`).
  scratch = os.path.join(os.path.dirname(config_path), "tmp")
  os.makedirs(scratch, exist_ok=True)
  env = {**os.environ, "PYTHONPATH": ROOT, "TMPDIR": scratch}
  # A job started in the background by a non-interactive shell inherits SIGINT
  # ignored, and so would the run. The child gets the default disposition, as from a
  # terminal, by spawning it while this process has a handler (dispositions other
  # than "ignore" reset at exec). No preexec_fn: it is unsafe in a threaded process.
  previous = signal.signal(signal.SIGINT, signal.default_int_handler)
  try:
    return subprocess.Popen([sys.executable, "-m", "tff_fedadamom", "run", str(config_path),
                             "--quiet"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env=env, start_new_session=True)
  finally:
    signal.signal(signal.SIGINT, previous)


def _rows(output_dir):
  try:
    return len(outputs.read_metrics(output_dir))
  except Exception:  # noqa: BLE001 - a file mid-write
    return 0


def _wait_for_rows(proc, output_dir, n, timeout=240):
  deadline = time.time() + timeout
  while time.time() < deadline:
    if _rows(output_dir) >= n:
      return
    if proc.poll() is not None:
      raise AssertionError(f"run ended early: {proc.stderr.read().decode()[-2000:]}")
    time.sleep(0.05)
  raise AssertionError("timed out waiting for rounds")


def _descendants(pid):
  return processes.descendants(pid)


def _alive(pids, timeout=10.0):
  """The pids that still run (zombies count as ended) after up to `timeout` s."""
  deadline = time.time() + timeout
  while True:
    alive = processes.still_running(pids)
    if not alive or time.time() > deadline:
      return alive
    time.sleep(0.1)


BACKENDS = ["inprocess", "tff_cpp"]
# Asynchronous steps on the in-process backend: its checkpoints hold the models
# of the clients still in flight too.
ASYNC = "asynchronous"


def _run(out, backend, **overrides):
  raw = tiny(out, runtime={"backend": "inprocess" if backend == ASYNC else backend},
             **overrides)
  if backend == ASYNC:
    raw[ASYNC] = {"concurrency": 5, "buffer_size": 2, "max_staleness": 4}
  return raw


@pytest.fixture(scope="module")
def run_on(run_shared):
  """`run_on(backend, raw)`: the in-process runs share the session's parts."""

  def run(backend, raw):
    if backend in ("inprocess", ASYNC):
      return run_shared(raw)
    return run_experiment(raw, progress=False)

  return run


@pytest.fixture(scope="module")
def references(tmp_path_factory, run_on):
  """An uninterrupted 5-round run per backend, made when first asked for."""
  made = {}

  def get(backend):
    if backend not in made:
      out = tmp_path_factory.mktemp(f"ref_{backend}") / "run"
      made[backend] = run_on(backend, _run(out, backend, rounds=5))
    return made[backend]

  return get


@pytest.fixture(scope="module")
def reference(references):
  return references("inprocess")


def _check_children(children, backend):
  """inprocess starts no process; tff_cpp starts TFF's worker, a child of its
  relay (`tff_cpp_relay`), which is the run's child."""
  if backend in ("inprocess", ASYNC):
    assert children == [], "an in-process run starts no child process"
  else:
    relay_and_worker(children)


@pytest.mark.parametrize("backend", BACKENDS + [ASYNC])
def test_kill_9_then_rerun_finishes_identically(tmp_path, references, run_on, backend):
  out = tmp_path / "run"
  config = tmp_path / "c.yaml"
  config.write_text(yaml.safe_dump(_run(out, backend, rounds=5)))
  proc = _start(config)
  _wait_for_rows(proc, out, 2)
  children = _descendants(proc.pid)
  _check_children(children, backend)
  os.kill(proc.pid, signal.SIGKILL)
  proc.wait(timeout=30)
  # A worker was tied to its parent: it died with it.
  assert _alive(children) == []
  reference = references(backend)
  result = run_on(backend, _run(out, backend, rounds=5))
  assert result.summary["status"] == "completed"
  assert result.summary["final_test_accuracy"] == reference.summary["final_test_accuracy"]
  for a, b in zip(saved_weights(out), saved_weights(reference.output_dir), strict=True):
    np.testing.assert_array_equal(a, b)
  assert [r["round"] for r in outputs.read_metrics(out)] == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signals_mid_run_leave_no_child(tmp_path, sig, backend):
  out = tmp_path / "run"
  config = tmp_path / "c.yaml"
  config.write_text(yaml.safe_dump(_run(out, backend, rounds=200, eval_every=50)))
  proc = _start(config)
  _wait_for_rows(proc, out, 1)
  children = _descendants(proc.pid)
  _check_children(children, backend)
  os.kill(proc.pid, sig)
  proc.wait(timeout=60)
  assert proc.returncode != 0
  assert _alive(children) == []


def test_corrupt_latest_checkpoint_falls_back_to_previous(tmp_path, run_shared, reference):
  out = tmp_path / "run"
  run_shared(_run(out, "inprocess", rounds=3))
  latest = out / outputs.CHECKPOINT_DIR / "round_3"
  assert latest.is_dir()
  for root, _, files in os.walk(latest):
    for name in files:
      with open(os.path.join(root, name), "r+b") as f:
        f.truncate(7)
  result = run_shared(_run(out, "inprocess", rounds=5))
  assert result.summary["resumed_from_round"] == 2
  for a, b in zip(saved_weights(out), saved_weights(reference.output_dir), strict=True):
    np.testing.assert_array_equal(a, b)


def test_every_checkpoint_corrupt_is_a_clear_error(tmp_path, run_shared):
  out = tmp_path / "run"
  run_shared(_run(out, "inprocess", rounds=2))
  for root, _, files in os.walk(out / outputs.CHECKPOINT_DIR):
    for name in files:
      open(os.path.join(root, name), "wb").close()
  with pytest.raises(RuntimeError, match="every checkpoint .* is unreadable"):
    run_shared(_run(out, "inprocess", rounds=3))


def test_truncated_metrics_file_is_repaired(tmp_path, run_shared, reference):
  out = tmp_path / "run"
  run_shared(_run(out, "inprocess", rounds=3))
  path = out / outputs.METRICS_FILE
  text = path.read_text()
  path.write_text(text[: len(text) - 25])  # the last row cut short, as by a kill
  assert outputs.repair_metrics(str(out), 3) == 2
  path.write_text(text[: len(text) - 25])
  result = run_shared(_run(out, "inprocess", rounds=5))
  assert result.summary["resumed_from_round"] == 2  # the checkpoint its rows cover
  assert [r["round"] for r in outputs.read_metrics(out)] == [1, 2, 3, 4, 5]
  assert result.summary["final_test_accuracy"] == reference.summary["final_test_accuracy"]


def test_repair_metrics_drops_rows_past_the_checkpoint(tmp_path):
  path = tmp_path / outputs.METRICS_FILE
  path.write_text("round,a\n1,0.5\n2,0.4\n3,0.3\n4,0.")
  assert outputs.repair_metrics(str(tmp_path), 2) == 2
  assert path.read_text().splitlines() == ["round,a", "1,0.5", "2,0.4"]
  path.write_text("\x00\x01garbage")
  assert outputs.repair_metrics(str(tmp_path), 2) == 0
  assert (tmp_path / (outputs.METRICS_FILE + ".corrupt")).exists()
