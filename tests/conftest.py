"""Shared test set-up: quiet TensorFlow, and no TFF worker_binary left behind."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

from tff_fedadamom.pipeline import runtime  # noqa: E402
from tff_fedadamom.session import Session  # noqa: E402

runtime.install_worker_cleanup()
# The test run is an entry point: it sizes TensorFlow's threads, as the CLI does.
Session().apply()


def pytest_sessionfinish(session, exitstatus):
  del session, exitstatus
  runtime.shutdown()
