"""Study 6's section: the equal-budget comparison of study 1's Dirichlet(0.3)
experiment under buffered asynchronous steps (FedBuff), one table per spread of
the clients' durations.

The paper runs synchronous rounds only, so there is no number of its to compare
with; the section asks whether FedAdamom's standing against FADAS (the method
built for asynchrony) and FedAdam holds when the server averages stale updates,
and whether FADAS' delay-adaptive rate had anything to act on.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from benchmarks.paper import plan
from benchmarks.paper.report_format import measured, name, place, place_text, welch_clear
from benchmarks.paper.report_sections import NO_RESULTS, comparison_section

OURS, RIVALS = "fedadamom", ("fadas", "fedadam")
# An update's weight in the buffer's average, per `asynchronous.staleness` kind.
STALENESS_WEIGHT = {"constant": "1", "polynomial": "(1 + tau)^-{a:g}",
                    "hinge": "1 up to tau = {b}, then 1 / ({a:g} (tau - {b}) + 1)"}


def panel_title(summary: Mapping) -> str:
  """'lognormal(1.5)': the duration model of a study 6 table."""
  durations = summary["setup"]["asynchronous"]["durations"]
  return f"{durations['kind']}({durations['sigma']:g})"


def setup_bullet(panels: Mapping[str, Mapping]) -> str:
  """What the `asynchronous` section of the study's tables sets (the same for
  all but the sigma of the durations)."""
  settings = next(iter(panels.values()))["setup"]["asynchronous"]
  sigmas = ", ".join(f"{s['setup']['asynchronous']['durations']['sigma']:g}"
                     for s in panels.values())
  staleness, durations = settings["staleness"], settings["durations"]
  weight = STALENESS_WEIGHT[staleness["kind"]].format(
      **{k: v for k, v in staleness.items() if k != "kind"})
  return (
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


def _against(table: Mapping) -> list:
  """'FedAdamom - FADAS: +0.52 points (within 2 standard errors)' per rival measured."""
  ours, out = table[OURS]["final"], []
  verdicts = {True: "more than 2 standard errors", False: "within 2 standard errors",
              None: "no standard error: fewer than two seeds"}
  for rival in RIVALS:
    if rival in measured(table):
      theirs = table[rival]["final"]
      out.append(f"FedAdamom - {name(rival)}: {100 * (ours['mean'] - theirs['mean']):+.2f} "
                 f"points ({verdicts[welch_clear(ours, theirs)]})")
  return out


def _standing(panels: Mapping[str, Mapping]) -> str:
  """FedAdamom's rank and gaps per spread, and how its rank moves between them."""
  parts, ranks = [], []
  for panel, summary in panels.items():
    table = summary["table"]
    if OURS not in measured(table):
      parts.append(f"under {panel} FedAdamom has no result")
      continue
    ranks.append(place(table, OURS)[0])
    parts.append(f"under {panel} FedAdamom {place_text(table)}"
                 + "".join(f"; {gap}" for gap in _against(table)))
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


def async_paper_text(panels: Mapping[str, Mapping]) -> str:
  if not any(measured(s["table"]) for s in panels.values()):
    return NO_RESULTS
  ours = any(OURS in s["table"] for s in panels.values())
  return ("**Under asynchrony.** The paper runs synchronous rounds only; here the server "
          "averages stale updates. "
          + (_standing(panels) if ours else "FedAdamom is not in this budget's methods.")
          + _fadas_text(panels))


def async_section(title: str, panels: Mapping[str, Mapping], plot: str,
                  methods: Sequence[Mapping]) -> str:
  setup = next(iter(panels.values()))["setup"]
  studied = set(setup["methods"]) == set(plan.ASYNC_METHODS)
  note = ("the server optimizers; FedCAda's and FAFED's clients keep state, which "
          "asynchronous steps do not support" if studied else "this budget's subset")
  return comparison_section(title, panels, plot, async_paper_text(panels), methods,
                            difference="the spread of client durations",
                            extra_setup=setup_bullet(panels), methods_note=note)
