"""What a comparison table says about how far to trust it: tuned values at the
edge of their search range, runs at chance level, each method's bias correction,
the staleness asynchronous runs saw.

A tuned value at an end of its range says the search may have stopped short of
the best value: the range, not the method, decided it. A run at chance level
(`studies.count_failed`) has learnt nothing, whatever its status says. Bias
correction changes an Adam-family method's first steps: uncorrected, its first
m / sqrt(v) is (1 - beta_1) / sqrt(1 - beta_2) times the corrected one (3.2 at
beta 0.9, 0.999), and epsilon weighs more beside a young v; so which method had
it is part of the setup.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

from benchmarks.paper import plan
from benchmarks.paper import tune as tune_lib
from benchmarks.paper.report_format import EDGE_MARK, dist_text, hparam_label, name, num, pct

# A tuned value within this fraction of its range's width of an end is at the edge.
EDGE_FRACTION = 0.05
# Methods without a bias-correction switch whose rule corrects anyway
# (`tff_fedadamom.algorithms.fedcada`: its clients' Adam divides by 1 - beta**t,
# t the averaged step count); the other switchless methods have no moment to correct.
BUILT_IN_CORRECTION = {"fedcada": "always on in its rule (its clients' Adam, no switch)"}
NO_CORRECTION = "none in its rule"


def range_position(value: float, dist: Mapping) -> float:
  """Where `value` lies in a search range: 0 at `low`, 1 at `high`; linear in
  log(value) for a loguniform range, whose draws are uniform in the log."""
  low, high = float(dist["low"]), float(dist["high"])
  if dist["dist"] == "loguniform":
    value, low, high = math.log(value), math.log(low), math.log(high)
  return (value - low) / (high - low)


def edges(opt: str, row: Mapping, space: Mapping) -> list:
  """(path, value, range, 'low' or 'high') of every hparam of `opt` that its
  search (`tune.method_space` of `space`) tuned to within EDGE_FRACTION of the
  range's width of an end; none for a row that fell back to the defaults."""
  if not row or row.get("fallback_defaults") or not space:
    return []
  found = []
  for path, dist in tune_lib.method_space(opt, space)[0].items():
    value = (row.get("hparams") or {}).get(path)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
      continue
    position = range_position(value, dist)
    if position <= EDGE_FRACTION or position >= 1 - EDGE_FRACTION:
      found.append((path, value, dist, "low" if position <= EDGE_FRACTION else "high"))
  return found


def edge_note(table: Mapping, space: Mapping, methods: Sequence[str]) -> str:
  """The sentence under a table naming each tuned value at the edge of its range."""
  found = [(opt, edge) for opt in methods for edge in edges(opt, table.get(opt), space)]
  if not found:
    return ""
  return (f"\n{EDGE_MARK} Tuned to within {EDGE_FRACTION:.0%} of an end of its search range "
          "(of the range's width, in log space for a loguniform range): "
          + "; ".join(f"{name(opt)} {hparam_label(path)}={num(value)} ({dist_text(dist)}, "
                      f"{end} end)" for opt, (path, value, dist, end) in found)
          + ". The best value may lie outside the range searched.\n")


def bias_correction(opt: str, row: Mapping) -> str:
  """'on' or 'off' as the tuned config of `opt` has `server.bias_correction`
  (the registry's default when the config does not set it), or what its rule
  does when it has no such switch."""
  from tff_fedadamom.methods import default_hparams

  defaults = default_hparams(opt)
  if "bias_correction" not in defaults:
    return BUILT_IN_CORRECTION.get(opt, NO_CORRECTION)
  value = (row.get("hparams") or {}).get("server.bias_correction", defaults["bias_correction"])
  return "on" if value else "off"


def bias_bullet(summaries: Mapping[str, Mapping], methods: Sequence[str]) -> str:
  """The setup bullet: each method's bias correction, grouped; a method whose
  setting differs between tables is listed with each table's."""
  groups: dict = {}
  for opt in methods:
    per_panel = {panel: bias_correction(opt, s["table"].get(opt) or {})
                 for panel, s in summaries.items()}
    settings = set(per_panel.values())
    label = settings.pop() if len(settings) == 1 else ", ".join(
        f"{v} in {p}" for p, v in per_panel.items())
    groups.setdefault(label, []).append(name(opt))
  order = ["on", "off", *BUILT_IN_CORRECTION.values(), NO_CORRECTION]
  ranked = sorted(groups, key=lambda g: order.index(g) if g in order else len(order))
  return ("- Bias correction, as each tuned config has it (`server.bias_correction`): "
          + "; ".join(f"{g}: {', '.join(groups[g])}" for g in ranked) + ".\n")


def chance_bullet(summaries: Mapping[str, Mapping]) -> str:
  """The setup bullet that defines a failed run, with each table's chance accuracy."""
  chances = {panel: s["setup"].get("chance_accuracy") for panel, s in summaries.items()}
  if all(c is None for c in chances.values()):
    return "- Failed runs: not counted (these results hold no chance accuracy).\n"
  values = set(chances.values())
  text = (f"{pct(values.pop())}%" if len(values) == 1 else
          "; ".join(f"{p}: {pct(c)}%" for p, c in chances.items()))
  setup = next(iter(summaries.values()))["setup"]
  padding = ", padding excluded" if setup["data"]["name"] == "shakespeare" else ""
  return (f"- Failed: a final run or tuning trial that completed with a final test accuracy at "
          f"most {100 * plan.FAILED_MARGIN:g} point above chance, the accuracy of always "
          f"predicting the test set's most frequent label{padding} ({text}). The tables count "
          "failed final runs beside the diverged ones, failed trials beside the tuning "
          "objective.\n")


def staleness_text(summary: Mapping) -> str:
  """The staleness the final runs of an asynchronous table saw, if recorded."""
  settings = summary["setup"].get("asynchronous")
  if settings is None:
    return ""
  seen = summary.get("staleness")
  if not seen:
    return "\nThe final runs' stored results hold no staleness columns.\n"
  return (f"\nObserved staleness of the final runs ({seen['runs']} runs, {seen['steps']} "
          f"server steps): {seen['mean']:.2f} server steps per update on average (the mean "
          f"of each step's mean), at most {seen['max']}; {seen['dropped_per_run']:.1f} "
          f"updates per run dropped as staler than {settings.get('max_staleness')}.\n")
