"""Server optimizers: FedAdamom and the registry of its baselines (server optimizers and
the client-adaptive learning processes of `tff_fedadamom.algorithms`).

Names are imported lazily (`tff_fedadamom.lazy`): importing a module of this
package, such as the state vocabulary `optimizers.state`, does not run the
registry, which imports `tff_fedadamom.algorithms`, which imports that
vocabulary.
"""

from tff_fedadamom.lazy import lazy_exports

_EXPORTS = {
    "build_fedadam": "tff_fedadamom.optimizers.adaptive",
    "build_fedamsgrad": "tff_fedadamom.optimizers.adaptive",
    "build_fedyogi": "tff_fedadamom.optimizers.adaptive",
    "build_fadas": "tff_fedadamom.optimizers.fadas",
    "build_fedadamom": "tff_fedadamom.optimizers.fedadamom",
    "LEARNING_PROCESS": "tff_fedadamom.optimizers.registry",
    "OPTIMIZERS": "tff_fedadamom.optimizers.registry",
    "SERVER_OPTIMIZER": "tff_fedadamom.optimizers.registry",
    "OptimizerSpec": "tff_fedadamom.optimizers.registry",
    "build_server_optimizer": "tff_fedadamom.optimizers.registry",
    "check_hparams": "tff_fedadamom.optimizers.registry",
    "default_hparams": "tff_fedadamom.optimizers.registry",
    "get_spec": "tff_fedadamom.optimizers.registry",
    "is_learning_process": "tff_fedadamom.optimizers.registry",
    "list_optimizers": "tff_fedadamom.optimizers.registry",
    "resolve_hparams": "tff_fedadamom.optimizers.registry",
    "search_ranges": "tff_fedadamom.optimizers.registry",
    "sweepable_hparams": "tff_fedadamom.optimizers.registry",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
