"""FedAdamom for TensorFlow Federated: optimizer, YAML pipeline, sweeps.

Public names are imported lazily: `import tff_fedadamom` (and `--help`) loads
no TensorFlow, and changes nothing process-wide (environment, signal handlers,
logging). The command quiets TensorFlow's C++ start-up lines for itself; a
program that wants the same sets, before TensorFlow is imported,

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
"""

from tff_fedadamom.lazy import lazy_exports

__version__ = "0.1.0"

_EXPORTS = {
    "build_fedadamom": "tff_fedadamom.optimizers",
    "build_server_optimizer": "tff_fedadamom.methods",
    "list_optimizers": "tff_fedadamom.methods",
    "load_config": "tff_fedadamom.config",
    "build_process": "tff_fedadamom.experiment",
    "run_experiment": "tff_fedadamom.experiment",
    "InProcessLearningProcess": "tff_fedadamom.runtime.inprocess",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
