"""Experiment configs: typed schema, safe YAML loading, dotted overrides, one error type."""

from tff_fedadamom.config.errors import ConfigError
from tff_fedadamom.config.loader import (apply_overrides, config_to_dict, dump_config,
                                         load_config, parse_config)
from tff_fedadamom.config.schema import (ClientConfig, DataConfig, ExperimentConfig,
                                         ModelConfig, RuntimeConfig, ServerConfig)

__all__ = ["ClientConfig", "ConfigError", "DataConfig", "ExperimentConfig", "ModelConfig",
           "RuntimeConfig", "ServerConfig", "apply_overrides", "config_to_dict", "dump_config",
           "load_config", "parse_config"]
