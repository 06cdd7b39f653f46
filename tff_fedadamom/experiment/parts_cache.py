"""`PartsCache`: the parts (`parts.ExperimentParts`) of the last few structures
a process ran (a sweep's trial actor, a paper-study worker), and the pieces
several structures share, each made once.
"""

from __future__ import annotations

import collections
import json
from typing import Any

from tff_fedadamom.config import ExperimentConfig, config_to_dict
from tff_fedadamom.experiment.evaluation import Evaluator
from tff_fedadamom.experiment.parts import ExperimentParts, build_parts, make_plan
from tff_fedadamom.lru import lru_get, lru_put


def _data(tree: dict) -> dict:
  """What `process.load_data` reads of a config's mapping."""
  return {"data": tree["data"], "validation": tree.get("validation")}


def data_key(config: ExperimentConfig) -> str:
  """What `process.load_data` depends on."""
  return json.dumps(_data(config_to_dict(config)), sort_keys=True, default=repr)


def evaluator_key(config: ExperimentConfig) -> str:
  """What an `Evaluator` and its Keras model depend on: the data and the `model`
  section. Not the seed: the model's initial weights are never read (a run's
  own are assigned before each evaluation and before the model is saved)."""
  tree = config_to_dict(config)
  return json.dumps({**_data(tree), "model": tree["model"]}, sort_keys=True, default=repr)


def client_tensors_key(config: ExperimentConfig) -> str:
  """What a run's `ClientTensors` depends on (`process.make_client_tensors`)."""
  from tff_fedadamom.experiment import process as process_lib

  return json.dumps({**_data(config_to_dict(config)),
                     **process_lib.client_tensors_options(config)},
                    sort_keys=True, default=repr)


class PartsCache:
  """The parts of at most `max_size` (>= 1) structure keys; out goes the least
  recently used of those not got again since they were built, else the least
  recently used. Why: a sweep's FedCAda and FAFED trials are a structure each
  (their sampled hparams are built into the process), used once between the
  trials of the structures that recur, which least recently used alone evicted.

  The data, the `Evaluator` (with its Keras model) and the clients' tensors are
  cached apart (`data_key`, ...), so that configs sharing them load, trace and
  compile them once. A cache serves one run at a time: the runs of its parts
  share their Keras model.
  """

  def __init__(self, max_size: int = 2):
    if not isinstance(max_size, int) or max_size < 1:
      raise ValueError(f"PartsCache `max_size` must be an integer >= 1, found {max_size!r}.")
    self.max_size = max_size
    self._parts: collections.OrderedDict[str, ExperimentParts] = collections.OrderedDict()
    self._data: collections.OrderedDict[str, Any] = collections.OrderedDict()
    self._evaluators: collections.OrderedDict[str, Evaluator] = collections.OrderedDict()
    self._client_tensors: collections.OrderedDict[str, Any] = collections.OrderedDict()
    self._reused: set[str] = set()  # keys got again since their parts were built
    self.hits = 0
    self.misses = 0

  def __len__(self) -> int:
    return len(self._parts)

  def __contains__(self, key: str) -> bool:  # a `RunPlan.key`
    return key in self._parts

  def get(self, config) -> ExperimentParts:
    """The parts for `config` (a `RunPlan`, or a config), built on a miss."""
    from tff_fedadamom.experiment import process as process_lib

    plan = make_plan(config)
    key = plan.key
    parts = lru_get(self._parts, key)
    if parts is not None:
      self.hits += 1
      self._reused.add(key)
      return parts
    self.misses += 1
    config, model_key = plan.config, evaluator_key(plan.config)
    data = self._kept(self._data, data_key(config), lambda: process_lib.load_data(config))
    tensors = self._kept(self._client_tensors, client_tensors_key(config),
                         lambda: process_lib.make_client_tensors(config, data))
    parts = build_parts(plan, data=data, evaluator=lru_get(self._evaluators, model_key),
                        client_tensors=tensors)
    lru_put(self._parts, key, parts, self.max_size, keep=self._reused)
    self._reused &= self._parts.keys()
    lru_put(self._evaluators, model_key, parts.evaluator, self.max_size)
    return parts

  def _kept(self, store: collections.OrderedDict, key: str, make):
    """`store[key]`, or `make()` kept there (least recently used out)."""
    value = lru_get(store, key)
    if value is None:
      value = make()
      lru_put(store, key, value, self.max_size)
    return value
