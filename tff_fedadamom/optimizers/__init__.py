"""Server optimizers: FedAdamom and the registry of its baselines (server optimizers and
the client-adaptive learning processes of `tff_fedadamom.algorithms`)."""

from tff_fedadamom.optimizers.adaptive import build_fedadam
from tff_fedadamom.optimizers.adaptive import build_fedamsgrad
from tff_fedadamom.optimizers.adaptive import build_fedyogi
from tff_fedadamom.optimizers.fadas import build_fadas
from tff_fedadamom.optimizers.fedadamom import build_fedadamom
from tff_fedadamom.optimizers.registry import (
    LEARNING_PROCESS,
    OPTIMIZERS,
    SERVER_OPTIMIZER,
    OptimizerSpec,
    build_server_optimizer,
    check_hparams,
    default_hparams,
    get_spec,
    is_learning_process,
    list_optimizers,
    resolve_hparams,
    search_ranges,
    sweepable_hparams,
    tunable_hparams,
)

__all__ = [
    "LEARNING_PROCESS",
    "OPTIMIZERS",
    "SERVER_OPTIMIZER",
    "OptimizerSpec",
    "build_fadas",
    "build_fedadam",
    "build_fedadamom",
    "build_fedamsgrad",
    "build_fedyogi",
    "build_server_optimizer",
    "check_hparams",
    "default_hparams",
    "get_spec",
    "is_learning_process",
    "list_optimizers",
    "resolve_hparams",
    "search_ranges",
    "sweepable_hparams",
    "tunable_hparams",
]
