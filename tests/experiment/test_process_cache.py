"""The compiled-process bundle and the machine-wide process cache: a run from a
cached process is the run that builds its own, and the cache survives what a
machine does to files (corruption, old versions, killed writers, concurrent
builders, a size bound)."""

import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

from tff_fedadamom.config import ConfigError, load_config
from tff_fedadamom.experiment import parts as parts_lib
from tff_fedadamom.experiment import process as process_lib
from tff_fedadamom.runtime import process_cache as cache_lib
from tff_fedadamom.runtime.compiled import CompiledProcess, compile_process
from tff_fedadamom.runtime.inprocess import InProcessLearningProcess
from tests.helpers import ROOT, metrics_rows, state_leaves, tiny_config


@pytest.fixture(scope="module")
def built():
  config = tiny_config()
  data = process_lib.load_data(config)
  process = process_lib.build_process(config, data)
  return config, data, process, compile_process(process)


def _three_rounds(source, config, data):
  runner = InProcessLearningProcess(source, client_tensors=process_lib.make_client_tensors(
      config, data))
  try:
    state = runner.initialize()
    for r in range(1, 4):
      state = runner.next_for_clients(state, data.train.client_ids[r:r + 3], r).state
    return state, runner.get_model_weights(state), runner.get_hparams(state)
  finally:
    runner.close()


def test_bundle_round_trip_keeps_containers_and_numbers(built):
  config, data, process, compiled = built
  loaded = CompiledProcess.from_bytes(compiled.to_bytes())
  assert set(loaded.computations) == set(compiled.computations)
  for name, type_spec in compiled.result_types.items():
    assert loaded.result_types[name] == type_spec, name  # containers included
  state, weights, hparams = _three_rounds(loaded, config, data)
  ref_state, ref_weights, ref_hparams = _three_rounds(process, config, data)
  assert type(state) is type(ref_state) and type(weights) is type(ref_weights)
  assert hparams == ref_hparams
  got, want = state_leaves(state), state_leaves(ref_state)
  assert len(got) == len(want) and all(np.array_equal(a, b) for a, b in zip(got, want))


def test_bundle_rejects_what_it_cannot_read(built):
  with pytest.raises(ValueError, match="not a compiled-process bundle"):
    CompiledProcess.from_bytes(b"garbage")


def test_process_key_ignores_state_hparams_run_settings_and_the_clients_data_only():
  def process_key(config):
    signature = process_lib.data_signature(config, process_lib.load_data(config))
    return cache_lib.process_key(
        parts_lib.process_structure(parts_lib.structure_key(config), signature))

  base = tiny_config()
  key = process_key(base)
  # The data reach the process only as client datasets: their partition, count
  # and split seed change no traced computation.
  same = [tiny_config(server={"learning_rate": 0.3}), tiny_config(client={"learning_rate": 0.05}),
          tiny_config(rounds=9, eval_every=3, checkpoint_every=2, telemetry=False),
          tiny_config(runtime={"threads": 1, "max_concurrent_clients": 1, "cache": False}),
          tiny_config(data={"partition": {"kind": "iid"}, "num_clients": 5, "seed": 7,
                            "eval_batch_size": 64}),
          # Batching and client sampling shape the datasets, not the computation.
          tiny_config(clients_per_round=3, client={"batch_size": 7, "local_epochs": 2,
                                                   "max_examples": 11})]
  assert {process_key(c) for c in same} == {key}
  # A dataset of another input shape (synthetic: 60 features, 10 classes).
  other_data = tiny_config(data={"name": "synthetic", "num_clients": 8})
  assert process_lib.data_signature(other_data, process_lib.load_data(other_data))[
      "input_shape"] != process_lib.data_signature(base, process_lib.load_data(base))["input_shape"]
  other = [tiny_config(seed=4), tiny_config(model={"name": "mlp"}),
           tiny_config(client={"clip_norm": 1.0}), tiny_config(server={"optimizer": "fedadam"}),
           other_data]
  keys = {process_key(c) for c in other}
  assert key not in keys and len(keys) == len(other)


def test_runs_that_differ_in_partition_and_batching_share_one_compiled_process(tmp_path):
  """A cached process built on one partition, batching and client count runs
  another's config exactly as that config's own uncached process does.

  Processes on TFF's client loop: one whose clients' steps are unrolled takes
  their batches stacked (its type has the batch size), so it is built for its
  batching; the next test."""
  from tff_fedadamom.experiment import run_experiment

  cache = str(tmp_path / "cache")
  other = {"data": {"partition": {"kind": "iid"}, "num_clients": 6, "seed": 2},
           "client": {"batch_size": 5, "local_epochs": 2, "max_examples": 12},
           "clients_per_round": 2}
  rows = {}
  loop = {"unroll_max_batches": 0}
  for name, sections, runtime in (("first", {}, {"cache_dir": cache, **loop}),
                                  ("shared", other, {"cache_dir": cache, **loop}),
                                  ("own", other, {"cache": False, **loop})):
    config = tiny_config(tmp_path / name, rounds=2, runtime=runtime, **sections)
    run_experiment(config, progress=False)
    rows[name] = metrics_rows(tmp_path / name)
  entries = [n for n in os.listdir(cache) if n.endswith(".tffproc")]
  assert len(entries) == 1, entries  # the second run loaded the first's entry
  assert rows["shared"] == rows["own"] and rows["shared"] != rows["first"]


def test_unrolled_processes_are_cached_per_batching(tmp_path):
  """Two configs that differ only in batch size unroll into two processes; a
  config of the first's batching loads the first's."""
  from tff_fedadamom.experiment import run_experiment

  cache = str(tmp_path / "cache")
  for name, batch in (("a", 16), ("b", 20), ("c", 16)):
    run_experiment(tiny_config(tmp_path / name, rounds=1,
                               client={"batch_size": batch, "max_examples": 40},
                               runtime={"cache_dir": cache, "unroll_max_batches": 16}),
                   progress=False)
    entries = [n for n in os.listdir(cache) if n.endswith(".tffproc")]
    assert len(entries) == {"a": 1, "b": 2, "c": 2}[name], (name, entries)


def test_warm_run_loads_instead_of_building_and_equals_the_run_that_built(tmp_path,
                                                                          monkeypatch):
  """The cold run builds its process (and stores it); the warm one loads the
  stored bytes without building, and runs as the cold one did, row for row."""
  from tff_fedadamom.experiment import run_experiment

  def run(name):
    config = tiny_config(output_dir=tmp_path / name, runtime={"cache_dir": str(tmp_path / "c")})
    return run_experiment(config, progress=False)

  cold = run("cold")
  assert len(cache_lib.ProcessCache(str(tmp_path / "c")).entries()) == 1

  def no_build(*args, **kwargs):
    raise AssertionError("a warm run must not build its learning process")

  with monkeypatch.context() as m:
    m.setattr(process_lib, "build_process", no_build)
    warm = run("warm")
  rows = metrics_rows(cold.output_dir)
  assert len(rows) == 3 and rows == metrics_rows(warm.output_dir)


def _fake(n: int) -> CompiledProcess:
  return CompiledProcess({"work": bytes([n % 251]) * (1000 * n)}, {})


def test_damaged_or_foreign_entries_are_rebuilt_with_a_warning(tmp_path, caplog):
  cache = cache_lib.ProcessCache(str(tmp_path))
  built = []
  cache.get_or_build("k", lambda: built.append(1) or _fake(3))
  path = cache.path("k")
  data = bytearray(open(path, "rb").read())
  data[-10] ^= 0xFF
  open(path, "wb").write(bytes(data))
  with caplog.at_level(logging.WARNING):
    rebuilt = cache.get_or_build("k", lambda: built.append(1) or _fake(3))
    assert rebuilt.computations == _fake(3).computations
  assert "checksum" in caplog.text and len(built) == 2
  os.replace(path, cache.path("other"))  # an entry under the wrong name
  caplog.clear()
  with caplog.at_level(logging.WARNING):
    assert cache.load("other") is None
  assert "holds key 'k'" in caplog.text
  assert cache.load("k") is None  # nothing there now
  caplog.clear()
  cache.store("k", _fake(3))
  stale = open(path, "rb").read().replace(cache_lib.versions()["tensorflow"].encode(), b"0.0.0", 1)
  open(path, "wb").write(stale)
  with caplog.at_level(logging.WARNING):
    assert cache.load("k") is None
  assert "built by" in caplog.text


def test_least_recently_used_entries_go_first(tmp_path):
  size = len(cache_lib._encode(_fake(5), "a"))  # noqa: SLF001
  cache = cache_lib.ProcessCache(str(tmp_path), max_bytes=int(size * 2.5))
  cache.get_or_build("a", lambda: _fake(5))
  cache.get_or_build("b", lambda: _fake(5))
  past = time.time() - 100
  os.utime(cache.path("a"), (past, past))
  os.utime(cache.path("b"), (past - 10, past - 10))
  assert cache.load("b") is not None  # b is now the most recently used
  cache.get_or_build("c", lambda: _fake(5))
  assert sorted(os.path.basename(p) for p, _, _ in cache.entries()) == ["b.tffproc",
                                                                      "c.tffproc"]


def test_concurrent_builders_of_one_key_build_once(tmp_path):
  cache = cache_lib.ProcessCache(str(tmp_path))
  calls, results = [], []

  def build():
    calls.append(1)
    time.sleep(0.5)
    return _fake(7)

  def ask():
    results.append(cache_lib.ProcessCache(str(tmp_path)).get_or_build("k", build))

  threads = [threading.Thread(target=ask) for _ in range(3)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert len(calls) == 1 and len(results) == 3
  assert all(r.computations == _fake(7).computations for r in results)


def test_a_killed_writer_leaves_no_entry_that_loads(tmp_path):
  """A writer killed with SIGKILL between writing and renaming its file."""
  child = textwrap.dedent(f"""
      import os, sys, time
      from tff_fedadamom.runtime import process_cache as c
      from tff_fedadamom.runtime.compiled import CompiledProcess
      def stall(fd):
          print("writing", flush=True)
          time.sleep(60)
      os.fsync = stall
      c.ProcessCache({str(tmp_path)!r}).store("k", CompiledProcess({{"work": b"x" * 10**6}}, {{}}))
  """)
  proc = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True,
                          cwd=ROOT)
  try:
    assert proc.stdout.readline().strip() == "writing"
  finally:
    proc.send_signal(signal.SIGKILL)
    proc.wait()
  assert [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]  # it was mid-write
  cache = cache_lib.ProcessCache(str(tmp_path))
  assert cache.entries() == [] and cache.load("k") is None


def test_cache_settings_are_checked_and_the_cli_turns_it_off():
  from tff_fedadamom.cli import build_parser

  with pytest.raises(ConfigError, match="runtime.cache:.*true or false"):
    load_config({"runtime": {"cache": "no"}})
  with pytest.raises(ConfigError, match="runtime.cache_dir"):
    load_config({"runtime": {"cache_dir": " "}})
  args = build_parser().parse_args(["run", "c.yaml", "--no-cache"])
  assert load_config({}, args.overrides).runtime.cache is False


def test_default_directory_follows_the_environment(monkeypatch, tmp_path):
  monkeypatch.setenv(cache_lib.DIRECTORY_ENV, str(tmp_path / "own"))
  assert cache_lib.default_directory() == str(tmp_path / "own")
  monkeypatch.delenv(cache_lib.DIRECTORY_ENV)
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
  assert cache_lib.default_directory() == str(tmp_path / "xdg" / "tff-fedadamom" / "processes")
  monkeypatch.delenv("XDG_CACHE_HOME")
  monkeypatch.setenv("HOME", str(tmp_path / "home"))
  assert cache_lib.ProcessCache().directory == str(
      tmp_path / "home" / ".cache" / "tff-fedadamom" / "processes")
