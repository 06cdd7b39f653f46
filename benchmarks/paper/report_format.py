"""How the report writes numbers, setups and rankings (shared by its sections)."""

from __future__ import annotations

import math
from typing import Any, Mapping, Optional

from benchmarks.paper import plan

PART_NAMES = {"dir0.3": "Dirichlet(0.3)", "iid": "i.i.d."}
HPARAM_NAMES = {"client.learning_rate": "eta_l", "server.learning_rate": "eta"}
EDGE_MARK = "†"  # a tuned value at the edge of its search range (`report_sections.edges`)
METHODS_NOTE = "this budget's subset"
WORDS = "no one two three four five six seven eight nine ten eleven twelve".split()


def name(opt: str) -> str:
  """The registry's display name of `opt` (as it is when not registered)."""
  from tff_fedadamom import methods

  return methods.display_name(opt) if opt in methods.list_optimizers() else opt


def word(n: int) -> str:
  """'six' for 6 (numbers past the list as digits)."""
  return WORDS[n] if 0 <= n < len(WORDS) else str(n)


def pct(value: Optional[float]) -> str:
  return "-" if value is None else f"{100 * value:.2f}"


def pm(stat: Optional[Mapping], scale: float = 100.0, digits: int = 2) -> str:
  """'mean ± std' of a mean_std dict (std omitted with one value)."""
  if not stat or stat.get("mean") is None:
    return "-"
  text = f"{stat['mean'] * scale:.{digits}f}"
  return text if stat.get("std") is None else f"{text} ± {stat['std'] * scale:.{digits}f}"


def seeds_note(got: int, planned: int) -> str:
  """' (2 of 3 seeds)' when a cell averages fewer seeds than planned, else ''."""
  return f" ({got} of {planned} seeds)" if got < planned else ""


def num(value: Any, digits: int = 3) -> str:
  """A number as the report's tables write it: 3 significant digits (4 from 1)."""
  if value is None:
    return "-"
  if isinstance(value, float):
    small_or_large = value != 0 and (abs(value) < 1e-2 or abs(value) >= 1e4)
    return f"{value:.{digits if small_or_large or abs(value) < 1 else digits + 1}g}"
  return str(value)


def hparams_text(hparams: Mapping, marked=()) -> str:
  """'eta_l=0.05, eta=1, beta_2=0.1, ...'; the paths in `marked` get EDGE_MARK."""
  return ", ".join(f"{hparam_label(k)}={num(v)}{EDGE_MARK if k in marked else ''}"
                   for k, v in hparams.items())


def hparam_label(path: str) -> str:
  """'eta' for 'server.learning_rate', 'beta_2' for 'server.beta_2'."""
  return HPARAM_NAMES.get(path, path.split(".", 1)[-1])


def welch_se(a: Mapping, b: Mapping) -> Optional[float]:
  """Welch's standard error of the difference of two mean_std dicts' means,
  sqrt(s_a^2 / n_a + s_b^2 / n_b); None without a mean and a nonzero std in each."""
  if a.get("mean") is None or b.get("mean") is None or not a.get("std") or not b.get("std"):
    return None
  return math.sqrt(a["std"] ** 2 / a["n"] + b["std"] ** 2 / b["n"])


def welch_clear(a: Mapping, b: Mapping) -> Optional[bool]:
  """Whether two mean_std dicts differ by more than 2 standard errors (Welch)."""
  se = welch_se(a, b)
  return abs(a["mean"] - b["mean"]) > 2 * se if se else None


def partition_text(setup: Mapping) -> str:
  part = setup["data"].get("partition") or {}
  return ("i.i.d." if part.get("kind") == "iid"
          else f"Dirichlet(alpha={part.get('alpha')}) label skew")


def describe_setup(setup: Mapping, methods_note: str = METHODS_NOTE) -> str:
  data, model, metric, methods = (setup[k] for k in ("data", "model", "tune_metric", "methods"))
  if data["name"] == "fashion_mnist":
    data_text = (f"Fashion-MNIST, {data['num_clients']} clients, {partition_text(setup)} "
                 f"(partition seed {data['seed']})")
  else:
    opts = data.get("options", {})
    data_text = (f"Shakespeare, clients = speaking roles ({opts.get('max_clients')} roles "
                 f"kept, seeded), next character over {opts.get('seq_length')}-character windows")
  model_text = model["name"] + (f" {model.get('options')}" if model.get("options") else "")
  space = "; ".join(
      f"{name(key)}: " + "; ".join(f"{hparam_label(k)} {dist_text(v)}" for k, v in value.items())
      if isinstance(value, Mapping) and "dist" not in value  # one optimizer's entries
      else f"{hparam_label(key)} {dist_text(value)} (all optimizers that have it)"
      for key, value in setup["space"].items())
  return (
      f"- Data: {data_text}; {setup['clients_per_round']} clients per round, uniform averaging.\n"
      f"- Model: {model_text}. Clients: SGD, "
      + ", ".join(f"{k}={v}" for k, v in setup["client"].items()) + ".\n"
      f"- Tuning: {setup['tune_trials']} trials x {setup['tune_rounds']} rounds per optimizer "
      f"(the same for all), random search, seed {setup['tune_seed']}, backend "
      f"`{setup['tune_backend']}`; objective: {metric['name']} averaged over the last "
      f"{metric['last_k']} evaluations. Space: {space}.\n"
      + (f"- Validation: {100 * setup['validation']['fraction']:g}% of each training "
         "client's examples held out (drawn with the partition seed), in tuning and final "
         "runs alike; tuning selects on them, the tables report the test set.\n"
         if setup.get("validation") else "")
      + (f"- Methods: {', '.join(name(m) for m in methods)} ({methods_note}).\n"
         if len(methods) < len(plan.OPTIMIZERS) else "") +
      f"- Final runs: the best config of each optimizer, {setup['rounds']} rounds, "
      f"evaluated every {setup['eval_every']} rounds on the held-out test set, seeds "
      f"{', '.join(str(s) for s in setup['seeds'])} (model init, client sampling and "
      f"shuffling; the partition is fixed; the tuning used seed {setup['tune_seed']}).\n")


def dist_text(value) -> str:
  """A search-space entry: a fixed value or a loguniform/uniform range (`tuning.space`)."""
  if not isinstance(value, Mapping):
    return f"fixed {num(value)}"
  return f"{value['dist']} [{num(value['low'])}, {num(value['high'])}]"


def measured(table: Mapping) -> dict:
  """The rows of a comparison table that have a mean final accuracy."""
  return {opt: row for opt, row in table.items() if row["final"]["mean"] is not None}


def ranking(table: Mapping) -> list:
  return sorted(measured(table), key=lambda opt: -table[opt]["final"]["mean"])


def place(table: Mapping, opt: str) -> tuple:
  """(rank of `opt` by mean final accuracy, others tied with it to 1e-6: they share it)."""
  if opt not in measured(table):
    return None, 0
  mine = table[opt]["final"]["mean"]
  others = [row["final"]["mean"] for o, row in measured(table).items() if o != opt]
  return (sum(m > mine + 1e-6 for m in others) + 1,
          sum(abs(m - mine) <= 1e-6 for m in others))


def place_text(table: Mapping, opt: str = "fedadamom") -> str:
  rank, tied = place(table, opt)
  if rank is None:
    return "has no result"
  return f"ranks {rank} of {len(measured(table))}" + (
      f" (tied with {tied} other{'s' if tied > 1 else ''})" if tied else "")


def spread(table: Mapping) -> Optional[float]:
  means = [row["final"]["mean"] for row in measured(table).values()]
  return (max(means) - min(means)) if means else None
