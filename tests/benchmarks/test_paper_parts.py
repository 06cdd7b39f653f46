"""Pieces of benchmarks/paper that the end-to-end test cannot check precisely."""

import math

import numpy as np
import pytest

from benchmarks.paper import escape, runs, studies, tune


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
  fit3 = escape.fit_exponent_with_prefactor(ks, y3)
  assert fit3["p"] == pytest.approx(p, abs=0.02)
  assert fit3["b"] == pytest.approx(-0.7, abs=0.05)
  r1 = escape.pearson(1 / ks, y)
  r2 = escape.pearson(1 / np.sqrt(ks), y)
  assert (r1 > r2) == (p == 1.0)


def test_seed_summary_and_curve():
  records = [
      {"seed": 1, "status": "completed", "final_test_accuracy": 0.5, "best_test_accuracy": 0.6,
       "rounds_to_target": {"0.5": 10}, "history": [{"round": 5, "test/accuracy": 0.4},
                                                     {"round": 10, "test/accuracy": 0.5}]},
      {"seed": 2, "status": "completed", "final_test_accuracy": 0.7, "best_test_accuracy": 0.7,
       "rounds_to_target": {"0.5": None}, "history": [{"round": 5, "test/accuracy": 0.6},
                                                       {"round": 10, "test/accuracy": 0.7}]},
  ]
  s = studies.seed_summary(records, 0.5)
  assert s["final"]["mean"] == pytest.approx(0.6)
  assert s["final"]["std"] == pytest.approx(math.sqrt(0.02))
  assert s["reached"] == 1 and s["rounds_to_target"]["mean"] == 10
  curve = studies.mean_curve(records)
  assert curve["round"] == [5, 10]
  assert curve["mean"] == pytest.approx([0.5, 0.6])


def test_draws_are_common_across_optimizers():
  """A dimension two optimizers share gets the same value in the same trial."""
  from tuning import load_sweep
  from tuning import space as space_lib

  from benchmarks.paper import plan

  raw = tune.sweep_dict("t", plan.fmnist_base(plan.QUICK, plan.PARTITIONS["iid"]),
                        plan.OPTIMIZERS, 2, 2, plan.search_space((0.01, 0.5)), 7, 1, "/tmp")
  sweep = load_sweep(raw)
  draws = {o: [tune.draw_params(space_lib.resolve(sweep, o), 7, t) for t in range(2)]
           for o in plan.OPTIMIZERS}
  for t in range(2):
    lrs = {draws[o][t]["client.learning_rate"] for o in plan.OPTIMIZERS}
    assert len(lrs) == 1
    assert draws["fedadam"][t]["server.epsilon"] == draws["fedyogi"][t]["server.epsilon"]
  assert draws["fedadam"][0] != draws["fedadam"][1]
  assert "server.epsilon" not in draws["fedadamom"][0]  # fixed at the clip margin


def test_cache_round_trip(tmp_path):
  cache = runs.Cache(str(tmp_path))
  assert cache.get("a/b", "h1") is None
  cache.put("a/b", "h1", {"x": 1})
  assert cache.get("a/b", "h1") == {"x": 1}
  assert cache.get("a/b", "h2") is None  # another config: run again
  assert runs.config_hash({"a": 1, "output_dir": "x"}) == runs.config_hash(
      {"a": 1, "output_dir": "y"})
