"""Server optimizers: FedAdamom and its server-side baselines, as TFF optimizers.

The registry of every method (these and the client-adaptive learning processes
of `tff_fedadamom.algorithms`) sits above both, in `tff_fedadamom.methods`.
Names are imported lazily (`tff_fedadamom.lazy`).
"""

from tff_fedadamom.lazy import lazy_exports

_EXPORTS = {
    "build_fedadam": "tff_fedadamom.optimizers.adaptive",
    "build_fedamsgrad": "tff_fedadamom.optimizers.adaptive",
    "build_fedyogi": "tff_fedadamom.optimizers.adaptive",
    "build_fadas": "tff_fedadamom.optimizers.fadas",
    "build_fedadamom": "tff_fedadamom.optimizers.fedadamom",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
