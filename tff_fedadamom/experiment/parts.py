"""The expensive, reusable parts of an experiment, and when they can be reused.

A run needs its data (loaded and partitioned), its learning process (built, and
compiled on first use), the Keras model the global weights are evaluated and
saved with, and the evaluator around it. None of these depends on the values
TFF keeps in the process *state*:

  * the server optimizer's hparams that its `get_hparams` exposes
    (`learning_rate`, `beta_2`, `epsilon`, `momentum`, ...), and
  * the client learning rate, when the process keeps it in its state
    (`client_work=<learning_rate=...>`; see `process.client_lr_in_state`),

nor on run-only settings (`output_dir`, `name`, `rounds`, `runtime.threads`). So two
configs that differ only there can share one `ExperimentParts`: the run starts
from `process.initialize()` with its own values put in by
`process.set_hparams` (`initial_state`), which is the initial state a process
built from its own config has, leaf for leaf. Everything else (data, model,
batch size, local epochs, seed, a learning-rate schedule, which bakes the base
rate into the computation, ...) is part of `structure_key` and builds anew.

`parts_cache.PartsCache` keeps the parts of the last few structure keys for one
process; it is passed explicitly, never a module global.
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

# Settings of a run that no part depends on: where it writes, what it is called,
# how long it runs, TensorFlow's thread count (set once per process, before
# TensorFlow starts), and whether and where compiled processes are cached. The
# rest of `runtime` (backend, devices, concurrent clients) shapes the executable
# process, so it keys the structure.
RUN_ONLY_FIELDS = ("output_dir", "name", "rounds", "runtime.threads", "runtime.cache",
                   "runtime.cache_dir")
# Fields of the structure key that the compiled learning process itself does not
# depend on (where and how rounds run, evaluation and checkpoint cadence): the
# process cache keys on the rest (`process_structure`). The `data` section goes
# too: the process sees the data only through `process.data_signature`, so configs that
# differ only in partition, client count or split seed share one compiled process.
# So do the fields that only shape the clients' datasets or pick the clients:
# TFF's client work iterates whatever batches it is given (the batch dimension
# of its input spec is unknown), and a round's clients are its arguments.
PROCESS_FREE_FIELDS = ("runtime", "eval_every", "checkpoint_every", "telemetry", "targets",
                       "data", "clients_per_round", "client.batch_size",
                       "client.local_epochs", "client.max_examples")


@dataclasses.dataclass(frozen=True)
class ExperimentParts:
  """What `run_experiment` builds before its first round, for one structure key.

  Attributes:
    key: The `structure_key` of the configs these parts serve.
    data: The loaded `FederatedData`.
    process: The run's backend (`runtime.base.Backend`).
    keras_model: The model the global weights are evaluated and saved with.
    layer_names: `layer_labels(keras_model)`.
    evaluator: An `evaluation.Evaluator` over `keras_model`.
  """

  key: str
  data: Any
  process: Any
  keras_model: Any
  layer_names: tuple
  evaluator: Evaluator


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
  """Config paths whose values live in the process state -> where they sit in
  `process.get_hparams(state)` (a (component, hparam) pair).

  Server hparams are asked of the built server optimizer: those its
  `get_hparams` returns. A learning-rate schedule (TFF's
  `schedule_learning_rate`) exposes none, since the schedule closes over the
  base rate; its hparams then all key the structure. Registry entries that are
  whole learning processes (FedCAda, FAFED) are not looked into: all their
  values key the structure. `optimizer`: the config's server optimizer, if the
  caller built it (`make_plan` does, once per run).
  """
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
  config without `RUN_ONLY_FIELDS` and without the paths of `state_hparams`.

  `config` is validated (`load_config`): its server hparams are every hparam
  of its optimizer, the defaults filled in once by the registry, so a default
  left out and the same value written out give the same key. `paths`: the
  config's `state_hparams`, if the caller has them."""
  tree = config_to_dict(config)
  for path in (*RUN_ONLY_FIELDS, *(state_hparams(config) if paths is None else paths)):
    _drop(tree, path)
  return json.dumps(tree, sort_keys=True, default=repr)


def process_structure(key: str, signature: dict) -> str:
  """A `structure_key` without `PROCESS_FREE_FIELDS`, with the `data_signature`
  `signature` in place of the data section: what the config's compiled learning
  process depends on (the process cache's key, with the versions)."""
  tree = json.loads(key)
  for path in PROCESS_FREE_FIELDS:
    _drop(tree, path)
  tree["data_signature"] = signature
  return json.dumps(tree, sort_keys=True)


def make_plan(config) -> RunPlan:
  """The `RunPlan` of `config` (a RunPlan is returned as it is; anything else
  goes through `load_config` first, which returns a validated config as it is).

  The one place a run's derived values are worked out. The server optimizer is
  built here, once: `state_hparams` reads the hparams its state holds, and the
  process built from the plan (`learning_process`) uses the same object.
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
  """Builds the parts of `config` (a `RunPlan`, or a config planned here),
  loading its data unless `data` is given: the process is the plan's backend
  (`backends.build_backend`), compiled for its devices. `evaluator`: one made
  for a config of the same `parts_cache.evaluator_key` (its Keras model is used
  too); `client_tensors`: the `ClientTensors` of a config of the same
  `parts_cache.client_tensors_key`, made from `data` (the processes of its
  configs then share the clients' computations they have in common,
  `tf_computation._slot_pool`)."""
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
  planned here): TFF's process for `tff_cpp`; for the in-process and ray
  backends its `CompiledProcess`, from the machine's process cache when
  `runtime.cache` is on (built and stored on a miss), its clients' steps
  unrolled where `process.unrolled_steps` says. `client_tensors`: the run's,
  if at hand."""
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
  # A compiled process serves every config of its structure, whose values
  # `initial_state` sets; so it is built at the default client learning rate
  # when the state holds the rate, and the rates a sweep samples share one
  # traced client work (`process._weighted_fed_avg`).
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
  `RunPlan`, whose `state_paths` are used, or a config) set in.

  For a process built from `config` itself this changes no value; for one built
  from another config of the same `structure_key` it yields this config's
  initial state. Values go through `set_hparams`, a TFF computation, so they
  take the dtypes of the state's own leaves; when the state holds them already
  (in those dtypes), the call, whose first is not free, is skipped.
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


def check_parts(config, parts: Optional[ExperimentParts]) -> None:
  """ValueError when `parts` were built for a config of another structure than
  `config` (a `RunPlan`, whose key is used, or a config)."""
  if parts is None:
    return
  key = config.key if isinstance(config, RunPlan) else structure_key(config)
  if parts.key != key:
    raise ValueError("run_experiment `parts` were built for a config of another "
                     "structure (model, data, client set-up, ...); build them with "
                     "build_parts(config) or PartsCache.get(config)")
