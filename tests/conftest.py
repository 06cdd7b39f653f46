"""Shared test set-up: quiet TensorFlow, TFF's default context confined (its
worker ended with the session), process and data caches of the session's own, and
experiment parts (data, built process, Keras model) shared by the session."""

import os
import shutil
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
# Compiled learning processes are cached for this test session only (every run,
# trial and subprocess of the session shares it; the user's cache is not touched).
# Under pytest-xdist the controller makes the directory and its workers, which
# inherit its environment, use it too: a structure is built once per session.
_SESSION_CACHE_ENV = "TFF_FEDADAMOM_TEST_SESSION_CACHE"
_OWNS_CACHE = _SESSION_CACHE_ENV not in os.environ
if _OWNS_CACHE:
  os.environ[_SESSION_CACHE_ENV] = tempfile.mkdtemp(prefix="tff-fedadamom-test-cache-")
_PROCESS_CACHE = os.environ[_SESSION_CACHE_ENV]
os.environ["TFF_FEDADAMOM_CACHE_DIR"] = _PROCESS_CACHE
# So are decompressed dataset files (`data.datasets.idx`), in a folder of it.
os.environ["TFF_FEDADAMOM_DATA_CACHE_DIR"] = os.path.join(_PROCESS_CACHE, "data")

import pytest  # noqa: E402

from tff_fedadamom.session import Session, startup_imports  # noqa: E402

# The test run is an entry point: its imports are frozen out of the garbage
# collector's walks, as the CLI's are.
with startup_imports():
  from tensorflow_federated.python.core.impl.context_stack import context_stack_impl
  from tff_fedadamom.config.schema import INPROCESS, resolved_backend
  from tff_fedadamom.runtime import tff_cpp
  import tff_fedadamom.experiment.runner  # noqa: F401

# The test run is an entry point: it sizes TensorFlow's threads, as the CLI does.
Session().apply()
# Tests that call a TFF learning process directly (the parity references) run
# it on TFF's C++ runtime confined as the tff_cpp backend's is; the test run, an
# entry point, makes that TFF's default context (of this, the main, thread)
# instead of the one importing TFF installs, whose worker listens on every
# network interface.
_TFF_CPP = tff_cpp.Runtime()
context_stack_impl.context_stack.set_default_context(_TFF_CPP)


def pytest_sessionfinish(session, exitstatus):
  del session, exitstatus
  _TFF_CPP.close()
  if _OWNS_CACHE:
    shutil.rmtree(_PROCESS_CACHE, ignore_errors=True)


# Tests sharing a module fixture run in one xdist worker (the plugin's doc).
from tests.xdist_groups import pytest_collection_modifyitems  # noqa: E402,F401


@pytest.fixture(scope="session")
def run_shared():
  """`run_shared(raw, **kwargs)`: `run_experiment(raw, progress=False, **kwargs)`
  with parts built once per structure key for the whole session.

  Building a learning process costs seconds; a run on shared parts equals a run
  with its own (tests/experiment/test_parts.py), so tests whose subject is what
  happens across runs (resume, faults, outputs) share them. Only in-process
  runs: Ray's parts hold actors and TFF's C++ runtime's a worker_binary.
  """
  from tff_fedadamom.config import load_config
  from tff_fedadamom.experiment import parts_cache
  from tff_fedadamom.experiment import run_experiment

  cache = parts_cache.PartsCache(max_size=6)
  used = {}

  def run(raw, **kwargs):
    config = load_config(raw)
    assert resolved_backend(config.runtime) == INPROCESS, config.runtime
    parts = cache.get(config)
    used[id(parts.process)] = parts.process
    return run_experiment(config, progress=False, parts=parts, **kwargs)

  yield run
  for process in used.values():
    process.close()


@pytest.fixture
def two_node_cluster(monkeypatch):
  """The address ("127.0.0.1:<port>") of a two-node Ray cluster on loopback, 1
  CPU a node, started for the test and ended after it (`helpers.two_node_cluster`
  says how and why)."""
  from tests import helpers

  yield from helpers.two_node_cluster(monkeypatch)
