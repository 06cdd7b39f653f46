"""What a run leaves in its output directory, and how it is read back:

    config.yaml          the resolved config (what `run` accepts as is)
    metrics.csv          one row per round (TFF's CSVFileReleaseManager)
    tensorboard/         TensorBoard event files (`tensorboard_events`: the round's
                         metrics, plus histograms of the optimizer state)
    checkpoints/         program state (`resume.ArrayStateManager`: round_<n>/arrays.npz)
    model.keras          the final global model, compiled, loadable with plain Keras
                         (`evaluation.Evaluator.model_to_save`)
    curves.png           train loss and test accuracy vs round
    summary.json         final/best accuracy, rounds to targets, timing, status

Every file this module writes is written atomically. Its CSV and Markdown table
writers also serve `compare` and the sweep exports.
"""

from __future__ import annotations

import csv
import io
import logging
import math
import os
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

from tff_fedadamom.atomic_io import atomic_write_text
from tff_fedadamom.figures import margins_in_inches, new_figure, save_figure
from tff_fedadamom.metric_names import (BETA1_MEAN, FRAC_BETA1_AT_0, FRAC_BETA1_AT_MAX,
                                        NONFINITE_UPDATES, ROUND, TEST_ACCURACY, TEST_LOSS,
                                        TRAIN_LOSS, V_MEDIAN, V_P01, V_P99,
                                        VALIDATION_ACCURACY, VALIDATION_LOSS)
CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.csv"
SUMMARY_FILE = "summary.json"
MODEL_FILE = "model.keras"
CURVES_FILE = "curves.png"
CHECKPOINT_DIR = "checkpoints"
TENSORBOARD_DIR = "tensorboard"
# The csv module's own line ending (metrics.csv, `compare.csv`); sweep tables use "\n".
CRLF = "\r\n"


def columns(rows: Iterable[Mapping[str, Any]]) -> list[str]:
  """Every key of `rows`, in order of first appearance."""
  return list(dict.fromkeys(k for row in rows for k in row))


def csv_rows(header: Sequence[str], rows: Iterable[Sequence[Any]], *,
             lineterminator: str = CRLF) -> str:
  """CSV text of a header and rows of cells."""
  buffer = io.StringIO()
  writer = csv.writer(buffer, lineterminator=lineterminator)
  writer.writerow(header)
  writer.writerows(rows)
  return buffer.getvalue()


def csv_table(rows: Sequence[Mapping[str, Any]], *, lineterminator: str = CRLF) -> str:
  """CSV text of dict rows: one column per key (`columns`), None as an empty cell."""
  fields = columns(rows)
  return csv_rows(fields, ([("" if row.get(f) is None else row[f]) for f in fields]
                           for row in rows), lineterminator=lineterminator)


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[Any]],
                   cell: Callable[[Any], str] = str) -> str:
  """A Markdown table, a line per row, each ending in a newline; `cell` formats values."""
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
  return "\n".join(lines) + "\n"


def check_writable(output_dir: str) -> None:
  """Fails before any training when `output_dir` cannot be written."""
  try:
    os.makedirs(output_dir, exist_ok=True)
    probe = os.path.join(output_dir, ".write-probe")
    with open(probe, "wb") as f:
      f.write(b"\0" * 4096)
      f.flush()
      os.fsync(f.fileno())
    os.unlink(probe)
  except OSError as e:
    raise OSError(f"output_dir {output_dir!r} is not writable: {e.strerror or e}") from e


def _number(text: str):
  try:
    value = float(text)
  except (TypeError, ValueError):
    return text
  return int(value) if value.is_integer() and "." not in text and "e" not in text else value


def read_metrics(output_dir: str) -> list[dict[str, Any]]:
  """The rows of metrics.csv as dicts of numbers (empty strings dropped)."""
  path = os.path.join(output_dir, METRICS_FILE)
  if not os.path.exists(path):
    return []
  with open(path, newline="") as f:
    return [{k: _number(v) for k, v in row.items() if v not in ("", None)}
            for row in csv.DictReader(f)]


def repair_metrics(output_dir: str, last_round: int) -> int:
  """Makes metrics.csv agree with the checkpoint a run resumes from: keeps the
  leading rows 1, 2, ... up to `last_round` that parse completely and drops the
  rest (rows after the checkpoint, a row cut short by a kill). Returns the last
  round kept (below `last_round`: resume from an older checkpoint). A file whose
  header cannot be read is moved aside to `metrics.csv.corrupt`.
  """
  path = os.path.join(output_dir, METRICS_FILE)
  if not os.path.exists(path):
    return 0
  try:
    with open(path, newline="") as f:
      reader = csv.reader(f)
      header = next(reader)
      rows = list(reader)
    if not header or header[0] != ROUND:
      raise ValueError(f"no {ROUND!r} column")
  except (StopIteration, ValueError, csv.Error, UnicodeDecodeError) as e:
    os.replace(path, path + ".corrupt")
    logging.getLogger("tff_fedadamom").warning(
        "%s was unreadable (%s); moved to %s.corrupt", path, e, path)
    return 0
  kept = []
  for row in rows:
    try:
      round_num = int(row[0])
      ok = len(row) == len(header) and 1 <= round_num <= last_round
    except (ValueError, IndexError):
      ok = False
    if ok and round_num == len(kept) + 1:
      kept.append(row)
  if len(kept) < len(rows):
    atomic_write_text(path, csv_rows(header, kept))
    logging.getLogger("tff_fedadamom").warning(
        "metrics.csv: dropped %d row(s) not covered by the checkpoint of round %d",
        len(rows) - len(kept), last_round)
  return len(kept)


def rounds_to_targets(history: Iterable[Mapping[str, Any]], targets: Iterable[float],
                      key: str = TEST_ACCURACY) -> dict[str, Optional[int]]:
  """`{f"{target:g}": the first round whose `key` reaches it, or None}`, from
  metrics.csv rows or Tune's results (rows without `round` or `key` skipped)."""
  evals = [(int(row[ROUND]), row[key]) for row in history
           if row.get(key) is not None and ROUND in row]
  return {f"{target:g}": next((r for r, acc in evals if acc >= target), None)
          for target in targets}


def summarize(history: list[Mapping[str, Any]], *, targets, status: str,
              diverged_round: Optional[int], wall_time_s: float, rounds_run: int,
              devices: list[str], extra: Optional[Mapping[str, Any]] = None) -> dict:
  """The summary.json content, computed from the per-round history."""
  evals = [r for r in history if TEST_ACCURACY in r]
  accs = [r[TEST_ACCURACY] for r in evals if math.isfinite(r[TEST_ACCURACY])]
  best = max(evals, key=lambda r: r[TEST_ACCURACY]) if accs else None
  nonfinite = sum(int(r.get(NONFINITE_UPDATES, 0)) for r in history)
  summary = {
      "status": status,
      "diverged_round": diverged_round,
      "rounds_completed": history[-1][ROUND] if history else 0,
      "final_test_accuracy": evals[-1][TEST_ACCURACY] if evals else None,
      "final_test_loss": evals[-1].get(TEST_LOSS) if evals else None,
      "best_test_accuracy": best[TEST_ACCURACY] if best else None,
      "best_round": best[ROUND] if best else None,
      "final_train_loss": history[-1].get(TRAIN_LOSS) if history else None,
      "rounds_to_target": rounds_to_targets(history, targets),
      NONFINITE_UPDATES: nonfinite,
      "wall_time_s": round(wall_time_s, 3),
      "rounds_per_second": round(rounds_run / wall_time_s, 4) if wall_time_s > 0 else None,
      "devices": devices,
      "history": [{k: r[k] for k in (ROUND, TEST_ACCURACY, TEST_LOSS, VALIDATION_ACCURACY,
                                     VALIDATION_LOSS, TRAIN_LOSS) if k in r} for r in evals],
  }
  summary.update(extra or {})
  return summary


def plot_curves(runs: Mapping[str, list[Mapping[str, Any]]], path: str,
                title: Optional[str] = None) -> None:
  """Train loss and test accuracy vs round, one line per run, saved atomically."""
  fig, (ax_loss, ax_acc) = new_figure(figsize=(11, 4), ncols=2)
  for label, history in runs.items():
    train = [(r[ROUND], r[TRAIN_LOSS]) for r in history if TRAIN_LOSS in r]
    evals = [(r[ROUND], r[TEST_ACCURACY]) for r in history if TEST_ACCURACY in r]
    if train:
      ax_loss.plot(*zip(*train), label=label)
    if evals:
      ax_acc.plot(*zip(*evals), marker="o", markersize=3, label=label)
  ax_loss.set(xlabel="round", ylabel="train loss", title="Train loss")
  ax_acc.set(xlabel="round", ylabel="test accuracy", title="Test accuracy")
  for ax in (ax_loss, ax_acc):
    ax.grid(alpha=0.3)
    if runs:
      ax.legend(fontsize=8)
  if title:
    fig.suptitle(title)
  margins_in_inches(fig, top=0.6 if title else 0.35)
  save_figure(fig, path)


def plot_telemetry(runs: Mapping[str, list[Mapping[str, Any]]], path: str) -> bool:
  """Server-optimizer state over rounds: v percentiles (log scale) for every run
  with a second moment, and FedAdamom's beta1_t distribution (mean and the
  fractions clipped at 0 and at 1 - epsilon). Returns False if no run has any."""
  with_v = {k: h for k, h in runs.items() if any(V_MEDIAN in r for r in h)}
  with_beta = {k: h for k, h in runs.items() if any(BETA1_MEAN in r for r in h)}
  if not with_v and not with_beta:
    return False
  fig, (ax_v, ax_b) = new_figure(figsize=(11, 4), ncols=2)
  for label, history in with_v.items():
    rows = [r for r in history if V_MEDIAN in r]
    rounds = [r[ROUND] for r in rows]
    line, = ax_v.plot(rounds, [r[V_MEDIAN] for r in rows], label=f"{label} median")
    ax_v.fill_between(rounds, [max(r[V_P01], 1e-30) for r in rows],
                      [r[V_P99] for r in rows], color=line.get_color(), alpha=0.15)
  ax_v.set(xlabel="round", ylabel="v (second moment)", yscale="log",
           title="v: median, band = 1st-99th percentile")
  for label, history in with_beta.items():
    rows = [r for r in history if BETA1_MEAN in r]
    rounds = [r[ROUND] for r in rows]
    ax_b.plot(rounds, [r[BETA1_MEAN] for r in rows], label=f"{label} mean beta1")
    ax_b.plot(rounds, [r[FRAC_BETA1_AT_MAX] for r in rows], "--",
              label=f"{label} frac at 1-eps")
    ax_b.plot(rounds, [r[FRAC_BETA1_AT_0] for r in rows], ":",
              label=f"{label} frac at 0")
  ax_b.set(xlabel="round", ylabel="value", ylim=(0, 1), title="FedAdamom beta1_t")
  for ax in (ax_v, ax_b):
    ax.grid(alpha=0.3)
    if ax.lines:
      ax.legend(fontsize=7)
  margins_in_inches(fig, top=0.35)
  save_figure(fig, path)
  return True
