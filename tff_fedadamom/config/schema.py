"""Typed experiment schema: one frozen dataclass per config section.

YAML holds values only. Every field's type and range lives here, in the field's
metadata; names of datasets, models, optimizers and schedules are checked by
asking their registries (see `validate.py`). Nothing else in the project
interprets a raw config mapping.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Optional

from tff_fedadamom.asynchrony import DEFAULT_DURATIONS, DEFAULT_STALENESS


def checked_field(default=dataclasses.MISSING, *, check=None, allowed=None, factory=None,
                  choices=None, problem=None, why=None):
  """A dataclass field with its checks and their wording, for `sections.build_section`.

  Neither `default` nor `factory`: the field is required (`why` says why when it
  is missing). A value failing `check(value)` raises `problem` (default "out of
  range") with `allowed`; one not in `choices` raises "unknown value" with a
  'did you mean' hint.
  """
  meta = {"check": check, "allowed": allowed, "choices": choices, "problem": problem,
          "why": why}
  if factory is not None:
    return dataclasses.field(default_factory=factory, metadata=meta)
  return dataclasses.field(default=default, metadata=meta)


_field = checked_field


def positive(x) -> bool:
  return x > 0


def nonnegative(x) -> bool:
  return x >= 0


# The `kind` a partition or schedule mapping means when it names none (a
# validated config always names it).
DEFAULT_PARTITION_KIND = "dirichlet"
DEFAULT_SCHEDULE_KIND = "constant"


def split_kind(options, default: str) -> tuple[str, dict]:
  """(kind, the other entries) of a `{kind: <name>, <its options>...}` mapping,
  `default` when it names no kind."""
  rest = dict(options)
  return rest.pop("kind", default), rest


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """Which data, and how it is split over clients.

  `partition` is `{kind: <partitioner>, <its options>...}`, kind
  `DEFAULT_PARTITION_KIND` when omitted (ignored for data sets with natural
  clients); `options` are the data set's own options.
  """

  name: str = "fashion_mnist"
  path: Optional[str] = None
  num_clients: Optional[int] = _field(None, check=positive, allowed="an integer >= 1 or null")
  seed: int = _field(0, check=nonnegative, allowed="an integer >= 0")
  partition: dict = _field(factory=lambda: {"kind": DEFAULT_PARTITION_KIND, "alpha": 0.3})
  options: dict = _field(factory=dict)
  augment: Optional[str] = _field(None, check=lambda s: s in ("crop_flip",),
                                  allowed="null or 'crop_flip'")
  eval_batch_size: int = _field(500, check=positive, allowed="an integer >= 1")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  name: str = "cnn"
  options: dict = _field(factory=dict)


@dataclasses.dataclass(frozen=True)
class ClientConfig:
  """Local training: SGD with momentum, weight decay and gradient clipping.

  The client learning rate is `learning_rate * lr_decay ** round` (the
  reference setup decays it by 0.998 per round).
  """

  learning_rate: float = _field(0.1, check=positive, allowed="a number > 0")
  momentum: float = _field(0.0, check=lambda x: 0 <= x < 1, allowed="a number in [0, 1)")
  weight_decay: float = _field(0.0, check=nonnegative, allowed="a number >= 0")
  lr_decay: float = _field(1.0, check=lambda x: 0 < x <= 1, allowed="a number in (0, 1]")
  local_epochs: int = _field(1, check=positive, allowed="an integer >= 1")
  batch_size: int = _field(20, check=positive, allowed="an integer >= 1")
  clip_norm: Optional[float] = _field(None, check=positive, allowed="a number > 0 or null")
  max_examples: Optional[int] = _field(
      None, check=positive, allowed="an integer >= 1 or null (every example)")


@dataclasses.dataclass(frozen=True)
class ServerConfig:
  """The server optimizer. Its hparams sit flat beside `optimizer` in YAML
  (`server.learning_rate`, `server.beta_2`, ...) and are kept in `hparams`,
  resolved against the optimizer registry's defaults. `schedule` is `{kind:
  <schedule>, <its options>...}`, kind `DEFAULT_SCHEDULE_KIND` when omitted."""

  optimizer: str = "fedadamom"
  hparams: dict = _field(factory=dict)
  client_weighting: str = _field(
      "uniform", check=lambda s: s in ("uniform", "num_examples"),
      allowed="'uniform' (the paper) or 'num_examples' (TFF's default)")
  schedule: dict = _field(factory=lambda: {"kind": DEFAULT_SCHEDULE_KIND})


# Where rounds run (`RuntimeConfig.backend`); `auto` means INPROCESS.
AUTO, INPROCESS, TFF_CPP, RAY = "auto", "inprocess", "tff_cpp", "ray"
BACKENDS = (AUTO, INPROCESS, TFF_CPP, RAY)
# The ray backend's settings when left null.
RAY_WORKERS, RAY_CPUS_PER_WORKER, RAY_GPUS_PER_WORKER = 2, 1.0, 0.0
# A null `runtime.unroll_max_batches` stacks batches in runs that train this many
# (rounds x clients per round x a client's mean batch count): a stacked round
# saves about what TFF's iterator costs a batch, but its process costs more to
# build, which a short run does not pay back (`benchmarks/rounds.py`).
UNROLL_MIN_BATCHES = 10_000
# A Ray cluster to join: 'auto' (the one this machine belongs to) or a head's host:port.
RAY_ADDRESS = re.compile(r"^(auto|(ray://)?[A-Za-z0-9_.\-\[\]:]+:\d+)$")
_DEVICE = re.compile(r"^/?(device:)?(CPU|GPU):\d+$", re.IGNORECASE)


def device_names(names) -> bool:
  return len(names) > 0 and all(isinstance(n, str) and _DEVICE.match(n) for n in names)


def ray_resource(x) -> bool:
  """Ray's rule for a resource amount: a fraction of one unit, or whole units."""
  return x >= 0 and (x <= 1 or float(x).is_integer())


def ray_address(s) -> bool:
  return bool(RAY_ADDRESS.match(s))


def resolved_backend(runtime: RuntimeConfig) -> str:
  """INPROCESS, TFF_CPP or RAY: the backend `runtime` runs rounds on."""
  return INPROCESS if runtime.backend == AUTO else runtime.backend


@dataclasses.dataclass(frozen=True)
class RuntimeConfig:
  """How the process runs rounds (each field: docs/configs.md).

  `backend`: `inprocess` (what `auto` means) runs TFF's compiled process in this
  Python process, its clients spread round-robin over `devices`; `tff_cpp` is
  TFF's own C++ runtime, the reference (`runtime/tff_cpp.py`); `ray` runs each
  round's clients on `workers` Ray actors (the field keeps its name: stored
  results hash it). `workers`, `cpus_per_worker`, `gpus_per_worker` and
  `address` are the ray backend's alone (null: `RAY_*` defaults); there
  `threads` and `max_concurrent_clients` apply to each actor.

  `threads` sizes the TensorFlow pool that runs clients side by side; every
  kernel runs on one thread, so no thread count changes a number. The entry
  point applies it (`tff_fedadamom.session`); a library run uses the pool its
  process has. `unroll_max_batches` and `cache` choose how a round is built
  (`algorithms.unrolled`, `runtime.process_cache`), never its numbers.
  """

  threads: Optional[int] = _field(None, check=positive,
                                  allowed="an integer >= 1 or null (every CPU)")
  max_concurrent_clients: Optional[int] = _field(
      None, check=positive,
      allowed="an integer >= 1 or null (one per device; on a lone CPU, all of a round's "
      "clients)")
  unroll_max_batches: Optional[int] = _field(
      None, check=nonnegative,
      allowed=f"null (stacked in runs that train {UNROLL_MIN_BATCHES} batches or more), "
      "0 (never) or an integer >= 1 (stacked when no client has more batches)")
  backend: str = _field(AUTO, check=lambda s: s in BACKENDS,
                        allowed="'auto' (= 'inprocess'), 'inprocess', 'tff_cpp' or 'ray'")
  devices: Optional[tuple] = _field(
      None, check=device_names,
      allowed="null (every GPU, else the CPU) or a non-empty list of TensorFlow devices "
      "such as ['GPU:0', 'GPU:1'] or ['CPU:0']")
  workers: Optional[int] = _field(
      None, check=positive,
      allowed=f"an integer >= 1 (Ray actors), or null ({RAY_WORKERS} with backend 'ray')")
  cpus_per_worker: Optional[float] = _field(
      None, check=lambda x: x > 0 and ray_resource(x),
      allowed="a number > 0 (CPUs per Ray actor): a fraction of one CPU or whole CPUs; null "
      f"({RAY_CPUS_PER_WORKER:g} with backend 'ray')")
  gpus_per_worker: Optional[float] = _field(
      None, check=ray_resource,
      allowed="0, a fraction of one GPU or whole GPUs (per Ray actor); null "
      f"({RAY_GPUS_PER_WORKER:g} with backend 'ray')")
  address: Optional[str] = _field(
      None, check=ray_address,
      allowed="null (a new local Ray on 127.0.0.1), 'auto' (the cluster this machine "
      "belongs to) or host:port of a cluster's head")
  cache: bool = True
  cache_dir: Optional[str] = _field(
      None, check=lambda s: bool(s.strip()),
      allowed="null ($TFF_FEDADAMOM_CACHE_DIR, else $XDG_CACHE_HOME/tff-fedadamom/processes, "
      "else ~/.cache/tff-fedadamom/processes) or a directory path")


@dataclasses.dataclass(frozen=True)
class AsyncConfig:
  """Buffered asynchronous training (FedBuff; the rules are `asynchrony`'s, the
  fields are docs/configs.md's): each round of the run is a server step, taken
  every `buffer_size` arrivals from `concurrency` clients training at once. A
  run keeps the broadcasts of up to min(concurrency + buffer_size,
  max_staleness + 1) model versions in its state.
  """

  concurrency: Optional[int] = _field(None, check=positive,
                                      allowed="an integer >= 1 or null (= buffer_size)")
  buffer_size: Optional[int] = _field(None, check=positive,
                                      allowed="an integer >= 1 or null (= clients_per_round)")
  durations: dict = _field(factory=lambda: dict(DEFAULT_DURATIONS))
  staleness: dict = _field(factory=lambda: dict(DEFAULT_STALENESS))
  max_staleness: int = _field(10, check=nonnegative, allowed="an integer >= 0")


@dataclasses.dataclass(frozen=True)
class ValidationConfig:
  """A validation set held out from the training clients (`data.validation`):
  `fraction` of each client's examples, drawn with the data seed, evaluated as
  `validation/loss` and `validation/accuracy` beside the test set; a sweep can
  tune on them instead of on the test set."""

  fraction: float = _field(0.1, check=lambda x: 0 < x < 1, allowed="a number in (0, 1)")


@dataclasses.dataclass(frozen=True)
class ExperimentConfig:
  """One federated-averaging experiment."""

  name: Optional[str] = None
  seed: int = _field(0, check=nonnegative, allowed="an integer >= 0")
  rounds: int = _field(10, check=positive, allowed="an integer >= 1")
  clients_per_round: int = _field(5, check=positive, allowed="an integer >= 1")
  eval_every: int = _field(1, check=positive, allowed="an integer >= 1")
  checkpoint_every: int = _field(1, check=positive, allowed="an integer >= 1")
  output_dir: str = "runs/experiment"
  targets: tuple = _field(factory=tuple)
  telemetry: bool = True
  histogram_every: int = _field(10, check=positive, allowed="an integer >= 1")
  diverge_patience: int = _field(
      3, check=positive,
      allowed="an integer >= 1 (rounds of rejected non-finite updates before a run "
      "counts as diverged)")
  data: DataConfig = dataclasses.field(default_factory=DataConfig)
  model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
  client: ClientConfig = dataclasses.field(default_factory=ClientConfig)
  server: ServerConfig = dataclasses.field(default_factory=ServerConfig)
  runtime: RuntimeConfig = dataclasses.field(default_factory=RuntimeConfig)
  # Null: synchronous rounds (the section's absence in YAML).
  asynchronous: Optional[AsyncConfig] = None
  # Null: no validation set (every training example trains).
  validation: Optional[ValidationConfig] = None


SECTIONS = {"data": DataConfig, "model": ModelConfig, "client": ClientConfig,
            "server": ServerConfig, "runtime": RuntimeConfig, "asynchronous": AsyncConfig,
            "validation": ValidationConfig}
