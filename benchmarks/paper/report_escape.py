"""The report's section on study 4: escape times from minima of controlled
sharpness, their fits, and the paper's claimed scaling (`plan.PAPER["escape"]`)."""

from __future__ import annotations

import math
from typing import Mapping

from benchmarks.paper import plan
from benchmarks.paper.report_format import name, num

# The exponent p of log(tau) ~ k^-p that each of the paper's forms means.
EXPONENTS = {"1/k": 1.0, "1/sqrt(k)": 0.5}


def _setup_text(raw: Mapping, per_opt: Mapping) -> str:
  setup = raw["setup"]
  return (
      f"Setup: f_k(x) = sum_i st(sqrt(k) x_i) over {setup['dim']} coordinates, st(u) = "
      f"(u^4 - 16u^2 + 5u)/2 (Styblinski-Tang): the local minimum u = {raw['u_local']:.4f} has "
      f"Hessian k * {raw['h0']:.2f} and a barrier dL = {raw['barrier']:.2f} that does not "
      f"depend on k. Pseudo-gradients: grad f_k + N(0, s * k * h0) per coordinate, "
      f"s = {raw['noise_scale']:.4g} (the mean of a round's client gradients with "
      f"minibatch noise proportional to the Hessian). {setup['particles']} particles per "
      f"(optimizer, k), started at the local minimum with zero optimizer state; escape = "
      f"some coordinate past u = {raw['u_escaped']:g}; censored at {setup['max_rounds']} "
      f"rounds; tau = 1 / (exponential-MLE escape rate). Optimizers: the registry's own, "
      f"stepped by their `next`, batched with `tf.vectorized_map` (FedAdamom's vbar per "
      f"particle). FedAvgM momentum {setup['momentum']}; FedAdam (beta_1, beta_2, eps) = "
      f"{tuple(setup['adam'])}; FedAdamom (beta_2, eps) = {tuple(setup['adamom'])}. "
      f"Step sizes matched at the minimum of k_ref = {raw['k_ref']:.3g}: mean |step| per "
      f"coordinate = {raw['matched']['target_mean_step']:.4g} for all three (learning rates "
      + ", ".join(f"{name(o)} {per_opt[o]['lr']:.4g}" for o in per_opt) + ").\n\n")


def _taus(ks, per_opt: Mapping) -> str:
  lines = ["Mean escape time tau (rounds) and escaped fraction per sharpness k:\n\n",
           "| k | " + " | ".join(f"{name(o)} tau (escaped)" for o in per_opt) + " |\n",
           "|---|" + "---|" * len(per_opt) + "\n"]
  for i, k in enumerate(ks):
    cells = [("-" if r["tau"] is None else f"{r['tau']:.4g}") + f" ({r['escaped']}/"
             f"{r['particles']})" for r in (per_opt[o]["per_k"][i] for o in per_opt)]
    lines.append(f"| {k:g} | " + " | ".join(cells) + " |\n")
  return "".join(lines)


def _interval(ci) -> str:
  return f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else ""


def _fits(analysis: Mapping, verdicts: list) -> str:
  """The fits' table; appends each optimizer's better linear fit to `verdicts`."""
  claims = plan.PAPER["escape"]
  lines = [
      "\nFits over the k with at least 10 escapes (k span = k_max/k_min used). r: Pearson "
      "correlation of log tau = -log(escape rate) with 1/k and with 1/sqrt(k). p: the "
      "exponent of log tau = a + c k^-p (least squares, 90% bootstrap interval over "
      "particles). p with prefactor: log tau = a + b log k + c k^-p, which lets the "
      "Kramers prefactor (the escape attempt frequency, a power of k) be separated from "
      "the exponent.\n\n",
      "| optimizer | k span | r vs 1/k | r vs 1/sqrt(k) | better linear fit | p (90% CI) "
      "| p with prefactor (90% CI), b | paper |\n|---|---|---|---|---|---|---|---|\n"]
  for o, a in analysis.items():
    r1, r2, fit, fit3 = a.get("r_inv_k"), a.get("r_inv_sqrt_k"), a.get("fit"), \
        a.get("fit_prefactor")
    better = None if r1 is None or r2 is None else ("1/k" if r1 > r2 else "1/sqrt(k)")
    p_text = "-" if not fit else f"{fit['p']:.2f}" + _interval(a.get("p_interval"))
    p3_text = "-" if not fit3 else (f"{fit3['p']:.2f}" + _interval(
        a.get("p_prefactor_interval")) + f", b={fit3['b']:.2f}")
    span = "-" if a.get("k_span") is None else f"{a['k_span']:.3g}"
    lines.append(f"| {name(o)} | {span} | {num(r1, 4)} | {num(r2, 4)} | {better or '-'} | "
                 f"{p_text} | {p3_text} | {claims[o]} |\n")
    if better is not None:
      verdicts.append(f"{name(o)}: the better linear fit is {better} "
                      f"({'as' if better == claims[o] else 'unlike'} the paper's {claims[o]})")
  return "".join(lines)


def _exponent_verdicts(analysis: Mapping) -> list:
  out, claims = [], plan.PAPER["escape"]
  for o, a in analysis.items():
    ci3, want = a.get("p_prefactor_interval"), EXPONENTS[claims[o]]
    if ci3 and ci3[1] - ci3[0] <= 1.0:
      out.append(f"with the prefactor term, {name(o)}'s exponent interval "
                 f"[{ci3[0]:.2f}, {ci3[1]:.2f}] "
                 f"{'contains' if ci3[0] <= want <= ci3[1] else 'excludes'} "
                 f"the paper's p = {want:g}")
    elif ci3:
      out.append(f"with the prefactor term, {name(o)}'s exponent is not determined "
                 f"(interval [{ci3[0]:.2f}, {ci3[1]:.2f}])")
    if a.get("log_tau") and max(a["log_tau"]) < 6.0:
      out.append(
          f"{name(o)}'s escapes are fast at every k (tau <= "
          f"{math.exp(max(a['log_tau'])):.0f} rounds, not far above the time to cross the "
          f"well), so it is not in the barrier-limited regime where log tau ~ k^-p is "
          f"derived, and its exponents are only descriptive")
  return out


def _against_the_paper(analysis: Mapping, verdicts: list) -> str:
  p = {o: (a.get("fit") or {}).get("p") for o, a in analysis.items()}
  order = None
  if all(p.get(o) is not None for o in ("fedavgm", "fedadam", "fedadamom")):
    order = p["fedadam"] < min(p["fedavgm"], p["fedadamom"])
  spans = [a.get("k_span") or 0 for a in analysis.values()]
  rs = [r for a in analysis.values() for r in (a.get("r_inv_k"), a.get("r_inv_sqrt_k"))
        if r is not None]
  return (
      "**Against the paper.** " + ("; ".join(verdicts) + ". " if verdicts else "")
      + ("" if order is None else
         f"The fitted exponents {'do' if order else 'do not'} order as the paper predicts "
         f"(FedAdam's escape time depends on sharpness more weakly than FedAvgM's and "
         f"FedAdamom's: p = {p['fedadam']:.2f} vs {p['fedavgm']:.2f} and "
         f"{p['fedadamom']:.2f}). ")
      + (f"Over the k range used, Pearson r is at least "
         f"{min(rs) if rs else float('nan'):.3f} for both forms and "
         "every optimizer, so r separates 1/k from 1/sqrt(k) only weakly; the exponent "
         "fits are sharper. The two-term fit folds the prefactor's power of k into p and "
         "biases it downwards; the fit with a log k term removes most of that bias, but a "
         "three-parameter fit over a few points is loose (see its interval)."
         if min(spans or [0]) >= 10 else
         "For some optimizer fewer than a decade of k had enough escapes, so its exponent "
         "is poorly determined (increase max_rounds).") + "\n")


def escape_section(escape: Mapping, plot: str) -> str:
  raw, analysis, per_opt = escape["raw"], escape["analysis"], escape["per_optimizer"]
  verdicts: list = []
  text = ("## 4. Escape from sharp minima\n\n" + _setup_text(raw, per_opt)
          + _taus(raw["setup"]["ks"], per_opt) + _fits(analysis, verdicts)
          + f"\n![escape times]({plot})\n\n")
  return text + _against_the_paper(analysis, verdicts + _exponent_verdicts(analysis))
