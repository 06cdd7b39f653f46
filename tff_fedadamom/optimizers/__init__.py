"""Server optimizers: FedAdamom and the registry of its baselines."""

from tff_fedadamom.optimizers.adaptive import build_fedadam
from tff_fedadamom.optimizers.adaptive import build_fedamsgrad
from tff_fedadamom.optimizers.adaptive import build_fedyogi
from tff_fedadamom.optimizers.fadas import build_fadas
from tff_fedadamom.optimizers.fedadamom import build_fedadamom
from tff_fedadamom.optimizers.registry import (
    OPTIMIZERS,
    OptimizerSpec,
    build_server_optimizer,
    default_hparams,
    get_spec,
    list_optimizers,
    resolve_hparams,
    search_ranges,
    sweepable_hparams,
    tunable_hparams,
)

__all__ = [
    "OPTIMIZERS",
    "OptimizerSpec",
    "build_fadas",
    "build_fedadam",
    "build_fedadamom",
    "build_fedamsgrad",
    "build_fedyogi",
    "build_server_optimizer",
    "default_hparams",
    "get_spec",
    "list_optimizers",
    "resolve_hparams",
    "search_ranges",
    "sweepable_hparams",
    "tunable_hparams",
]
