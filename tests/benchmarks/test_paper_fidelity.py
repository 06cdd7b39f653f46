"""The report's fidelity rules (benchmarks/paper/report_sections.py, report_studies.py):
tuned values at the edge of their range, runs at chance level, each method's bias
correction, the heterogeneity verdict's standard errors, and study 6 (asynchronous steps)
in the report's bookkeeping."""

import copy
import json
import math
import os
import types

import pytest

from tff_fedadamom.metric_names import MAX_STALENESS, MEAN_STALENESS, ROUND, TEST_ACCURACY

from benchmarks.paper import plan, report, report_sections, report_studies
from benchmarks.paper import reproduce, studies

PAPER_DIR = os.path.dirname(os.path.abspath(reproduce.__file__))
loguniform = lambda low, high: {"dist": "loguniform", "low": low, "high": high}
uniform = lambda low, high: {"dist": "uniform", "low": low, "high": high}
BUDGET = plan.DataBudget(rounds=2, eval_every=1, tune_trials=2, tune_rounds=1,
                         seeds=(1, 2), target=0.5, targets=(0.5,))


def _committed():
  with open(os.path.join(PAPER_DIR, reproduce.RESULTS_FILE)) as f:
    return json.load(f)


def _record(acc, seed=1, status="completed", staleness=None):
  out = {"status": status, "final_test_accuracy": acc, "best_test_accuracy": acc,
         "rounds_to_target": {"0.5": 1}, "history": [{ROUND: 1, TEST_ACCURACY: acc}],
         "seed": seed}
  if staleness is not None:
    out["async_history"] = [{ROUND: i + 1, MEAN_STALENESS: m, MAX_STALENESS: x}
                            for i, (m, x) in enumerate(staleness)]
  return out


def _summary(finals, hparams=None, trials=None, chance=0.1, ranges=None, base_extra=None):
  """A comparison summary of the methods of `finals` ({method: [acc per seed]}), each
  tuned over `ranges` ({path: distribution})."""
  best = {o: {"config": {"client": {"learning_rate": 0.1},
                         "server": {"optimizer": o, **(hparams or {}).get(o, {})}},
              "objective": 0.5, "trials_run": len((trials or {}).get(o, [])) or 2,
              "trials": (trials or {}).get(o, []), "ranges": ranges or {}} for o in finals}
  base = {"data": {"name": "fashion_mnist", "num_clients": 10, "seed": 0,
                   "partition": {"kind": "iid"}},
          "model": {"name": "mlp"}, "clients_per_round": 5, "client": {}, "eval_every": 1,
          **(base_extra or {})}
  comparison = {"tuning": {"best": best, "backend": "inprocess", "seed": 0,
                           "metric": {"name": TEST_ACCURACY, "last_k": 1},
                           "space": {}}, "base": base}
  units = [types.SimpleNamespace(name=f"s/{o}/seed{i}", config={"server": {"optimizer": o}})
           for o, accs in finals.items() for i in range(len(accs))]
  results = {f"s/{o}/seed{i}": acc if isinstance(acc, dict) else _record(acc, seed=i)
             for o, accs in finals.items() for i, acc in enumerate(accs)}
  return studies.summarize_comparison("s", comparison, BUDGET, results, units, chance)


# ---------------------------------------------------------------------------- edges


def test_range_position_is_linear_in_log_space_for_loguniform():
  assert report_sections.range_position(1.0, loguniform(0.1, 10.0)) == pytest.approx(0.5)
  assert report_sections.range_position(0.5, uniform(0.0, 2.0)) == pytest.approx(0.25)


def test_a_tuned_value_within_five_percent_of_an_end_is_at_the_edge():
  ranges = {"client.learning_rate": loguniform(0.01, 1.0),
            "server.learning_rate": loguniform(0.1, 10.0), "server.momentum": uniform(0.5, 0.95)}
  # log-space positions: 0.105 -> 0.011 (edge), 0.13 -> 0.057 (not); momentum
  # 0.93 -> 0.956 (edge), 0.92 -> 0.933 (not); the client rate 0.1 -> 0.5.
  row = lambda lr, momentum: {"ranges": ranges, "hparams": {"client.learning_rate": 0.1,
                                                            "server.learning_rate": lr,
                                                            "server.momentum": momentum}}
  found = report_sections.edges("fedavgm", row(0.105, 0.93))
  assert [(p, end) for p, _, _, end in found] == [("server.learning_rate", "low"),
                                                  ("server.momentum", "high")]
  assert report_sections.edges("fedavgm", row(0.13, 0.92)) == []
  assert report_sections.edges("fedavgm", {**row(0.105, 0.93), "fallback_defaults": True}) == []
  note = report_sections.edge_note({"fedavgm": row(0.105, 0.92)}, ["fedavgm"])
  assert "FedAvgM eta=0.105 (loguniform [0.1, 10], low end)" in note
  assert "momentum" not in note


def test_a_comparison_table_marks_the_edge_values_and_names_them():
  ranges = {"client.learning_rate": loguniform(0.01, 1.0),
            "server.learning_rate": loguniform(0.3, 3.0)}
  summary = _summary({"fedavg": [0.6, 0.7]}, hparams={"fedavg": {"learning_rate": 2.95}},
                     ranges=ranges)
  methods = [{"name": "fedavg", "communication": 1.0}]
  text = report_sections.comparison_section("T", {"P": summary}, "p.png", "", methods)
  row = next(line for line in text.splitlines() if line.startswith("| FedAvg |"))
  assert "eta=2.95†" in row and "eta_l=0.1," in row
  assert "† Tuned to within 5% of an end of its search range" in text
  assert "FedAvg eta=2.95 (loguniform [0.3, 3], high end)" in text


# ---------------------------------------------------------------------------- chance


def test_a_completed_run_at_most_one_point_above_chance_failed():
  finals = [(True, 0.105), (True, 0.111), (False, 0.05), (True, None), (True, 0.08)]
  assert studies.count_failed(finals, 0.1) == 2
  assert studies.count_failed(finals, None) is None


def test_failed_final_runs_and_trials_are_counted_and_shown():
  trials = {"fafed": [{"diverged": False, "final": 0.104}, {"diverged": True, "final": 0.1},
                      {"diverged": False, "final": 0.5}]}
  summary = _summary({"fedavg": [0.6, 0.7], "fafed": [0.1, 0.6]}, trials=trials)
  table = summary["table"]
  assert summary["setup"]["chance_accuracy"] == 0.1
  assert (table["fafed"]["failed"], table["fafed"]["trials_failed"]) == (1, 1)
  assert (table["fedavg"]["failed"], table["fedavg"]["diverged"]) == (0, 0)
  methods = [{"name": o, "communication": 1.0} for o in ("fedavg", "fafed")]
  text = report_sections.comparison_section("T", {"P": summary}, "p.png", "", methods)
  header = next(line for line in text.splitlines() if line.startswith("| optimizer"))
  assert header.endswith("| diverged | failed |")
  fafed = next(line for line in text.splitlines() if line.startswith("| FAFED |"))
  assert fafed.endswith("| 0 | 1 |") and "(1 of 3 trials failed)" in fafed
  assert "(10.00%)" in text and "at most 1 point above chance" in text
  unknown = _summary({"fedavg": [0.6, 0.7]}, chance=None)
  assert unknown["table"]["fedavg"]["failed"] is None
  assert "Failed runs: not counted" in report_sections.chance_bullet({"P": unknown})


def test_chance_accuracy_is_the_share_of_the_most_frequent_test_label():
  assert studies.chance_accuracy(plan.fmnist_base(plan.QUICK, {"kind": "iid"})) == 0.1
  shakespeare = studies.chance_accuracy(plan.shakespeare_base(plan.QUICK))
  assert 0.1 < shakespeare < 0.3  # the space character's share, padding excluded


def test_shakespeare_text_says_chance_level_from_the_stored_chance():
  doc = _committed()
  panel = copy.deepcopy(doc["results"]["shakespeare"])
  panel["setup"]["chance_accuracy"] = 0.1639
  for row in panel["table"].values():
    row["final"]["mean"], row["failed"], row["seeds"] = 0.1642, 3, 3
  text = report_sections.shakespeare_paper_text({"Shakespeare": panel})
  assert ("end at chance level (the best final accuracy is 16.42%; always predicting the "
          "most frequent character gives 16.39%)") in text
  panel["table"]["fedavg"]["final"]["mean"], panel["table"]["fedavg"]["failed"] = 0.4, 0
  text = report_sections.shakespeare_paper_text({"Shakespeare": panel})
  assert "Chance (always the most frequent character) is 16.39%" in text
  assert "at or below chance level (failed): FedAvgM in 3 of 3 seeds" in text


# ---------------------------------------------------------------------------- bias correction


def test_the_bias_correction_bullet_follows_each_tuned_config():
  hparams = {"fedadam": {"bias_correction": False}, "fadas": {"bias_correction": True}}
  summary = _summary({o: [0.6, 0.7] for o in ("fedavg", "fedadam", "fedamsgrad", "fadas",
                                              "fedcada", "fedadamom")}, hparams=hparams)
  bullet = report_sections.bias_bullet({"P": summary}, list(summary["table"]))
  assert bullet == (
      "- Bias correction, as each tuned config has it (`server.bias_correction`): "
      "on: FedAMSGrad, FADAS; off: FedAdam; always on in its rule (its clients' Adam, no "
      "switch): FedCAda; none in its rule: FedAvg, FedAdamom.\n")
  other = copy.deepcopy(summary)
  other["table"]["fedamsgrad"]["hparams"]["server.bias_correction"] = False
  bullet = report_sections.bias_bullet({"A": summary, "B": other}, ["fedamsgrad"])
  assert "on in A, off in B: FedAMSGrad" in bullet


# ---------------------------------------------------------------------------- heterogeneity


def _hetero(diffs, std, n=3):
  stat = lambda mean, s: {"mean": mean, "std": s, "n": n}
  rows = [{"alpha": a, "fedadam": {"final": stat(0.8, 0.01), "seeds": n},
           "fedadamom": {"final": stat(0.8 + d, 0.01), "seeds": n},
           "difference": stat(d, std), "paired_seeds": [str(i) for i in range(n)]}
          for a, d in zip(("0.1", "1.0", "iid"), diffs)]
  return {"rows": rows, "seeds": list(range(n)), "rounds": 10}


def test_the_heterogeneity_trend_is_claimed_only_beyond_two_standard_errors():
  diffs = (0.03, 0.01, -0.01)  # Dir(0.1) - i.i.d. = 4 points
  small = report_studies.hetero_section(_hetero(diffs, std=0.01), "h.png")
  assert "it shrinks monotonically as heterogeneity decreases, as the paper says" in small
  assert "exceeds 2 standard errors of that change (SE 0.82, Welch)" in small
  large = report_studies.hetero_section(_hetero(diffs, std=0.04), "h.png")  # SE 3.27
  assert "shrinks monotonically" not in large
  assert ("is within 2 standard errors of that change (SE 3.27, Welch): the differences "
          "are within their standard errors, so the claim is not resolved at this budget"
          in large)
  single = report_studies.hetero_section(_hetero(diffs, std=None, n=1), "h.png")
  assert "has no standard error" in single and "not resolved" in single


# ---------------------------------------------------------------------------- study 6


def _async_panel(sigma, finals, staleness=((0.4, 1), (1.2, 3))):
  base_extra = {"asynchronous": {**plan.ASYNC_SETTINGS, "durations": {
      "kind": "lognormal", "sigma": sigma, "jitter": plan.ASYNC_JITTER}}}
  records = {o: [_record(a, seed=i, staleness=staleness) for i, a in enumerate(accs)]
             for o, accs in finals.items()}
  return _summary(records, base_extra=base_extra)


def test_staleness_summary_is_over_every_step_of_every_run():
  runs = [_record(0.5, staleness=((0.0, 0), (1.0, 2))), _record(0.5, staleness=((2.0, 5),)),
          _record(0.5)]
  seen = studies.staleness_summary(runs)
  assert seen["mean"] == pytest.approx(1.0) and seen["max"] == 5
  assert (seen["runs"], seen["steps"]) == (2, 3)
  assert studies.staleness_summary([_record(0.5)]) is None


def test_the_async_section_compares_fedadamom_with_fadas_and_fedadam_per_spread():
  finals = {"fedavg": [0.70, 0.72], "fedavgm": [0.70, 0.71], "fadas": [0.74, 0.75],
            "fedadam": [0.60, 0.61], "fedadamom": [0.745, 0.755]}
  panels = {"lognormal(0.5)": _async_panel(0.5, finals),
            "lognormal(1.5)": _async_panel(1.5, {**finals, "fedadamom": [0.65, 0.66]})}
  methods = [{"name": o, "communication": 1.0} for o in plan.ASYNC_METHODS]
  text = report_sections.async_section("6. Async", panels, "a.png", methods)
  assert "Setup (the spread of client durations is the only difference" in text
  assert "(sigma 0.5, 1.5, one table each)" in text
  assert text.count("Observed staleness of the final runs (10 runs, 20 server steps): "
                    "0.80 server steps per update on average (the mean of each step's mean), "
                    "at most 3") == 2
  assert "Under lognormal(0.5) FedAdamom ranks 1 of 5; FedAdamom - FADAS" in text
  assert "FedAdamom - FADAS: +0.50 points (within 2 standard errors)" in text
  assert "FedAdamom - FedAdam: +14.50 points (more than 2 standard errors)" in text
  assert "under lognormal(1.5) FedAdamom ranks 4 of 5" in text
  assert "From lognormal(0.5) to lognormal(1.5) its rank goes 1 -> 4." in text
  assert "its tau_c is 1" in text and "It is active here" in text
  assert "FedCAda's and FAFED's clients keep state" in text


def test_study_6_is_in_the_cells_and_incomplete_and_never_shrinks_silently():
  doc = _committed()
  doc["results"].pop("async", None)
  assert "6. Asynchronous training (FedBuff): not run" in report.incomplete(doc)
  assert ("6. Asynchronous training (FedBuff)", "study", 0, 1) in report.cells(doc)
  full = copy.deepcopy(doc)
  finals = {o: [0.7, 0.72] for o in plan.ASYNC_METHODS}
  full["results"]["async"] = {plan.async_label(s): _async_panel(s, finals)
                              for s in plan.ASYNC_SPREADS}
  assert not [s for s in report.incomplete(full) if "Asynchronous" in s]
  label = "Asynchronous (FedBuff) lognormal(1.5): FedAdamom"
  assert (label, "seeds", 2, 2) in report.cells(full)
  assert (label, "trials", 2, 2) in report.cells(full)
  short = copy.deepcopy(full)
  short["results"]["async"]["sigma1.5"]["table"]["fedadamom"]["seeds"] = 1
  assert "Asynchronous (FedBuff) lognormal(1.5): FedAdamom: 1 of 2 seeds" in \
      report.incomplete(short)
  assert f"{label}: seeds: 2 -> 1" in report.shrinkage(full, short)
  assert "6. Asynchronous training (FedBuff): 1 -> 0" in report.shrinkage(full, doc)
  text = report.render(full)
  assert "## 6. Asynchronous training (FedBuff)\n" in text and "### lognormal(0.5)" in text
  assert "plots/async_curves.png" in text
  assert "- Asynchronous (FedBuff) lognormal(0.5): " in text  # the summary's line


def test_the_plan_gives_study_6_study_1s_budget_and_search_space():
  b = plan.FULL
  base = plan.async_base(b, 1.5)
  assert base["asynchronous"]["durations"] == {"kind": "lognormal", "sigma": 1.5,
                                               "jitter": 0.2}
  assert base["asynchronous"]["buffer_size"] == base["clients_per_round"] == 5
  assert base["asynchronous"]["concurrency"] == 10
  assert base["asynchronous"]["staleness"] == {"kind": "polynomial", "a": 0.5}
  assert base["asynchronous"]["max_staleness"] == 10
  sync = plan.fmnist_base(b, plan.PARTITIONS["dir0.3"])
  assert {k: v for k, v in base.items() if k != "asynchronous"} == sync
  assert b.async_spreads == (0.5, 1.5)
  assert b.async_methods == ("fedavg", "fedavgm", "fedadam", "fadas", "fedadamom")
  assert plan.QUICK.async_spreads == (1.5,) and plan.QUICK.async_methods == ("fedavg", "fadas")
  assert math.isclose(plan.FAILED_MARGIN, 0.01)
