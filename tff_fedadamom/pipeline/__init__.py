"""The TFF pipeline: config -> learning process -> rounds, checkpoints and outputs."""

from tff_fedadamom.pipeline.process import build_process
from tff_fedadamom.pipeline.runner import EvalEvent, RunResult, run_experiment

__all__ = ["EvalEvent", "RunResult", "build_process", "run_experiment"]
