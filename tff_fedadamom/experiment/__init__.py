"""The TFF pipeline: config -> learning process -> rounds, checkpoints and outputs.

Names are imported lazily (`tff_fedadamom.lazy`): importing a light module of the
pipeline (`outputs`, `loop`) does not import TensorFlow.
"""

from tff_fedadamom.lazy import lazy_exports

_EXPORTS = {
    "EvalEvent": "tff_fedadamom.experiment.loop",
    "RunResult": "tff_fedadamom.experiment.runner",
    "build_process": "tff_fedadamom.experiment.process",
    "iter_experiment": "tff_fedadamom.experiment.runner",
    "run_experiment": "tff_fedadamom.experiment.runner",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
