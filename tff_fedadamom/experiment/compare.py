"""Several runs side by side: `compare` (one run per optimizer) and `plot_runs`."""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Iterable, Mapping, Optional, Sequence

from tff_fedadamom.atomic_io import atomic_write_text
from tff_fedadamom.config import ServerConfig, config_to_dict, load_config
from tff_fedadamom.experiment import outputs


def with_optimizer(raw: Mapping[str, Any], optimizer: str) -> dict:
  """The experiment mapping `raw` (as `config_to_dict` writes it) run with another
  server optimizer. Another optimizer gets the registry's default hparams (those
  of one optimizer mean nothing to another) and keeps the other server fields;
  the other sections are shared with `raw`, not copied.
  """
  raw = dict(raw)
  server = raw["server"]
  if server["optimizer"] != optimizer:
    fields = {f.name for f in dataclasses.fields(ServerConfig)} - {"hparams", "optimizer"}
    raw["server"] = {"optimizer": optimizer,
                     **{k: v for k, v in server.items() if k in fields}}
  return raw


def optimizer_variant(config, optimizer: str):
  """`config` with the server optimizer swapped (see `with_optimizer`), in
  `<output_dir>/<optimizer>` and named after it."""
  raw = with_optimizer(config_to_dict(config), optimizer)
  raw["output_dir"] = os.path.join(config.output_dir, optimizer)
  raw["name"] = optimizer
  return load_config(raw)


def compare(config_path, optimizers: Sequence[str], *, overrides=(), progress=True) -> str:
  """Runs the same experiment once per optimizer, in `<output_dir>/<optimizer>/`;
  writes `<output_dir>/compare.*` (a plot and a table) and returns the Markdown
  table."""
  from tff_fedadamom.methods import get_spec
  from tff_fedadamom.experiment.runner import run_experiment

  base = load_config(config_path, overrides)
  for name in optimizers:
    get_spec(name)  # unknown names fail before any run starts
  variants = [optimizer_variant(base, name) for name in optimizers]
  rows = []
  for config in variants:
    result = run_experiment(config, progress=progress)
    s = result.summary
    rows.append({"optimizer": config.server.optimizer, "status": s["status"],
                 "final_test_accuracy": s["final_test_accuracy"],
                 "best_test_accuracy": s["best_test_accuracy"],
                 **{f"rounds_to_{k}": v for k, v in s["rounds_to_target"].items()},
                 # Parameter-sized tensors per client and round, each way, vs FedAvg.
                 "communication_x_fedavg": get_spec(config.server.optimizer).communication,
                 "hparams": " ".join(f"{k}={_hparam(v)}"
                                     for k, v in config.server.hparams.items())})
  fields = outputs.columns(rows)
  cell = lambda v: "n/a" if v is None else (f"{v:.4f}" if isinstance(v, float) else str(v))
  table = outputs.markdown_table(fields, ([row.get(f) for f in fields] for row in rows), cell)
  atomic_write_text(os.path.join(base.output_dir, "compare.md"), table)
  atomic_write_text(os.path.join(base.output_dir, "compare.csv"), outputs.csv_table(rows))
  plot_runs([c.output_dir for c in variants], out=base.output_dir, prefix="compare")
  return table


def _hparam(value) -> str:
  """`1e-3` for numbers, `true`/`false` for switches (as YAML writes them)."""
  return str(value).lower() if isinstance(value, bool) else f"{value:g}"


def plot_runs(run_dirs: Iterable[str], *, out: Optional[str] = None,
              prefix: str = "runs") -> list[str]:
  """Learning curves of several runs in one figure, plus their optimizer telemetry."""
  run_dirs = list(run_dirs)
  runs = {}
  for run_dir in run_dirs:
    history = outputs.read_metrics(run_dir)
    if not history:
      raise FileNotFoundError(f"no {outputs.METRICS_FILE} in {run_dir!r}: not a run directory")
    label = os.path.basename(os.path.normpath(run_dir))
    runs[label if label not in runs else os.path.normpath(run_dir)] = history
  out = out or run_dirs[0]
  os.makedirs(out, exist_ok=True)
  written = [os.path.join(out, f"{prefix}_curves.png")]
  outputs.plot_curves(runs, written[0])
  telemetry_path = os.path.join(out, f"{prefix}_telemetry.png")
  if outputs.plot_telemetry(runs, telemetry_path):
    written.append(telemetry_path)
  return written
