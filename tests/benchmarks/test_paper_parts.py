"""Pieces of benchmarks/paper that the end-to-end test cannot check precisely."""

import copy
import json
import math
import os
import types

import numpy as np
import pytest

from tff_fedadamom.metric_names import TEST_ACCURACY

from benchmarks.paper import escape, plan, report, reproduce, studies

PAPER_DIR = os.path.dirname(os.path.abspath(reproduce.__file__))


def test_landscape_constants():
  assert escape.st_grad(escape.U_LOCAL) == pytest.approx(0.0, abs=1e-9)
  assert escape.st_grad(escape.U_BARRIER) == pytest.approx(0.0, abs=1e-9)
  assert escape.U_GLOBAL < escape.U_ESCAPED < escape.U_BARRIER < escape.U_LOCAL
  assert escape.BARRIER == pytest.approx(25.225, abs=1e-3)
  assert escape.H0 == pytest.approx(29.27, abs=1e-2)


@pytest.mark.parametrize("name", escape.OPTIMIZERS)
def test_batched_next_equals_one_model_at_a_time(name):
  """vectorized_map keeps every particle a separate model (FedAdamom's vbar included)."""
  import tensorflow as tf

  setup = escape.EscapeSetup(dim=4)
  optimizer = escape.build_optimizer(name, 0.05, setup)
  batched = escape.BatchedOptimizer(optimizer, setup.dim)
  rng = np.random.default_rng(0)
  n = 5
  x = tf.constant(rng.normal(size=(n, setup.dim)), tf.float32)
  state = batched.initialize(n)
  singles = [optimizer.initialize(tf.TensorSpec([setup.dim], tf.float32)) for _ in range(n)]
  xs = [x[i] for i in range(n)]
  for _ in range(3):
    # Gradients of very different scale per particle: a shared vbar would show.
    g = tf.constant(rng.normal(size=(n, setup.dim)) * np.array([[1e-3], [1], [10], [1], [1e2]]),
                    tf.float32)
    state, x = batched.next(state, x, g)
    for i in range(n):
      singles[i], xs[i] = optimizer.next(singles[i], xs[i], g[i])
  np.testing.assert_allclose(x.numpy(), np.stack([v.numpy() for v in xs]), rtol=2e-5,
                             atol=1e-6)


def test_matching_traces_each_optimizers_rounds_once_for_every_learning_rate():
  """The learning rate is in the optimizer's state: one trace of the rounds
  serves every rate, with each rate's own steps (those of rounds traced for it)."""
  setup = plan.QUICK.escape
  kwargs = dict(particles=8, burn_in=5, rounds=5)
  compiled = {}
  low = escape.mean_step_at_minimum("fedadamom", 0.01, setup, compiled=compiled, **kwargs)
  high = escape.mean_step_at_minimum("fedadamom", 0.04, setup, compiled=compiled, **kwargs)
  assert list(compiled) == ["fedadamom"]
  assert compiled["fedadamom"].experimental_get_tracing_count() == 1
  assert high != low
  assert high == escape.mean_step_at_minimum("fedadamom", 0.04, setup, **kwargs)


def test_rate_estimate_censoring():
  out = escape.rate_estimate([10, 30, -1, -1], max_rounds=100)
  assert out["escaped"] == 2
  assert out["rate"] == pytest.approx(2 / (10 + 30 + 100 + 100))
  assert escape.rate_estimate([-1, -1], max_rounds=10)["tau"] is None


@pytest.mark.parametrize("p", [0.5, 1.0])
def test_fits_recover_the_exponent(p):
  ks = np.geomspace(1, 16, 9)
  y = 1.5 + 6.0 * ks ** -p
  fit = escape.fit_exponent(ks, y)
  assert fit["p"] == pytest.approx(p, abs=0.01)
  y3 = y - 0.7 * np.log(ks)
  fit3 = escape.fit_exponent(ks, y3, prefactor=True)
  assert fit3["p"] == pytest.approx(p, abs=0.02)
  assert fit3["b"] == pytest.approx(-0.7, abs=0.05)
  r1 = escape.pearson(1 / ks, y)
  r2 = escape.pearson(1 / np.sqrt(ks), y)
  assert (r1 > r2) == (p == 1.0)


def test_seed_summary_and_curve():
  records = [
      {"seed": 1, "status": "completed", "final_test_accuracy": 0.5, "best_test_accuracy": 0.6,
       "rounds_to_target": {"0.5": 10}, "history": [{"round": 5, TEST_ACCURACY: 0.4},
                                                     {"round": 10, TEST_ACCURACY: 0.5}]},
      {"seed": 2, "status": "completed", "final_test_accuracy": 0.7, "best_test_accuracy": 0.7,
       "rounds_to_target": {"0.5": None}, "history": [{"round": 5, TEST_ACCURACY: 0.6},
                                                       {"round": 10, TEST_ACCURACY: 0.7}]},
  ]
  s = studies.seed_summary(records, 0.5)
  assert s["final"]["mean"] == pytest.approx(0.6)
  assert s["final"]["std"] == pytest.approx(math.sqrt(0.02))
  assert s["reached"] == 1 and s["rounds_to_target"]["mean"] == 10
  curve = studies.mean_curve(records)
  assert curve["round"] == [5, 10]
  assert curve["mean"] == pytest.approx([0.5, 0.6])
  # The bands use the tables' convention, the sample std: |0.4 - 0.6| / sqrt(2).
  assert curve["std"] == pytest.approx([0.2 / math.sqrt(2)] * 2)
  assert curve["n"] == [2, 2]
  assert studies.mean_curve(records[:1])["std"] == [None, None]


def _quick_sweep(methods=plan.OPTIMIZERS, trials=2):
  base = plan.fmnist_base(plan.QUICK, plan.PARTITIONS["iid"])
  return plan.plan_sweep("t", {"base": base, "optimizers": methods, "trials": trials,
                               "rounds": 1, "space": plan.search_space((0.01, 0.5), methods)},
                        seed=7)


def test_draws_are_common_across_optimizers():
  """A dimension two optimizers share gets the same value in the same trial."""
  draws = {o: [p for p, _ in m["trials"]] for o, m in _quick_sweep()["methods"].items()}
  for t in range(2):
    # Same draw within each client-lr range: the SGD clients' and the normalized ones'.
    sgd = {draws[o][t]["client.learning_rate"] for o in plan.OPTIMIZERS
           if o not in plan.ADAPTIVE_CLIENTS}
    adaptive = {draws[o][t]["client.learning_rate"] for o in plan.ADAPTIVE_CLIENTS}
    assert len(sgd) == 1 and len(adaptive) == 1
    low, high = plan.ADAPTIVE_CLIENT_LR
    assert low <= adaptive.pop() <= high
    assert draws["fedadam"][t]["server.epsilon"] == draws["fedyogi"][t]["server.epsilon"]
  assert draws["fedadam"][0] != draws["fedadam"][1]
  assert "server.epsilon" not in draws["fedadamom"][0]  # fixed at the clip margin


def test_each_method_records_the_ranges_its_trials_draw_from():
  """The report marks tuned values at a range's edge from these ranges."""
  methods = _quick_sweep()["methods"]
  for opt, planned in methods.items():
    for params, _ in planned["trials"]:
      assert set(params) == set(planned["ranges"]), opt
      for path, value in params.items():
        assert planned["ranges"][path]["low"] <= value <= planned["ranges"][path]["high"]
  assert methods["fedavgm"]["ranges"]["server.momentum"] == {
      "dist": "uniform", "low": 0.5, "high": 0.95}
  assert "server.epsilon" not in methods["fedadamom"]["ranges"]


def test_study_runs_fedadam_and_fedyogi_uncorrected_like_the_authors():
  """The study's FedAdam/FedYogi trials build without bias correction; the others keep
  the registry's switch."""
  servers = {o: m["trials"][0][1].config["server"]
             for o, m in _quick_sweep(trials=1)["methods"].items()}
  assert set(servers) == set(plan.OPTIMIZERS)
  for opt, server in servers.items():
    if opt in plan.AUTHORS_UNCORRECTED:
      assert server["bias_correction"] is False, opt
    else:
      assert "bias_correction" not in server, opt
  assert set(plan.AUTHORS_UNCORRECTED) == {"fedadam", "fedyogi"}


def test_the_stored_trials_are_the_trials_this_code_plans():
  """Every committed tuning unit's config is one this code's random search
  draws, trial by trial, to `units.SPEC_DIGITS` (so a stored study continues
  with the same trials on any CPU)."""
  from benchmarks.paper import units

  b = plan.FULL
  requests = {"shakespeare": (plan.shakespeare_base(b), b.shakespeare,
                              plan.SHAKESPEARE_CLIENT_LR, plan.OPTIMIZERS),
              **{f"fmnist-{p}": (plan.fmnist_base(b, plan.PARTITIONS[p]), b.fmnist,
                                 plan.FMNIST_CLIENT_LR, plan.OPTIMIZERS) for p in b.partitions},
              **{f"async-{plan.async_label(s)}": (plan.async_base(b, s), b.fmnist,
                                                 plan.FMNIST_CLIENT_LR, b.async_methods)
                 for s in b.async_spreads}}
  planned = {}
  for name, (base, db, lr, methods) in requests.items():
    sweep = plan.plan_sweep(name, {"base": base, "optimizers": methods,
                                   "trials": db.tune_trials, "rounds": db.tune_rounds,
                                   "space": plan.search_space(lr, methods)}, seed=b.tune_seed)
    planned.update({u.name: u.spec for m in sweep["methods"].values() for _, u in m["trials"]})
  stored = {r["name"]: units.record_spec(r) for r in
            units.Store(os.path.join(PAPER_DIR, "results")).records()
            if r["name"].startswith("tune/")}
  assert len(stored) == len(planned) == 150 + 60
  for unit_name, spec in stored.items():
    assert units.first_difference(units.canonical(spec), units.canonical(planned[unit_name]),
                                  "spec") is None, unit_name


def test_a_tuning_outcome_is_the_best_complete_trial():
  sweep = _quick_sweep(methods=("fedadam",), trials=3)
  names = [u.name for _, u in sweep["methods"]["fedadam"]["trials"]]
  # Tuning selects on the validation accuracy; the test accuracy ranks the other way.
  row = lambda acc: {"round": 1, plan.METRIC: acc, TEST_ACCURACY: 1 - acc}
  results = {names[0]: {"status": "completed", "history": [row(0.5)], "rounds_completed": 1},
             names[1]: {"status": "diverged", "history": [row(0.9)], "rounds_completed": 1},
             names[2]: {"status": "completed", "history": [row(0.7)], "rounds_completed": 1}}
  best = plan.outcome(sweep, results)["best"]["fedadam"]
  assert best["objective"] == 0.7 and best["trials_run"] == 3 and best["trials_diverged"] == 1
  assert best["config"] == sweep["methods"]["fedadam"]["trials"][2][1].config
  fallback = plan.outcome(sweep, {names[1]: results[names[1]]})["best"]["fedadam"]
  assert fallback["fallback_defaults"] and fallback["params"] is None
  assert fallback["config"]["server"] == {"optimizer": "fedadam",
                                          "client_weighting": "uniform",
                                          "schedule": {"kind": "constant"},
                                          "bias_correction": False}


def _committed():
  with open(os.path.join(PAPER_DIR, reproduce.RESULTS_FILE)) as f:
    doc = json.load(f)
  with open(os.path.join(PAPER_DIR, report.REPORT_FILE), encoding="utf-8") as f:
    text = f.read()
  return doc, text


def test_committed_report_is_rendered_from_committed_results():
  """REPORT.md is exactly what results.json renders to: hand edits are caught."""
  doc, text = _committed()
  assert report.render(doc) == text


def test_committed_report_names_every_method_and_its_communication():
  doc, text = _committed()
  assert [m["name"] for m in doc["methods"]] == list(plan.OPTIMIZERS)
  costs = {m["name"]: m["communication"] for m in doc["methods"]}
  assert costs["fedavg"] == 1.0 and costs["fedcada"] == 3.0 and costs["fafed"] == 3.0
  for table in ("### Dirichlet(0.3)", "### i.i.d.", "### Shakespeare"):
    section = text.split(table, 1)[1].split("\n\n", 2)[1]
    rows = {line.split(" | ")[0].lstrip("| "): line for line in section.splitlines()[2:]}
    assert len(rows) == len(plan.OPTIMIZERS)
    assert rows["FedCAda"].startswith("| FedCAda | 3x |")
    assert rows["FedAdamom"].startswith("| FedAdamom | 1x |")


def _unit(name, opt):
  return types.SimpleNamespace(name=name, config={"server": {"optimizer": opt}})


def test_a_missing_seed_is_marked_and_fails_the_command(tmp_path):
  """A unit that did not complete: its cells say how many seeds they average, the
  report lists it, and the report command exits non-zero."""
  doc, _ = _committed()
  budget = plan.DataBudget(rounds=2, eval_every=1, tune_trials=1, tune_rounds=1,
                           seeds=(1, 2), target=0.5, targets=(0.5,))
  summary = doc["results"]["shakespeare"]
  comparison = {"tuning": {"best": {o: {"config": {"client": {"learning_rate": 0.1},
                                                   "server": {"optimizer": o}},
                                        "objective": 0.5, "trials_run": 1}
                                    for o in plan.OPTIMIZERS},
                           "backend": "inprocess", "seed": 0, "metric": {}, "space": {}},
                "base": {"data": {}, "model": {}, "clients_per_round": 5, "client": {},
                         "eval_every": 1}}
  units = [_unit(f"s/{o}/seed{seed}", o) for o in plan.OPTIMIZERS for seed in (1, 2)]
  record = lambda acc: {"status": "completed", "final_test_accuracy": acc,
                        "best_test_accuracy": acc, "rounds_to_target": {"0.5": 1},
                        "history": [{"round": 1, TEST_ACCURACY: acc}], "seed": 1}
  results = {u.name: record(0.6 if u.name.endswith("1") else 0.8) for u in units}
  del results["s/fedadam/seed2"]  # this unit failed
  table = studies.summarize_comparison("s", comparison, budget, results, units)["table"]
  assert table["fedadam"]["seeds"] == 1 and table["fedadam"]["final"]["mean"] == 0.6
  assert table["fedavg"]["final"]["mean"] == pytest.approx(0.7)
  incomplete = copy.deepcopy(doc)
  summary = incomplete["results"]["shakespeare"]
  summary["table"] = table
  summary["setup"]["seeds"] = [1, 2]
  summary["setup"]["tune_trials"] = 1
  text = report.render(incomplete)
  shakespeare = text.split("### Shakespeare", 1)[1].split("\n\n", 2)[1]
  adam_row = next(line for line in shakespeare.splitlines() if line.startswith("| FedAdam |"))
  assert adam_row.count("(1 of 2 seeds)") == 3  # final, best, rounds to target
  assert "seeds)" not in next(line for line in shakespeare.splitlines()
                              if line.startswith("| FedAvg |"))
  assert "Shakespeare: FedAdam: 1 of 2 seeds" in report.incomplete(incomplete)
  assert "- Shakespeare: FedAdam: 1 of 2 seeds\n" in text
  # --report-only renders the same document and exits 1: it is incomplete.
  with open(tmp_path / reproduce.RESULTS_FILE, "w") as f:
    json.dump(incomplete, f)
  assert reproduce.main(["--report-only", "--out", str(tmp_path)]) == 1
  assert (tmp_path / report.REPORT_FILE).read_text(encoding="utf-8") == text
  for name in ("fmnist_curves.png", "escape.png"):
    assert (tmp_path / "plots" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_shrinkage_names_every_cell_that_holds_less():
  doc, _ = _committed()
  assert report.shrinkage(doc, doc) == []
  less = copy.deepcopy(doc)
  less["results"]["beta2"]["table"]["iid"]["0.05"]["seeds"] = 1
  del less["results"]["hetero"]
  lost = report.shrinkage(doc, less)
  assert "beta_2 i.i.d. beta_2=0.05: seeds: 2 -> 1" in lost
  assert "5. Heterogeneity: FedAdamom - FedAdam: 1 -> 0" in lost
  assert "heterogeneity 0.1 FedAdam: seeds: 3 -> 0" in lost
  assert report.shrinkage(less, doc) == []
