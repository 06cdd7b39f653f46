"""REPORT.md and its plots, from the studies' results (never from hand-typed numbers).

Every table says its setup; every comparison with the paper is computed here from
the numbers in the tables and the paper's numbers in `plan.PAPER`.
"""

from __future__ import annotations

import math
import os
from typing import Any, Mapping, Optional

import numpy as np

from benchmarks.paper import plan

PLOTS_DIR = "plots"
REPORT_FILE = "REPORT.md"
NAMES = {"fedavg": "FedAvg", "fedavgm": "FedAvgM", "fedadam": "FedAdam",
         "fedyogi": "FedYogi", "fedadagrad": "FedAdagrad", "fedadamom": "FedAdamom"}
PART_NAMES = {"dir0.3": "Dirichlet(0.3)", "iid": "i.i.d."}


# ---------------------------------------------------------------------------- formatting


def pct(value: Optional[float], digits: int = 2) -> str:
  return "-" if value is None else f"{100 * value:.{digits}f}"


def pm(stat: Optional[Mapping], scale: float = 100.0, digits: int = 2) -> str:
  """'mean +- std' of a mean_std dict (std omitted with one value)."""
  if not stat or stat.get("mean") is None:
    return "-"
  mean = stat["mean"] * scale
  if stat.get("std") is None:
    return f"{mean:.{digits}f}"
  return f"{mean:.{digits}f} ± {stat['std'] * scale:.{digits}f}"


def num(value: Any, digits: int = 3) -> str:
  if value is None:
    return "-"
  if isinstance(value, bool):
    return str(value)
  if isinstance(value, int):
    return str(value)
  if isinstance(value, float):
    if value != 0 and (abs(value) < 1e-2 or abs(value) >= 1e4):
      return f"{value:.{digits}g}"
    return f"{value:.{digits}g}" if abs(value) < 1 else f"{value:.{digits + 1}g}"
  return str(value)


HPARAM_NAMES = {"client.learning_rate": "eta_l", "server.learning_rate": "eta"}


def _hparams_text(hparams: Mapping) -> str:
  """'eta_l=0.05, eta=1, beta_2=0.1, ...' (client learning rate first, then the server's)."""
  return ", ".join(f"{HPARAM_NAMES.get(k, k.split('.', 1)[-1])}={num(v)}"
                   for k, v in hparams.items())


def _welch_clear(a: Mapping, b: Mapping) -> Optional[bool]:
  """Whether two mean_std dicts differ by more than 2 standard errors (Welch)."""
  if a.get("mean") is None or b.get("mean") is None or not a.get("std") or not b.get("std"):
    return None
  se = math.sqrt(a["std"] ** 2 / a["n"] + b["std"] ** 2 / b["n"])
  return abs(a["mean"] - b["mean"]) > 2 * se if se > 0 else None


def _partition_text(setup: Mapping) -> str:
  part = setup["data"].get("partition") or {}
  return ("i.i.d." if part.get("kind") == "iid"
          else f"Dirichlet(alpha={part.get('alpha')}) label skew")


def _describe_setup(setup: Mapping) -> str:
  data = setup["data"]
  if data["name"] == "fashion_mnist":
    part_text = _partition_text(setup)
    data_text = f"Fashion-MNIST, {data['num_clients']} clients, {part_text} (partition seed {data['seed']})"
  else:
    opts = data.get("options", {})
    data_text = (f"Shakespeare, clients = speaking roles ({opts.get('max_clients')} roles "
                 f"kept, seeded), next character over {opts.get('seq_length')}-character windows")
  model = setup["model"]
  model_text = model["name"] + (f" {model.get('options')}" if model.get("options") else "")
  client = setup["client"]
  client_text = ", ".join(f"{k}={v}" for k, v in client.items())
  space = setup["space"]
  metric = setup["tune_metric"]
  return (
      f"- Data: {data_text}; {setup['clients_per_round']} clients per round, uniform averaging.\n"
      f"- Model: {model_text}. Clients: SGD, {client_text}.\n"
      f"- Tuning: {setup['tune_trials']} trials x {setup['tune_rounds']} rounds per optimizer "
      f"(the same for all six), random search, seed {setup['tune_seed']}, backend "
      f"`{setup['tune_backend']}`; objective: {metric['name']} averaged over the last "
      f"{metric['last_k']} evaluations. Space: {_space_text(space)}.\n"
      f"- Final runs: the best config of each optimizer, {setup['rounds']} rounds, "
      f"evaluated every {setup['eval_every']} rounds on the held-out test set, seeds "
      f"{', '.join(str(s) for s in setup['seeds'])} (model init, client sampling and "
      f"shuffling; the partition is fixed; the tuning used seed {setup['tune_seed']}).\n")


def _space_text(space: Mapping) -> str:
  parts = []
  for key, value in space.items():
    if key in plan.OPTIMIZERS:
      inner = "; ".join(f"{HPARAM_NAMES.get(k, k.split('.', 1)[-1])} {_dist_text(v)}"
                        for k, v in value.items())
      parts.append(f"{NAMES[key]}: {inner}")
    else:
      parts.append(f"{HPARAM_NAMES.get(key, key.split('.', 1)[-1])} "
                   f"{_dist_text(value)} (all optimizers that have it)")
  return "; ".join(parts)


def _dist_text(value) -> str:
  if isinstance(value, Mapping):
    if value.get("dist") in ("loguniform", "uniform"):
      return f"{value['dist']} [{num(value['low'])}, {num(value['high'])}]"
    return f"{value.get('dist')} {value.get('values')}"
  return f"fixed {num(value)}"


# ---------------------------------------------------------------------------- plots


def _plt():
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  return plt


def _save(fig, path: str) -> str:
  """Lays out, writes and closes `fig`; returns `path`."""
  from tff_fedadamom.pipeline.outputs import save_figure

  fig.tight_layout()
  os.makedirs(os.path.dirname(path), exist_ok=True)
  save_figure(fig, path)
  _plt().close(fig)
  return path


def plot_curves(panels: Mapping[str, Mapping], path: str, title: str) -> str:
  plt = _plt()
  fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4), squeeze=False)
  for ax, (panel, summary) in zip(axes[0], panels.items()):
    for opt in plan.OPTIMIZERS:
      curve = summary["table"][opt]["curve"]
      if not curve["round"]:
        continue
      mean, std = np.array(curve["mean"]), np.array(curve["std"])
      line, = ax.plot(curve["round"], 100 * mean, label=NAMES[opt],
                      lw=2.2 if opt == "fedadamom" else 1.3)
      ax.fill_between(curve["round"], 100 * (mean - std), 100 * (mean + std),
                      color=line.get_color(), alpha=0.15)
    ax.set(xlabel="round", ylabel="test accuracy (%)", title=panel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
  fig.suptitle(title)
  return _save(fig, path)


def plot_beta2(beta2: Mapping, path: str) -> str:
  plt = _plt()
  fig, ax = plt.subplots(figsize=(5.5, 4))
  xs = list(plan.BETA2_GRID)
  for part, row in beta2["table"].items():
    means = [row[f"{x:g}"]["final"]["mean"] for x in xs]
    stds = [row[f"{x:g}"]["final"]["std"] or 0.0 for x in xs]
    ok = [i for i, m in enumerate(means) if m is not None]
    ax.errorbar([xs[i] for i in ok], [100 * means[i] for i in ok],
                yerr=[100 * stds[i] for i in ok], marker="o", capsize=3,
                label=f"ours, {PART_NAMES.get(part, part)}")
  ax.set(xscale="log", xlabel="beta_2", ylabel="final test accuracy (%)",
         title="FedAdamom beta_2 sensitivity (Fashion-MNIST)")
  ax.set_xticks(xs)
  ax.set_xticklabels([f"{x:g}" for x in xs])
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  return _save(fig, path)


def plot_escape(escape: Mapping, path: str) -> str:
  plt = _plt()
  fig, axes = plt.subplots(1, 3, figsize=(15, 4))
  for name, entry in escape["analysis"].items():
    k = np.array(entry["k_used"])
    y = np.array(entry["log_tau"])
    if not k.size:
      continue
    line, = axes[0].plot(1 / k, y, "o-", label=NAMES[name])
    axes[1].plot(1 / np.sqrt(k), y, "o-", color=line.get_color(), label=NAMES[name])
    axes[2].plot(k, y, "o", color=line.get_color(), label=NAMES[name])
    fit = entry.get("fit")
    if fit:
      grid = np.geomspace(k.min(), k.max(), 100)
      axes[2].plot(grid, fit["a"] + fit["c"] * grid ** -fit["p"], "-",
                   color=line.get_color(), alpha=0.7, label=f"fit p={fit['p']:.2f}")
  axes[0].set(xlabel="1/k", ylabel="log(mean escape time, rounds)", title="vs 1/k")
  axes[1].set(xlabel="1/sqrt(k)", ylabel="log(mean escape time, rounds)", title="vs 1/sqrt(k)")
  axes[2].set(xscale="log", xlabel="sharpness k", ylabel="log(mean escape time, rounds)",
              title="log tau = a + c k^-p")
  for ax in axes:
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
  return _save(fig, path)


def plot_hetero(hetero: Mapping, path: str) -> str:
  plt = _plt()
  fig, ax = plt.subplots(figsize=(5.5, 4))
  labels = [r["alpha"] for r in hetero["rows"]]
  means = [r["difference"]["mean"] for r in hetero["rows"]]
  stds = [r["difference"]["std"] or 0.0 for r in hetero["rows"]]
  xs = np.arange(len(labels))
  ok = [i for i, m in enumerate(means) if m is not None]
  ax.errorbar(xs[ok], [100 * means[i] for i in ok], yerr=[100 * stds[i] for i in ok],
              marker="o", capsize=3)
  ax.axhline(0.0, color="gray", lw=1)
  ax.set_xticks(xs)
  ax.set_xticklabels([f"Dir({x})" if x != "iid" else "i.i.d." for x in labels])
  ax.set(xlabel="partition (more heterogeneous to the left)",
         ylabel="FedAdamom - FedAdam (accuracy points)",
         title="Gain over FedAdam vs heterogeneity")
  ax.grid(alpha=0.3)
  return _save(fig, path)


# ---------------------------------------------------------------------------- sections


def _ranking(table: Mapping) -> list:
  scored = [(opt, row["final"]["mean"]) for opt, row in table.items()
            if row["final"]["mean"] is not None]
  return [opt for opt, _ in sorted(scored, key=lambda t: -t[1])]


def _place(table: Mapping, opt: str) -> tuple:
  """(rank of `opt` by mean final accuracy, number of others tied with it); ties
  (equal to 1e-6) share the better rank."""
  mine = table[opt]["final"]["mean"]
  others = [row["final"]["mean"] for o, row in table.items()
            if o != opt and row["final"]["mean"] is not None]
  if mine is None:
    return None, 0
  better = sum(m > mine + 1e-6 for m in others)
  tied = sum(abs(m - mine) <= 1e-6 for m in others)
  return better + 1, tied


def _place_text(table: Mapping, opt: str = "fedadamom") -> str:
  place, tied = _place(table, opt)
  if place is None:
    return "has no result"
  n = sum(row["final"]["mean"] is not None for row in table.values())
  return f"ranks {place} of {n}" + (f" (tied with {tied} other{'s' if tied > 1 else ''})"
                                     if tied else "")


def _spread(table: Mapping) -> Optional[float]:
  means = [row["final"]["mean"] for row in table.values() if row["final"]["mean"] is not None]
  return (max(means) - min(means)) if means else None


def comparison_section(title: str, summaries: Mapping[str, Mapping], plot: str,
                       paper_text: str, out_dir: str) -> str:
  lines = [f"## {title}\n\n"]
  first = next(iter(summaries.values()))
  lines.append("Setup (the partition is the only difference between the tables):\n\n"
               if len(summaries) > 1 else "Setup:\n\n")
  lines.append(_describe_setup(first["setup"]).replace(
      _partition_text(first["setup"]), "the partition of each table")
               if len(summaries) > 1 else _describe_setup(first["setup"]))
  for panel, summary in summaries.items():
    target = summary["target"]
    lines.append(f"\n### {panel}\n\n")
    lines.append(
        f"| optimizer | tuned hparams | tuning objective | final acc (%) | best acc (%) "
        f"| rounds to {100 * target:g}% (reached/seeds) | diverged |\n"
        "|---|---|---|---|---|---|---|\n")
    table = summary["table"]
    for opt in plan.OPTIMIZERS:
      row = table[opt]
      rtt = row["rounds_to_target"]
      rtt_text = (f"{pm(rtt, scale=1.0, digits=0)} ({row['reached']}/{row['seeds']})"
                  if rtt["mean"] is not None else f"- (0/{row['seeds']})")
      hp = _hparams_text(row["hparams"]) + (" (defaults: no trial converged)"
                                            if row.get("fallback_defaults") else "")
      lines.append(
          f"| {NAMES[opt]} | {hp} | {pct(row['tune_objective'])} | {pm(row['final'])} "
          f"| {pm(row['best'])} | {rtt_text} | {row['diverged']} |\n")
    ranking = _ranking(table)
    if ranking:
      place, _ = _place(table, "fedadamom")
      leader = ranking[0]
      clear = _welch_clear(table["fedadamom"]["final"], table[leader]["final"]) \
          if place != 1 else None
      adam_gap = None
      if table["fedadamom"]["final"]["mean"] is not None and \
         table["fedadam"]["final"]["mean"] is not None:
        adam_gap = 100 * (table["fedadamom"]["final"]["mean"] - table["fedadam"]["final"]["mean"])
      adam_clear = _welch_clear(table["fedadamom"]["final"], table["fedadam"]["final"])
      text = (f"\nBy mean final accuracy FedAdamom {_place_text(table)}"
              + (f"; the best is {NAMES[leader]}" if place != 1 else "")
              + (" (the gap to it is larger than 2 standard errors)" if clear
                 else " (within 2 standard errors of it)" if clear is False else "")
              + (f". FedAdamom - FedAdam: {adam_gap:+.2f} points" if adam_gap is not None else "")
              + (" (more than 2 standard errors)" if adam_clear
                 else " (within 2 standard errors)" if adam_clear is False else "")
              + f". The six means span {100 * (_spread(table) or 0):.2f} points.\n")
      lines.append(text)
  lines.append(f"\n![learning curves]({os.path.relpath(plot, out_dir)})\n")
  lines.append(f"\n{paper_text}\n")
  return "".join(lines)


def fmnist_paper_text(summaries: Mapping[str, Mapping]) -> str:
  dir03 = summaries.get("Dirichlet(0.3)")
  if dir03 is None:
    return ""
  table = dir03["table"]
  ranking = _ranking(table)
  if not ranking:
    return "**Against the paper:** no results yet."
  place, tied = _place(table, "fedadamom")
  first = place == 1 and not tied
  gap = None
  if table["fedadamom"]["final"]["mean"] is not None and table["fedadam"]["final"]["mean"] is not None:
    gap = 100 * (table["fedadamom"]["final"]["mean"] - table["fedadam"]["final"]["mean"])
  paper_gaps = [f"{d}: {fa - fb:+.2f}" for d, m, fa, _, fb in plan.PAPER["headline"]
                if fb is not None]
  verdict = ("agrees with" if first else "does not reproduce")
  return (
      "**Against the paper.** The paper reports FedAdamom first on every Dirichlet(0.3) "
      "benchmark (CIFAR-10 88.93 vs 88.14 for the best baseline, CIFAR-100 57.58 vs 54.67, "
      "Tiny-ImageNet 47.38 vs 43.83; ResNet-18, 1000 rounds) and ahead of FedAdam by "
      + ", ".join(paper_gaps) + " points. "
      f"Here, on Fashion-MNIST with a small model and a short budget, FedAdamom is "
      f"{'first' if first else 'not first (it ' + _place_text(table) + ')'} "
      f"under Dirichlet(0.3), which {verdict} the paper's ranking"
      + (f", and its gap to FedAdam is {gap:+.2f} points" if gap is not None else "")
      + ". The scales differ (data set, model, rounds), so only the direction is comparable.")


def shakespeare_paper_text(summary: Mapping) -> str:
  table = summary["table"]
  ranking = _ranking(table)
  if not ranking:
    return "**Against the paper:** no results yet."
  paper = plan.PAPER["shakespeare"]
  best_final = table[ranking[0]]["final"]["mean"]
  spread = _spread(table) or 0.0
  place, tied = _place(table, "fedadamom")
  head = (
      f"**Against the paper.** The paper reports Shakespeare at 1000 rounds: FedAdamom "
      f"{paper['fedadamom']:.2f}% vs {paper['best_baseline'][0]:.2f}% "
      f"({paper['best_baseline'][1]}), FedAdamom first by "
      f"{paper['fedadamom'] - paper['best_baseline'][0]:.2f} points. ")
  if spread < 0.001:
    return head + (
        f"Here, after {summary['setup']['rounds']} rounds, all six optimizers are at "
        f"{100 * best_final:.2f}% (the share of the most frequent character: the model has "
        f"not left the unigram plateau), so this budget cannot test the claim.")
  return head + (
      f"Here (a {summary['setup']['rounds']}-round budget, a small LSTM) FedAdamom "
      f"{_place_text(table)}, which "
      f"{'agrees with' if place == 1 and not tied else 'does not reproduce'} the paper's "
      f"ranking; the best final accuracy is {100 * best_final:.2f}% and the six optimizers "
      f"span {100 * spread:.2f} points. The character model is early in training, far "
      f"from the paper's ~48%, so the comparison speaks to early training only.")


def beta2_section(beta2: Mapping, plot: str, out_dir: str) -> str:
  xs = [f"{x:g}" for x in plan.BETA2_GRID]
  lines = ["## 3. FedAdamom beta_2 sensitivity\n\n"]
  fixed = "; ".join(f"{PART_NAMES.get(p, p)}: {_hparams_text(h)}"
                    for p, h in beta2["fixed_hparams"].items())
  lines.append(
      f"Setup: the Fashion-MNIST setting of study 1; FedAdamom with its tuned hparams "
      f"({fixed}) and beta_2 replaced by each value; {beta2['rounds']} rounds; seeds "
      f"{', '.join(str(s) for s in beta2['seeds'])}. Cells: final test accuracy (%), "
      f"mean ± std over seeds. The paper's row: Dirichlet(0.3) CIFAR-10, ResNet-18, "
      f"1000 rounds.\n\n")
  lines.append("| setting | " + " | ".join(f"beta_2={x}" for x in xs) + " |\n")
  lines.append("|---|" + "---|" * len(xs) + "\n")
  paper = plan.PAPER["beta2_dir03_cifar10"]
  lines.append("| paper, Dir(0.3) CIFAR-10 | " + " | ".join(
      f"{paper[float(x)]:.2f}" for x in xs) + " |\n")
  verdicts = []
  for part, row in beta2["table"].items():
    lines.append(f"| ours, {PART_NAMES.get(part, part)} | " + " | ".join(
        pm(row[x]["final"]) for x in xs) + " |\n")
    means = {x: row[x]["final"]["mean"] for x in xs if row[x]["final"]["mean"] is not None}
    if len(means) == len(xs):
      peak = max(means, key=means.get)
      spread = 100 * (max(means.values()) - min(means.values()))
      verdicts.append(
          f"{PART_NAMES.get(part, part)}: peak at beta_2={peak} "
          f"({'as in' if peak == '0.05' else 'unlike'} the paper's 0.05), spread "
          f"{spread:.2f} points ({'within' if spread <= 1.0 else 'wider than'} the paper's "
          f"0.80-point spread)")
  lines.append(f"\n![beta_2 sensitivity]({os.path.relpath(plot, out_dir)})\n\n")
  if verdicts:
    lines.append("**Against the paper.** The paper finds a flat optimum peaking at 0.05 "
                 "(88.13-88.93, spread 0.80 points). Ours: " + "; ".join(verdicts) + ". "
                 "With few seeds, differences smaller than the standard deviations are "
                 "not resolved.\n")
  return "".join(lines)


def escape_section(escape: Mapping, plot: str, out_dir: str) -> str:
  raw = escape["raw"]
  setup = raw["setup"]
  analysis = escape["analysis"]
  per_opt = escape["per_optimizer"]
  ks = setup["ks"]
  lines = ["## 4. Escape from sharp minima\n\n"]
  lines.append(
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
      + ", ".join(f"{NAMES[o]} {per_opt[o]['lr']:.4g}" for o in per_opt) + ").\n\n")
  lines.append("Mean escape time tau (rounds) and escaped fraction per sharpness k:\n\n")
  lines.append("| k | " + " | ".join(f"{NAMES[o]} tau (escaped)" for o in per_opt) + " |\n")
  lines.append("|---|" + "---|" * len(per_opt) + "\n")
  for i, k in enumerate(ks):
    cells = []
    for o in per_opt:
      r = per_opt[o]["per_k"][i]
      tau = "-" if r["tau"] is None else f"{r['tau']:.4g}"
      cells.append(f"{tau} ({r['escaped']}/{r['particles']})")
    lines.append(f"| {k:g} | " + " | ".join(cells) + " |\n")
  lines.append(
      "\nFits over the k with at least 10 escapes (k span = k_max/k_min used). r: Pearson "
      "correlation of log tau = -log(escape rate) with 1/k and with 1/sqrt(k). p: the "
      "exponent of log tau = a + c k^-p (least squares, 90% bootstrap interval over "
      "particles). p with prefactor: log tau = a + b log k + c k^-p, which lets the "
      "Kramers prefactor (the escape attempt frequency, a power of k) be separated from "
      "the exponent.\n\n")
  lines.append("| optimizer | k span | r vs 1/k | r vs 1/sqrt(k) | better linear fit | p (90% CI) "
               "| p with prefactor (90% CI), b | paper |\n|---|---|---|---|---|---|---|---|\n")
  claims = {"fedavgm": "1/k", "fedadam": "1/sqrt(k)", "fedadamom": "1/k"}
  verdicts = []
  for o, a in analysis.items():
    r1, r2 = a.get("r_inv_k"), a.get("r_inv_sqrt_k")
    better = None if r1 is None or r2 is None else ("1/k" if r1 > r2 else "1/sqrt(k)")
    fit, fit3 = a.get("fit"), a.get("fit_prefactor")
    ci = a.get("p_interval")
    ci3 = a.get("p_prefactor_interval")
    p_text = "-" if not fit else f"{fit['p']:.2f}" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "")
    p3_text = "-" if not fit3 else (f"{fit3['p']:.2f}" + (f" [{ci3[0]:.2f}, {ci3[1]:.2f}]"
                                                          if ci3 else "") + f", b={fit3['b']:.2f}")
    span = "-" if a.get("k_span") is None else f"{a['k_span']:.3g}"
    lines.append(f"| {NAMES[o]} | {span} | {num(r1, 4)} | {num(r2, 4)} | {better or '-'} | "
                 f"{p_text} | {p3_text} | {claims[o]} |\n")
    if better is not None:
      verdicts.append(f"{NAMES[o]}: the better linear fit is {better} "
                      f"({'as' if better == claims[o] else 'unlike'} the paper's {claims[o]})")
  lines.append(f"\n![escape times]({os.path.relpath(plot, out_dir)})\n\n")
  exponents = {"1/k": 1.0, "1/sqrt(k)": 0.5}
  for o, a in analysis.items():
    ci3 = a.get("p_prefactor_interval")
    want = exponents[claims[o]]
    if ci3 and ci3[1] - ci3[0] <= 1.0:
      inside = ci3[0] <= want <= ci3[1]
      verdicts.append(f"with the prefactor term, {NAMES[o]}'s exponent interval "
                      f"[{ci3[0]:.2f}, {ci3[1]:.2f}] {'contains' if inside else 'excludes'} "
                      f"the paper's p = {want:g}")
    elif ci3:
      verdicts.append(f"with the prefactor term, {NAMES[o]}'s exponent is not determined "
                      f"(interval [{ci3[0]:.2f}, {ci3[1]:.2f}])")
    if a.get("log_tau") and max(a["log_tau"]) < 6.0:
      verdicts.append(
          f"{NAMES[o]}'s escapes are fast at every k (tau <= "
          f"{math.exp(max(a['log_tau'])):.0f} rounds, not far above the time to cross the "
          f"well), so it is not in the barrier-limited regime where log tau ~ k^-p is "
          f"derived, and its exponents are only descriptive")
  p = {o: (a.get("fit") or {}).get("p") for o, a in analysis.items()}
  order = None
  if all(p.get(o) is not None for o in ("fedavgm", "fedadam", "fedadamom")):
    order = p["fedadam"] < min(p["fedavgm"], p["fedadamom"])
  spans = [a.get("k_span") or 0 for a in analysis.values()]
  rs = [r for a in analysis.values() for r in (a.get("r_inv_k"), a.get("r_inv_sqrt_k"))
        if r is not None]
  min_r = min(rs) if rs else float("nan")
  lines.append(
      "**Against the paper.** " + ("; ".join(verdicts) + ". " if verdicts else "")
      + ("" if order is None else
         f"The fitted exponents {'do' if order else 'do not'} order as the paper predicts "
         f"(FedAdam's escape time depends on sharpness more weakly than FedAvgM's and "
         f"FedAdamom's: p = {p['fedadam']:.2f} vs {p['fedavgm']:.2f} and "
         f"{p['fedadamom']:.2f}). ")
      + (f"Over the k range used, Pearson r is at least {min_r:.3f} for both forms and "
         "every optimizer, so r separates 1/k from 1/sqrt(k) only weakly; the exponent "
         "fits are sharper. The two-term fit folds the prefactor's power of k into p and "
         "biases it downwards; the fit with a log k term removes most of that bias, but a "
         "three-parameter fit over a few points is loose (see its interval)."
         if min(spans or [0]) >= 10 else
         "For some optimizer fewer than a decade of k had enough escapes, so its exponent "
         "is poorly determined (increase max_rounds)."))
  lines.append("\n")
  return "".join(lines)


def hetero_section(hetero: Mapping, plot: str, out_dir: str, target_setup: Mapping) -> str:
  lines = ["## 5. Heterogeneity: FedAdamom - FedAdam\n\n"]
  lines.append(
      f"Setup: the Fashion-MNIST setting of study 1, with the hparams FedAdam and FedAdamom "
      f"were tuned to under Dirichlet(0.3), held fixed while the partition changes; "
      f"{hetero['rounds']} rounds; seeds {', '.join(str(s) for s in hetero['seeds'])}. "
      f"Difference: FedAdamom minus FedAdam final accuracy, paired by seed (points).\n\n")
  lines.append("| partition | FedAdam final (%) | FedAdamom final (%) | difference (points) |\n"
               "|---|---|---|---|\n")
  for row in hetero["rows"]:
    label = "i.i.d." if row["alpha"] == "iid" else f"Dirichlet({row['alpha']})"
    lines.append(f"| {label} | {pm(row['fedadam']['final'])} | "
                 f"{pm(row['fedadamom']['final'])} | {pm(row['difference'])} |\n")
  lines.append(f"\n![gain vs heterogeneity]({os.path.relpath(plot, out_dir)})\n\n")
  diffs = [r["difference"]["mean"] for r in hetero["rows"]]
  if all(d is not None for d in diffs):
    increasing = diffs[0] > diffs[-1] and all(a >= b for a, b in zip(diffs, diffs[1:]))
    corr = float(np.corrcoef(np.arange(len(diffs)), diffs)[0, 1]) if np.std(diffs) > 0 else 0.0
    trend = -corr  # > 0: the gain grows with heterogeneity
    if increasing:
      verdict = "it shrinks monotonically as heterogeneity decreases, as the paper says"
    elif trend >= 0.5:
      verdict = (f"it tends to grow with heterogeneity (correlation with the heterogeneity "
                 f"rank {trend:+.2f}), as the paper says, but not monotonically")
    elif trend <= -0.5:
      verdict = (f"it tends to shrink with heterogeneity (correlation with the heterogeneity "
                 f"rank {trend:+.2f}), unlike the paper")
    else:
      verdict = (f"there is no clear trend (correlation with the heterogeneity rank "
                 f"{trend:+.2f}), which does not support the paper's claim")
    lines.append(
        "**Against the paper.** The paper says the gain over FedAdam grows with "
        "heterogeneity. Here the difference goes "
        + " -> ".join(f"{100 * d:+.2f}" for d in diffs)
        + f" points from Dir(0.1) to i.i.d.: {verdict}. Each difference's standard "
        "deviation over seeds is in the table.\n")
  return "".join(lines)


# ---------------------------------------------------------------------------- the report


def write_report(out_dir: str, results: Mapping, *, mode: str, commands: str,
                 timings: Mapping) -> str:
  from tff_fedadamom.atomic_io import atomic_write_text

  plots = os.path.join(out_dir, PLOTS_DIR)
  sections = [
      "# FedAdamom: the paper's claims at laptop scale\n\n",
      "Generated by `benchmarks/paper/reproduce.py`; every number below comes from the "
      "runs it made (cached under `cache/`, all numbers also in `results.json`). "
      f"Mode: **{mode}**"
      + (" (a smoke test of the pipeline: budgets far too small for any conclusion)"
         if mode == "quick" else "") + ".\n\n",
      f"Regenerate: `{commands}`.\n\n",
      "The claims checked are those in the project's notes on the paper: FedAdamom "
      "generalizes better than FedAvg/FedAvgM/FedAdam/FedYogi/FedAdagrad on "
      "heterogeneous data (1, 2), with a flat beta_2 optimum near 0.05 (3), because "
      "its escape time from a minimum depends on sharpness like SGD's, 1/k, rather "
      "than Adam's 1/sqrt(k) (4), and its gain over FedAdam grows with heterogeneity "
      "(5). Accuracies are percentages; mean ± sample std over seeds.\n\n",
  ]
  summary_lines = []
  if "fmnist" in results:
    panels = {PART_NAMES[p]: s for p, s in results["fmnist"].items()}
    plot = plot_curves(panels, os.path.join(plots, "fmnist_curves.png"),
                       "Fashion-MNIST: best config of each optimizer, mean ± std over seeds")
    sections.append(comparison_section("1. Equal-budget comparison on Fashion-MNIST", panels,
                                       plot, fmnist_paper_text(panels), out_dir))
    summary_lines.append(_one_line("Fashion-MNIST Dir(0.3)", panels.get("Dirichlet(0.3)")))
    summary_lines.append(_one_line("Fashion-MNIST i.i.d.", panels.get("i.i.d.")))
  else:
    sections.append("## 1. Equal-budget comparison on Fashion-MNIST\n\nNot run yet.\n")
  if "shakespeare" in results:
    panels = {"Shakespeare": results["shakespeare"]}
    plot = plot_curves(panels, os.path.join(plots, "shakespeare_curves.png"),
                       "Shakespeare: best config of each optimizer, mean ± std over seeds")
    sections.append("\n" + comparison_section(
        "2. Equal-budget comparison on Shakespeare", panels, plot,
        shakespeare_paper_text(results["shakespeare"]), out_dir))
    summary_lines.append(_one_line("Shakespeare", results["shakespeare"]))
  else:
    sections.append("\n## 2. Equal-budget comparison on Shakespeare\n\nNot run yet.\n")
  if "beta2" in results:
    plot = plot_beta2(results["beta2"], os.path.join(plots, "beta2.png"))
    sections.append("\n" + beta2_section(results["beta2"], plot, out_dir))
  else:
    sections.append("\n## 3. FedAdamom beta_2 sensitivity\n\nNot run yet.\n")
  if "escape" in results:
    plot = plot_escape(results["escape"], os.path.join(plots, "escape.png"))
    sections.append("\n" + escape_section(results["escape"], plot, out_dir))
  else:
    sections.append("\n## 4. Escape from sharp minima\n\nNot run yet.\n")
  if "hetero" in results:
    plot = plot_hetero(results["hetero"], os.path.join(plots, "heterogeneity.png"))
    sections.append("\n" + hetero_section(results["hetero"], plot, out_dir, {}))
  else:
    sections.append("\n## 5. Heterogeneity: FedAdamom - FedAdam\n\nNot run yet.\n")
  if summary_lines:
    sections.insert(4, "Summary (mean final accuracy, best first):\n\n"
                    + "".join(f"- {line}\n" for line in summary_lines if line) + "\n")
  sections.append("\n## Run\n\n" + "".join(
      f"- {k}: {v}\n" for k, v in timings.items()))
  text = "".join(sections)
  path = os.path.join(out_dir, REPORT_FILE)
  atomic_write_text(path, text)
  return path


def _one_line(label: str, summary: Optional[Mapping]) -> str:
  if not summary:
    return ""
  table = summary["table"]
  ranking = _ranking(table)
  if not ranking:
    return ""
  text = f"{label}: {NAMES[ranking[0]]} {pct(table[ranking[0]]['final']['mean'])}"
  for prev, opt in zip(ranking, ranking[1:]):
    tie = abs(table[prev]["final"]["mean"] - table[opt]["final"]["mean"]) <= 1e-6
    text += f" {'=' if tie else '>'} {NAMES[opt]} {pct(table[opt]['final']['mean'])}"
  return text
