"""Shared test set-up: quiet TensorFlow, and no TFF worker_binary left behind."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

from tff_fedadamom.pipeline import runtime  # noqa: E402

runtime.install_worker_cleanup()


def pytest_sessionfinish(session, exitstatus):
  del session, exitstatus
  runtime.shutdown()
