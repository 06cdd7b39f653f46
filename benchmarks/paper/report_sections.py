"""The report's comparison sections (studies 1, 2 and 6; the others: `report_studies`):
tables, what they flag (README.md, "What the comparison tables flag"; also each method's
bias correction and the staleness asynchronous runs saw), and each study's comparison with
the paper, whose numbers and claims come from `plan.PAPER` only. Study 6 has no paper
numbers: it asks whether FedAdamom's standing against FADAS and FedAdam holds, and whether
FADAS' delay-adaptive rate acted at all.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

from tff_fedadamom.experiment.outputs import markdown_table

from benchmarks.common import NOT_MEASURED
from benchmarks.paper import plan
from benchmarks.paper.report_format import (EDGE_MARK, METHODS_NOTE, describe_setup,
                                            dist_text, hparam_label, hparams_text, measured,
                                            name, num, partition_text, pct, place, place_text,
                                            pm, ranking, seeds_note, spread, welch_clear, word)

NO_RESULTS = "**Against the paper:** no results yet."
# A tuned value within this fraction of its range's width of an end is at the edge.
EDGE_FRACTION = 0.05
# Switchless methods whose rule corrects anyway (FedCAda's clients' Adam divides by
# 1 - beta**t, t the averaged step count); the other switchless ones have no moment.
BUILT_IN_CORRECTION = {"fedcada": "always on in its rule (its clients' Adam, no switch)"}
NO_CORRECTION = "none in its rule"
OURS, RIVALS = "fedadamom", ("fadas", "fedadam")
# An update's weight in the buffer's average, per `asynchronous.staleness` kind.
STALENESS_WEIGHT = {"constant": "1", "polynomial": "(1 + tau)^-{a:g}",
                    "hinge": "1 up to tau = {b}, then 1 / ({a:g} (tau - {b}) + 1)"}
# What `welch_clear` says of a gap between two means.
GAP_VERDICTS = {True: "more than 2 standard errors", False: "within 2 standard errors",
                None: "no standard error: fewer than two seeds"}


def range_position(value: float, dist: Mapping) -> float:
  """0 at `low`, 1 at `high`; in log space for a loguniform range (its draws are uniform there)."""
  low, high = float(dist["low"]), float(dist["high"])
  if dist["dist"] == "loguniform":
    value, low, high = math.log(value), math.log(low), math.log(high)
  return (value - low) / (high - low)


def edges(opt: str, row: Mapping) -> list:
  """(path, value, range, 'low' or 'high') of each hparam `opt` was tuned to within
  EDGE_FRACTION of an end of its range; none for a row that fell back to the defaults."""
  if not row or row.get("fallback_defaults"):
    return []
  found = []
  for path, dist in (row.get("ranges") or {}).items():
    value = (row.get("hparams") or {}).get(path)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
      continue
    position = range_position(value, dist)
    if position <= EDGE_FRACTION or position >= 1 - EDGE_FRACTION:
      found.append((path, value, dist, "low" if position <= EDGE_FRACTION else "high"))
  return found


def edge_note(table: Mapping, methods: Sequence[str]) -> str:
  """The sentence under a table naming each tuned value at the edge of its range."""
  found = [(opt, edge) for opt in methods for edge in edges(opt, table.get(opt))]
  if not found:
    return ""
  return (f"\n{EDGE_MARK} Tuned to within {EDGE_FRACTION:.0%} of an end of its search range "
          "(of the range's width, in log space for a loguniform range): "
          + "; ".join(f"{name(opt)} {hparam_label(path)}={num(value)} ({dist_text(dist)}, "
                      f"{end} end)" for opt, (path, value, dist, end) in found)
          + ". The best value may lie outside the range searched.\n")


def bias_correction(opt: str, row: Mapping) -> str:
  """'on' or 'off' as the tuned config has `server.bias_correction` (else the registry's
  default), or what the rule of `opt` does without such a switch. Uncorrected, an Adam-family
  method's first m / sqrt(v) is (1 - beta_1) / sqrt(1 - beta_2) times the corrected one (3.2
  at beta 0.9, 0.999), and epsilon weighs more beside a young v."""
  from tff_fedadamom.methods import default_hparams

  defaults = default_hparams(opt)
  if "bias_correction" not in defaults:
    return BUILT_IN_CORRECTION.get(opt, NO_CORRECTION)
  value = (row.get("hparams") or {}).get("server.bias_correction", defaults["bias_correction"])
  return "on" if value else "off"


def bias_bullet(summaries: Mapping[str, Mapping], methods: Sequence[str]) -> str:
  """The setup bullet: each method's bias correction, grouped; a method whose setting
  differs between tables is listed with each table's."""
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


def _comparison_row(method: Mapping, row, setup: Mapping) -> list:
  comm = method.get("communication")
  cells = [name(method["name"]), "-" if comm is None else f"{comm:g}x"]
  if row is None:
    return cells + [NOT_MEASURED] * 7
  note, trials = seeds_note(row["seeds"], len(setup["seeds"])), row.get("trials_run")
  rtt = row["rounds_to_target"]
  rtt_text = (f"{pm(rtt, scale=1.0, digits=0)} ({row['reached']}/{row['seeds']})"
              if rtt["mean"] is not None else f"- (0/{row['seeds']})") + note
  marked = [path for path, *_ in edges(method["name"], row)]
  hp = hparams_text(row["hparams"], marked) + (" (defaults: no trial converged)"
                                               if row.get("fallback_defaults") else "")
  objective = pct(row["tune_objective"]) + (
      f" ({trials} of {setup['tune_trials']} trials)"
      if trials is not None and trials < setup["tune_trials"] else "") + (
      f" ({row['trials_failed']} of {trials} trials failed)" if row.get("trials_failed") else "")
  final, best = ((f"{NOT_MEASURED}{note}",) * 2 if row["seeds"] == 0
                 else (pm(row["final"]) + note, pm(row["best"]) + note))
  return cells + [hp, objective, final, best, rtt_text, row["diverged"],
                  "-" if row.get("failed") is None else row["failed"]]


def _against_adam(table: Mapping) -> tuple:
  """FedAdamom's and FedAdam's final accuracies, and FedAdamom - FedAdam in points."""
  ours, adam = (table.get(o, {}).get("final", {}) for o in ("fedadamom", "fedadam"))
  both = ours.get("mean") is not None and adam.get("mean") is not None
  return ours, adam, 100 * (ours["mean"] - adam["mean"]) if both else None


def _verdict(table: Mapping) -> str:
  """FedAdamom's rank (if ranked), its gaps to the best and to FedAdam, the spread."""
  order = ranking(table)
  if not order:
    return ""
  rank, leader = place(table, "fedadamom")[0], order[0]
  ours, adam, adam_gap = _against_adam(table)
  clear = welch_clear(ours, table[leader]["final"]) if rank not in (None, 1) else None
  adam_clear = welch_clear(ours, adam) if adam_gap is not None else None
  return ((f"\nBy mean final accuracy FedAdamom {place_text(table)}"
           + (f"; the best is {name(leader)}" if rank != 1 else "")
           if "fedadamom" in table else f"\nBy mean final accuracy the best is {name(leader)}")
          + (" (the gap to it is larger than 2 standard errors)" if clear
             else " (within 2 standard errors of it)" if clear is False else "")
          + (f". FedAdamom - FedAdam: {adam_gap:+.2f} points" if adam_gap is not None else "")
          + (f" ({GAP_VERDICTS[adam_clear]})" if adam_clear is not None else "")
          + f". The {word(len(measured(table)))} means span "
          f"{100 * (spread(table) or 0):.2f} points.\n")


def comparison_section(title: str, summaries: Mapping[str, Mapping], plot: str,
                       paper_text: str, methods: Sequence[Mapping], difference: str = "",
                       extra_setup: str = "", methods_note: str = METHODS_NOTE) -> str:
  """Setup, one table per panel (every method of `methods`, in order), verdicts.
  `difference`: what differs between the panels (default: the partition, whose
  text the setup then leaves to each table); `extra_setup`: more setup bullets."""
  setup = next(iter(summaries.values()))["setup"]
  described = describe_setup(setup, methods_note)
  if len(summaries) > 1 and not difference:
    difference = "the partition"
    described = described.replace(partition_text(setup), "the partition of each table")
  text = f"## {title}\n\n" + (
      f"Setup ({difference} is the only difference between the tables):\n\n"
      if len(summaries) > 1 else "Setup:\n\n") + described + extra_setup
  planned = [m["name"] for m in methods if m["name"] in setup["methods"]]
  text += ("- Communication: parameter-sized tensors each sampled client sends (and "
           "receives) per round, relative to FedAvg's one model update.\n"
           + bias_bullet(summaries, planned) + chance_bullet(summaries))
  for panel, summary in summaries.items():
    setup, table = summary["setup"], summary["table"]
    header = ["optimizer", "communication per round", "tuned hparams", "tuning objective",
              "final acc (%)", "best acc (%)",
              f"rounds to {100 * summary['target']:g}% (reached/seeds)", "diverged", "failed"]
    rows = [_comparison_row(m, table.get(m["name"]), setup) for m in methods
            if m["name"] in setup["methods"]]
    text += (f"\n### {panel}\n\n" + markdown_table(header, rows) + _verdict(table)
             + edge_note(table, planned)
             + staleness_text(summary))
  return text + f"\n![learning curves]({plot})\n\n{paper_text}\n"


def fmnist_paper_text(summaries: Mapping[str, Mapping]) -> str:
  if "Dirichlet(0.3)" not in summaries:
    return ""
  table = summaries["Dirichlet(0.3)"]["table"]
  if not ranking(table):
    return NO_RESULTS
  first, gap = place(table, "fedadamom") == (1, 0), _against_adam(table)[2]
  headline = [row for row in plan.PAPER["headline"] if row[1].startswith("acc")]
  reported = ", ".join(f"{data} {ours_p:.2f} vs {best[0]:.2f}"
                       + (" for the best baseline" if i == 0 else "")
                       for i, (data, _, ours_p, best, _) in enumerate(headline))
  paper_gaps = [f"{d}: {fa - fb:+.2f}" for d, m, fa, _, fb in plan.PAPER["headline"]
                if fb is not None]
  return (
      "**Against the paper.** The paper reports FedAdamom first on every Dirichlet(0.3) "
      f"benchmark ({reported}; {plan.PAPER['setup']}) and ahead of FedAdam by "
      + ", ".join(paper_gaps) + " points. "
      f"Here, on Fashion-MNIST with a small model and a short budget, FedAdamom is "
      f"{'first' if first else 'not first (it ' + place_text(table) + ')'} "
      f"under Dirichlet(0.3), which {'agrees with' if first else 'does not reproduce'} "
      "the paper's ranking"
      + (f", and its gap to FedAdam is {gap:+.2f} points" if gap is not None else "")
      + ". The scales differ (data set, model, rounds), so only the direction is comparable.")


def shakespeare_paper_text(panels: Mapping[str, Mapping]) -> str:
  summary = panels["Shakespeare"]
  table = summary["table"]
  if not ranking(table):
    return NO_RESULTS
  paper, rounds = plan.PAPER["shakespeare"], summary["setup"]["rounds"]
  best_final = table[ranking(table)[0]]["final"]["mean"]
  width, n = spread(table) or 0.0, word(len(measured(table)))
  head = (
      f"**Against the paper.** The paper reports Shakespeare at {paper['rounds']} rounds: "
      f"FedAdamom {paper['fedadamom']:.2f}% vs {paper['best_baseline'][0]:.2f}% "
      f"({paper['best_baseline'][1]}), FedAdamom first by "
      f"{paper['fedadamom'] - paper['best_baseline'][0]:.2f} points. ")
  chance = summary["setup"].get("chance_accuracy")
  # Without a stored chance accuracy, one accuracy for all is the plateau's sign.
  plateau = (best_final <= chance + plan.FAILED_MARGIN if chance is not None
             else width < 0.001)
  if plateau:
    return head + f"Here, after {rounds} rounds, all {n} optimizers " + (
        f"end at chance level (the best final accuracy is {100 * best_final:.2f}%; always "
        f"predicting the most frequent character gives {pct(chance)}%)"
        if chance is not None else f"are at {100 * best_final:.2f}% (one accuracy for all)"
    ) + ": the models have not left the unigram plateau, so this budget cannot test the claim."
  failed = [f"{name(o)} in {row['failed']} of {row['seeds']} seeds"
            for o, row in measured(table).items() if row.get("failed")]
  chance_text = "" if chance is None else (
      f" Chance (always the most frequent character) is {pct(chance)}%"
      + (f"; at or below chance level (failed): {', '.join(failed)}" if failed else "") + ".")
  return head + (
      f"Here (a {rounds}-round budget, a small LSTM) FedAdamom {place_text(table)}, which "
      f"{'agrees with' if place(table, 'fedadamom') == (1, 0) else 'does not reproduce'} "
      f"the paper's ranking; the best final accuracy is {100 * best_final:.2f}% and the {n} "
      f"optimizers span {100 * width:.2f} points." + chance_text
      + f" The character model is early in training, far from the paper's "
      f"~{paper['fedadamom']:.0f}%, so the comparison speaks to early training only.")


def panel_title(summary: Mapping) -> str:
  """'lognormal(1.5)': the duration model of a study 6 table."""
  durations = summary["setup"]["asynchronous"]["durations"]
  return f"{durations['kind']}({durations['sigma']:g})"


def _standing(panels: Mapping[str, Mapping]) -> str:
  """Per spread, FedAdamom's rank and gaps to FADAS and FedAdam; how its rank moves."""
  parts, ranks = [], []
  for panel, summary in panels.items():
    table = summary["table"]
    if OURS not in measured(table):
      parts.append(f"under {panel} FedAdamom has no result")
      continue
    ranks.append(place(table, OURS)[0])
    ours, gaps = table[OURS]["final"], ""
    for rival in (r for r in RIVALS if r in measured(table)):
      theirs = table[rival]["final"]
      gaps += (f"; FedAdamom - {name(rival)}: {100 * (ours['mean'] - theirs['mean']):+.2f} "
               f"points ({GAP_VERDICTS[welch_clear(ours, theirs)]})")
    parts.append(f"under {panel} FedAdamom {place_text(table)}{gaps}")
  text = "; ".join(parts) + "."
  if len(ranks) == len(panels) > 1:
    text += (f" From {next(iter(panels))} to {list(panels)[-1]} its rank goes "
             + " -> ".join(str(r) for r in ranks) + ".")
  return text[0].upper() + text[1:]


def _fadas_text(panels: Mapping[str, Mapping]) -> str:
  """Whether FADAS' delay-adaptive rate acted: its tau_c and the staleness seen."""
  from tff_fedadamom.methods import default_hparams

  rows = {p: s["table"]["fadas"] for p, s in panels.items() if "fadas" in s["table"]}
  if not rows:
    return ""
  tau_c = next(iter(rows.values()))["hparams"].get(
      "server.delay_threshold", default_hparams("fadas")["delay_threshold"])
  seen = {p: panels[p].get("staleness") for p in rows}
  rule = (f" FADAS' delay-adaptive rate: its tau_c is {tau_c:g}, and a step whose largest "
          f"staleness tau_max exceeds {tau_c:g} divides its server rate by tau_max.")
  if not all(seen.values()):
    return rule + " The stored runs do not say which staleness they saw."
  active = [p for p, st in seen.items() if st["max"] > tau_c]
  return rule + (
      " It is active here: the final runs' steps reached a staleness of "
      + ", ".join(f"{seen[p]['max']} under {p}" for p in active) + "."
      if active else " It is inactive here: no step's staleness exceeded tau_c.")


def async_section(title: str, panels: Mapping[str, Mapping], plot: str,
                  methods: Sequence[Mapping]) -> str:
  setup = next(iter(panels.values()))["setup"]
  note = ("the server optimizers; FedCAda's and FAFED's clients keep state, which "
          "asynchronous steps do not support"
          if set(setup["methods"]) == set(plan.ASYNC_METHODS) else METHODS_NOTE)
  # The tables' `asynchronous` sections are the same but for the durations' sigma.
  settings = setup["asynchronous"]
  sigmas = ", ".join(f"{s['setup']['asynchronous']['durations']['sigma']:g}"
                     for s in panels.values())
  staleness, durations = settings["staleness"], settings["durations"]
  weight = STALENESS_WEIGHT[staleness["kind"]].format(
      **{k: v for k, v in staleness.items() if k != "kind"})
  bullet = (
      "- Asynchronous steps (FedBuff; the config's `asynchronous` section): each round is one "
      f"server step. {settings['concurrency']} clients train at once, each from the model "
      f"current when it starts; the server steps every {settings['buffer_size']} arrivals, "
      f"averaging them with weight {weight} for an update's staleness tau (server steps "
      f"since its model); updates staler than {settings['max_staleness']} steps are dropped. "
      f"Client durations: per-client {durations['kind']} speeds of mean 1 (sigma {sigmas}"
      + (", one table each" if len(panels) > 1 else "") + "), times a per-task lognormal "
      f"jitter of sigma {durations.get('jitter', 0):g}. "
      "FedAvg's server under these steps is FedBuff; FADAS reads each step's largest "
      "staleness as its tau_max.\n")
  paper_text = NO_RESULTS if not any(measured(s["table"]) for s in panels.values()) else (
      "**Under asynchrony.** The paper runs synchronous rounds only; here the server "
      "averages stale updates. "
      + (_standing(panels) if any(OURS in s["table"] for s in panels.values())
         else "FedAdamom is not in this budget's methods.")
      + _fadas_text(panels))
  return comparison_section(title, panels, plot, paper_text, methods,
                            difference="the spread of client durations",
                            extra_setup=bullet, methods_note=note)
