"""The expensive, reusable parts of an experiment, and when they can be reused.

A run's data, learning process, Keras model and evaluator depend neither on the
values TFF keeps in the process *state* (the server optimizer's hparams its
`get_hparams` exposes, and the client learning rate where
`process.client_lr_in_state`) nor on run-only settings (`RUN_ONLY_FIELDS`). So
configs that differ only there share one `ExperimentParts`: a run starts from
`process.initialize()` with its own values put in by `set_hparams`
(`initial_state`), leaf for leaf the initial state of a process built from its
own config. Everything else (data, model, batching, seed, a learning-rate
schedule, which bakes the base rate into the computation, ...) is part of
`structure_key` and builds anew. `parts_cache.PartsCache` keeps the parts of
the last few structure keys.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any, Optional

import numpy as np

from tff_fedadamom.config import ExperimentConfig, config_to_dict, schema
from tff_fedadamom.experiment.evaluation import Evaluator
from tff_fedadamom.experiment.plan import RunPlan

# Settings no part depends on (TensorFlow's thread count is set once per process,
# before TensorFlow starts). The rest of `runtime` (backend, devices, concurrent
# clients) shapes the executable process, so it keys the structure.
RUN_ONLY_FIELDS = ("output_dir", "name", "rounds", "runtime.threads", "runtime.cache",
                   "runtime.cache_dir")
# Fields of the structure key the compiled learning process does not depend on
# (`process_structure`): it sees the data only through `process.data_signature`,
# iterates whatever batches it is given, and a round's clients are its arguments.
PROCESS_FREE_FIELDS = ("runtime", "eval_every", "checkpoint_every", "telemetry", "targets",
                       "data", "clients_per_round", "client.batch_size",
                       "client.local_epochs", "client.max_examples")


@dataclasses.dataclass(frozen=True)
class ExperimentParts:
  """What `run_experiment` builds before its first round, for one structure key."""

  key: str  # the `structure_key` of the configs these parts serve
  data: Any
  process: Any  # the run's backend (`runtime.base.Backend`)
  keras_model: Any  # what the global weights are evaluated and saved with
  layer_names: tuple  # `layer_labels(keras_model)`
  evaluator: Evaluator  # over `keras_model`


def layer_labels(keras_model) -> list[str]:
  """Stable names of the trainable variables, in TFF's order: position plus the
  variable path without Keras' per-process uniquifying suffix ('dense_3' ->
  'dense'), so that a resumed run writes the same metric columns."""
  labels = []
  for i, variable in enumerate(keras_model.trainable_variables):
    parts = variable.name.split(":")[0].split("/")
    parts[0] = re.sub(r"_\d+$", "", parts[0])
    labels.append(f"{i:02d}_" + "/".join(parts))
  return labels


# The config path of the client learning rate, where the process state holds it.
CLIENT_LR_PATH = "client.learning_rate"


def state_hparams(config: ExperimentConfig, optimizer=None) -> dict[str, tuple[str, str]]:
  """Config paths whose values live in the process state -> their (component,
  hparam) in `process.get_hparams(state)`. Server hparams are those the server
  optimizer's (`optimizer`, if the caller built it) `get_hparams` returns: none
  under a learning-rate schedule, which closes over the base rate, nor for
  whole learning processes (FedCAda, FAFED)."""
  import tensorflow as tf

  from tff_fedadamom.methods import is_learning_process
  from tff_fedadamom.experiment import process as process_lib

  if is_learning_process(config.server.optimizer):
    return {}
  if optimizer is None:
    optimizer = process_lib.build_server_optimizer(config)
  held = optimizer.get_hparams(optimizer.initialize(tf.TensorSpec([1], tf.float32)))
  out = {f"server.{name}": ("finalizer", name)
         for name in config.server.hparams if name in held}
  if process_lib.client_lr_in_state(config):
    out[CLIENT_LR_PATH] = ("client_work", "learning_rate")
  return out


def _drop(tree: dict, path: str) -> None:
  *parents, leaf = path.split(".")
  for name in parents:
    tree = tree.get(name, {})
  tree.pop(leaf, None)


def structure_key(config: ExperimentConfig, paths=None) -> str:
  """A string equal for two configs exactly when they can share parts: the whole
  config without `RUN_ONLY_FIELDS` and the paths of `state_hparams` (`paths`, if
  the caller has them). A validated config has every server hparam filled in,
  so a default left out and the same value written out give the same key."""
  tree = config_to_dict(config)
  for path in (*RUN_ONLY_FIELDS, *(state_hparams(config) if paths is None else paths)):
    _drop(tree, path)
  return json.dumps(tree, sort_keys=True, default=repr)


def process_structure(key: str, signature: dict) -> str:
  """A `structure_key` without `PROCESS_FREE_FIELDS`, plus the `data_signature`:
  what the compiled learning process depends on (the process cache's key)."""
  tree = json.loads(key)
  for path in PROCESS_FREE_FIELDS:
    _drop(tree, path)
  tree["data_signature"] = signature
  return json.dumps(tree, sort_keys=True)


def make_plan(config) -> RunPlan:
  """The `RunPlan` of `config` (a plan is returned as it is; anything else goes
  through `load_config`): the one place a run's derived values are worked out.
  The server optimizer is built here, once, for `state_hparams` and for the
  process built from the plan.
  """
  from tff_fedadamom.config import load_config
  from tff_fedadamom.config.schema import RAY, resolved_backend
  from tff_fedadamom.methods import is_learning_process
  from tff_fedadamom import runtime as backends
  from tff_fedadamom.experiment import process as process_lib

  if isinstance(config, RunPlan):
    return config
  config = load_config(config)
  optimizer = (None if is_learning_process(config.server.optimizer)
               else process_lib.build_server_optimizer(config))
  paths = state_hparams(config, optimizer)
  backend = resolved_backend(config.runtime)  # the run's one resolution of 'auto'
  ray = backends.ray_settings(backend, config.runtime)
  return RunPlan(config=config, backend=backend,
                 devices=tuple(backends.round_devices(backend, config.runtime, ray)),
                 threads=None if backend == RAY else config.runtime.threads, ray=ray,
                 key=structure_key(config, paths), state_paths=paths,
                 server_optimizer=optimizer)


def build_parts(config, data=None, evaluator: Optional[Evaluator] = None,
                client_tensors=None) -> ExperimentParts:
  """Builds the parts of `config` (a `RunPlan`, or a config planned here). The
  pieces given were made for a config of the same `data_key`, `evaluator_key`
  and `client_tensors_key` (`parts_cache`); processes built on the same client
  tensors share their clients' computations (`tf_computation._slot_pool`)."""
  from tff_fedadamom import runtime as backends
  from tff_fedadamom.experiment import process as process_lib

  plan = make_plan(config)
  config = plan.config
  data = data if data is not None else process_lib.load_data(config)
  tensors = (client_tensors if client_tensors is not None
             else process_lib.make_client_tensors(config, data))
  process = backends.build_backend(plan, learning_process(plan, data, client_tensors=tensors),
                                   tensors)
  if evaluator is None:
    evaluator = Evaluator(config, data, process_lib.make_keras_model(config, data))
  keras_model = evaluator.keras_model
  return ExperimentParts(
      key=plan.key, data=data, process=process, keras_model=keras_model,
      layer_names=tuple(layer_labels(keras_model)), evaluator=evaluator)


def learning_process(config, data, client_tensors=None):
  """What `backends.build_backend` runs for `config` (a `RunPlan`, or a config
  planned here): TFF's process for `tff_cpp`; else its `CompiledProcess`, from
  the machine's process cache when `runtime.cache` is on, its clients' steps
  unrolled where `process.unrolled_steps` says."""
  from tff_fedadamom.config.schema import TFF_CPP
  from tff_fedadamom.experiment import process as process_lib
  from tff_fedadamom.runtime.compiled import compile_process
  from tff_fedadamom.experiment.plan import training_loop

  plan = make_plan(config)
  config = plan.config

  def build(config, steps=None):
    return process_lib.build_process(config, data, training_loop(plan.devices),
                                     server_optimizer=plan.server_optimizer, unroll_steps=steps)

  if plan.backend == TFF_CPP:
    return build(config)
  if client_tensors is None:
    client_tensors = process_lib.make_client_tensors(config, data)
  steps = process_lib.unrolled_steps(config, plan.backend, client_tensors)
  # A compiled process serves every config of its structure (`initial_state`
  # sets their values), so it is built at the default client learning rate: the
  # rates a sweep samples share one traced client work.
  built_from = config
  if CLIENT_LR_PATH in plan.state_paths:
    built_from = dataclasses.replace(config, client=dataclasses.replace(
        config.client, learning_rate=schema.ClientConfig().learning_rate))
  if not config.runtime.cache:
    return compile_process(build(built_from, steps))
  from tff_fedadamom.runtime.process_cache import ProcessCache, process_key

  return ProcessCache(config.runtime.cache_dir).get_or_build(
      process_key(process_structure(
          plan.key, process_lib.data_signature(config, data, unroll_steps=steps))),
      lambda: compile_process(build(built_from, steps)))


def initial_state(config, process):
  """`process.initialize()` with the state-held hparams of `config` (a
  `RunPlan`, or a config) set in: this config's initial state, for a process
  built from any config of its `structure_key`. Values go through `set_hparams`,
  so they take the dtypes of the state's leaves; when the state holds them
  already, the call (whose first is not free) is skipped.
  """
  if isinstance(config, RunPlan):
    config, paths = config.config, config.state_paths
  else:
    paths = state_hparams(config)
  state = process.initialize()
  if not paths:
    return state
  hparams = process.get_hparams(state)
  values = config_to_dict(config)  # server hparams flat, every one resolved
  same = True
  for path, (component, name) in paths.items():
    section, field = path.split(".")
    held = np.asarray(hparams[component][name])
    same = same and np.array_equal(np.asarray(values[section][field], held.dtype), held)
    hparams[component][name] = values[section][field]
  return state if same else process.set_hparams(state, hparams)
