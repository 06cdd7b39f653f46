"""Server optimizers: FedAdamom and the registry of its baselines."""

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
    tunable_hparams,
)

__all__ = [
    "OPTIMIZERS",
    "OptimizerSpec",
    "build_fedadamom",
    "build_server_optimizer",
    "default_hparams",
    "get_spec",
    "list_optimizers",
    "resolve_hparams",
    "search_ranges",
    "tunable_hparams",
]
