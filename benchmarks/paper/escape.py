"""Study 4: escape from minima of controlled sharpness (the paper's diffusion claim).

The paper says that log(mean escape time) from a minimum of sharpness k scales like 1/k
for FedAvgM and FedAdamom but like 1/sqrt(k) for FedAdam. The registry's server optimizers,
stepped by their `next`, run on noisy pseudo-gradients of a Styblinski-Tang landscape.

st(u) = (u^4 - 16 u^2 + 5 u) / 2 has a local minimum at u_a ~ 2.7468 (st'' =
h0 ~ 29.27), a barrier top at u_b ~ 0.1567 and the global minimum at u ~
-2.9035, barrier dL = st(u_b) - st(u_a) ~ 25.23. f_k(x) = sum_i st(sqrt(k) x_i)
has Hessian k h0 I at the local minimum and the same barrier for every k: the
setting of the diffusion theory (Xie et al., ICLR 2021), log(tau) ~ dL / (eta C
/ 2) with a noise covariance C proportional to the Hessian, as minibatch noise
is near a minimum: g = grad f_k(x) + sqrt(s k h0) z, z ~ N(0, I). Particles
start at the local minimum with zero optimizer state and escape once a
coordinate passes u = -1; times are censored at `max_rounds`, and tau = 1 /
rate, the exponential MLE (escapes / rounds observed).

Step sizes are matched once, at the minimum of k_ref (the geometric middle of the ks):
FedAdam's and FedAdamom's mean |step| per coordinate there equals FedAvgM's. They then stay
fixed across k, so what differs is the shape of log(tau) against k (matching at every k would
turn FedAdam into SGD).

The analysis (`analyse`) fits log(tau) = -log(rate) against k: Pearson r with 1/k and with
1/sqrt(k) (the paper's two forms); the exponent p of log(tau) = a + c k^-p; that of log(tau)
= a + b log(k) + c k^-p, whose log term takes the Kramers prefactor (the attempt frequency, a
power of k) that the two-term form folds into p; 90% bootstrap intervals of both exponents,
particles resampled within each k.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Mapping, Optional, Sequence

import numpy as np

OPTIMIZERS = ("fedavgm", "fedadam", "fedadamom")
# Part of the escape unit's key beside the optimizers' fingerprints: bump it when
# a change here changes the study's numbers.
VERSION = 1


# The three real roots of st'(u) = (4u^3 - 32u + 5) / 2.
U_GLOBAL, U_BARRIER, U_LOCAL = map(float, np.sort(np.roots([4.0, 0.0, -32.0, 5.0]).real))
U_ESCAPED = -1.0


def st(u):
  return 0.5 * (u ** 4 - 16.0 * u ** 2 + 5.0 * u)


def st_grad(u):
  return 0.5 * (4.0 * u ** 3 - 32.0 * u + 5.0)


H0 = 6.0 * U_LOCAL ** 2 - 16.0
BARRIER = float(st(U_BARRIER) - st(U_LOCAL))


@dataclasses.dataclass(frozen=True)
class EscapeSetup:
  ks: tuple = (1.0, 1.5, 2.25, 3.4, 5.1, 7.6, 11.4, 17.1)  # sharpness: a decade or more
  dim: int = 10  # coordinates per particle (FedAdamom's vbar is their mean)
  particles: int = 256  # independent particles per (optimizer, k)
  max_rounds: int = 40000  # a particle that has not escaped by then is censored
  # The SGD-theory exponent dL / T at the flattest k, which sets the noise scale s.
  flat_log_tau: float = 11.0
  sgd_stiffness: float = 0.4  # eta_eff * k_max * h0 for FedAvgM (its stability margin)
  momentum: float = 0.9  # FedAvgM's
  adam: tuple = (0.9, 0.99, 1e-3)  # FedAdam's (beta_1, beta_2, epsilon)
  adamom: tuple = (0.1, 1e-3)  # FedAdamom's (beta_2, epsilon)
  seed: int = 0  # of all noise (stateless, per round)
  chunk: int = 2000  # rounds per compiled chunk (early stop once every particle escaped)

  @property
  def k_ref(self) -> float:
    return float(math.sqrt(min(self.ks) * max(self.ks)))

  @property
  def sgd_lr(self) -> float:
    """FedAvgM's eta: eta / (1 - momentum) * k_max * h0 = sgd_stiffness."""
    return self.sgd_stiffness * (1.0 - self.momentum) / (max(self.ks) * H0)

  @property
  def noise_scale(self) -> float:
    """s such that 2 dL / (eta_eff * s * k_min * h0) = flat_log_tau (SGD theory)."""
    eta_eff = self.sgd_lr / (1.0 - self.momentum)
    return 2.0 * BARRIER / (self.flat_log_tau * eta_eff * min(self.ks) * H0)


def build_optimizer(name: str, lr: float, setup: EscapeSetup):
  from tff_fedadamom.methods import build_server_optimizer

  hparams = {"fedavgm": {"momentum": setup.momentum},
             "fedadam": dict(zip(("beta_1", "beta_2", "epsilon"), setup.adam)),
             "fedadamom": dict(zip(("beta_2", "epsilon"), setup.adamom))}
  return build_server_optimizer(name, learning_rate=lr, **hparams[name])


class BatchedOptimizer:
  """`optimizer.next` mapped (`tf.vectorized_map`) over a batch of models of `dim`
  parameters, their states stacked: reductions inside `next` stay per model."""

  def __init__(self, optimizer, dim: int):
    import tensorflow as tf

    self.optimizer = optimizer
    self._spec = tf.TensorSpec([dim], tf.float32)

  def initialize(self, batch: int):
    import tensorflow as tf

    def tile(value):
      t = tf.convert_to_tensor(value)
      return tf.tile(t[None], [batch] + [1] * t.shape.rank)

    return tf.nest.map_structure(tile, self.optimizer.initialize(self._spec))

  def next(self, state, weights, gradients):
    import tensorflow as tf

    new_state, new_weights = tf.vectorized_map(lambda args: self.optimizer.next(*args),
                                               (state, weights, gradients),
                                               fallback_to_while_loop=False)
    # vectorized_map returns tensors: keep the initial state's dtypes.
    return tf.nest.map_structure(lambda old, new: tf.cast(new, old.dtype),
                                 state, new_state), new_weights


def _simulate_fn(batched: BatchedOptimizer, sqrt_k, noise_std, quadratic: bool):
  """A compiled chunk of rounds. Returns (state, x, escaped_at, sum |dx|, count)."""
  import tensorflow as tf

  shape = tf.shape(sqrt_k)

  # No autograph: converting the optimizers' code was most of the first trace.
  @tf.function(autograph=False)
  def run(state, x, escaped_at, start, rounds, seed, measure_from):
    def body(i, state, x, escaped_at, step_sum, step_count):
      t = start + i
      u = sqrt_k * x
      if quadratic:
        grad = sqrt_k * H0 * (u - U_LOCAL)  # d/dx of k*h0/2 * (x - x*)^2
      else:
        grad = sqrt_k * st_grad(u)
      z = tf.random.stateless_normal(shape, seed=tf.stack([seed, t]))
      state, new_x = batched.next(state, x, grad + noise_std * z)
      step_sum, step_count = tf.cond(
          t >= measure_from,
          lambda: (step_sum + tf.reduce_sum(tf.abs(new_x - x)),
                   step_count + tf.cast(tf.size(x), tf.float32)),
          lambda: (step_sum, step_count))
      out = tf.reduce_any(sqrt_k * new_x < U_ESCAPED, axis=-1)
      escaped_at = tf.where(out & (escaped_at < 0), t + 1, escaped_at)
      return i + 1, state, new_x, escaped_at, step_sum, step_count

    zero = tf.zeros([], tf.float32)
    _, state, x, escaped_at, step_sum, step_count = tf.while_loop(
        lambda i, *_: i < rounds, body, (tf.constant(0, tf.int32), state, x, escaped_at,
                                         zero, zero))
    return state, x, escaped_at, step_sum, step_count

  return run


def _batch_arrays(setup: EscapeSetup, ks: Sequence[float], particles: int):
  """sqrt(k), the noise's std and the start x of every (k, particle, coordinate)."""
  import tensorflow as tf

  k_of = np.repeat(np.asarray(ks, np.float32), particles)
  ones = np.ones((1, setup.dim), np.float32)
  sqrt_k = np.sqrt(k_of)[:, None] * ones
  noise_std = np.sqrt(setup.noise_scale * k_of * H0)[:, None] * ones
  x0 = (U_LOCAL / sqrt_k).astype(np.float32)
  return tuple(tf.constant(a, tf.float32) for a in (sqrt_k, noise_std, x0))


def mean_step_at_minimum(name: str, lr: float, setup: EscapeSetup, *, particles: int = 256,
                         burn_in: int = 400, rounds: int = 400, seed: int = 1,
                         compiled: Optional[dict] = None) -> float:
  """Mean |step| per coordinate in the harmonic well of the minimum at k_ref. `compiled`:
  the compiled rounds by optimizer (the rate is in the state: one trace serves every rate)."""
  import tensorflow as tf

  i32 = lambda value: tf.constant(value, tf.int32)
  batched = BatchedOptimizer(build_optimizer(name, lr, setup), setup.dim)
  sqrt_k, noise_std, x0 = _batch_arrays(setup, [setup.k_ref], particles)
  compiled = {} if compiled is None else compiled
  if name not in compiled:
    compiled[name] = _simulate_fn(batched, sqrt_k, noise_std, quadratic=True)
  _, _, _, total, count = compiled[name](
      batched.initialize(particles), x0, tf.fill([particles], i32(-1)), i32(0),
      i32(burn_in + rounds), i32(seed), i32(burn_in))
  return float(total) / float(count)


def match_learning_rates(setup: EscapeSetup, *, iterations: int = 3,
                         particles: int = 256) -> dict:
  """Learning rates whose mean |step| at the k_ref minimum equals FedAvgM's, by
  multiplicative corrections (the step is close to proportional to the rate)."""
  compiled: dict = {}
  target = mean_step_at_minimum("fedavgm", setup.sgd_lr, setup, particles=particles)
  out = {"fedavgm": {"lr": setup.sgd_lr, "mean_step": target}}
  guesses = {
      # Adam's step at the minimum is ~ lr (|m/sqrt(v)| ~ 1): start at the target.
      "fedadam": target,
      # FedAdamom's step is ~ lr * |m| with m ~ the noisy gradient.
      "fedadamom": target / float(np.sqrt(setup.noise_scale * setup.k_ref * H0)),
  }
  for name, lr in guesses.items():
    step = mean_step_at_minimum(name, lr, setup, particles=particles, compiled=compiled)
    for _ in range(iterations):
      lr *= target / step
      step = mean_step_at_minimum(name, lr, setup, particles=particles, compiled=compiled)
    out[name] = {"lr": lr, "mean_step": step}
  return {"target_mean_step": target, "optimizers": out}


def escape_times(name: str, lr: float, setup: EscapeSetup) -> dict:
  """Escape rounds of every particle, per k (-1: not escaped by max_rounds)."""
  import tensorflow as tf

  i32 = lambda value: tf.constant(value, tf.int32)
  ks, n = list(setup.ks), len(setup.ks) * setup.particles
  batched = BatchedOptimizer(build_optimizer(name, lr, setup), setup.dim)
  sqrt_k, noise_std, x = _batch_arrays(setup, ks, setup.particles)
  run = _simulate_fn(batched, sqrt_k, noise_std, quadratic=False)
  state, escaped, done = batched.initialize(n), tf.fill([n], i32(-1)), 0
  while done < setup.max_rounds:
    rounds = min(setup.chunk, setup.max_rounds - done)
    state, x, escaped, _, _ = run(state, x, escaped, i32(done), i32(rounds), i32(setup.seed),
                                  i32(setup.max_rounds + 1))  # no step is measured
    done += rounds
    if not bool(tf.reduce_any(escaped < 0)):
      break
  times = escaped.numpy().reshape(len(ks), setup.particles)
  return {"ks": ks, "times": times.tolist(), "rounds_simulated": done}


def rate_estimate(times: Sequence[int], max_rounds: int) -> dict:
  """Exponential MLE of the escape rate from censored first-passage times."""
  t = np.asarray(times, dtype=np.float64)
  escaped = t >= 0
  exposure = float(np.where(escaped, t, max_rounds).sum())
  n = int(escaped.sum())
  rate = n / exposure if exposure > 0 and n > 0 else None
  return {"escaped": n, "particles": int(t.size), "rate": rate,
          "tau": (1.0 / rate) if rate else None,
          "median_escape": float(np.median(t[escaped])) if n else None}


def run_study_dict(setup: Mapping) -> dict:
  """The escape unit's call; `setup`: an `EscapeSetup` as a plain mapping."""
  fields = {f.name for f in dataclasses.fields(EscapeSetup)}
  setup = EscapeSetup(**{k: tuple(v) if isinstance(v, list) else v for k, v in setup.items()
                         if k in fields})
  started = time.perf_counter()
  matched = match_learning_rates(setup)
  results = {}
  for name in OPTIMIZERS:
    t0 = time.perf_counter()
    lr = matched["optimizers"][name]["lr"]
    raw = escape_times(name, lr, setup)
    results[name] = {"lr": lr, "per_k": [rate_estimate(t, setup.max_rounds)
                                         for t in raw["times"]],
                     "times": raw["times"], "rounds_simulated": raw["rounds_simulated"],
                     "seconds": time.perf_counter() - t0}
  return {"setup": dataclasses.asdict(setup), "k_ref": setup.k_ref,
          "sgd_lr": setup.sgd_lr, "noise_scale": setup.noise_scale,
          "barrier": BARRIER, "h0": H0, "u_local": U_LOCAL, "u_barrier": U_BARRIER,
          "u_escaped": U_ESCAPED, "matched": matched, "optimizers": results,
          "seconds": time.perf_counter() - started}


def pearson(x, y) -> Optional[float]:
  x, y = np.asarray(x, float), np.asarray(y, float)
  if x.size < 3 or np.std(x) == 0 or np.std(y) == 0:
    return None
  return float(np.corrcoef(x, y)[0, 1])


def fit_exponent(ks, log_tau, p_grid=None, prefactor: bool = False) -> Optional[dict]:
  """Least-squares fit of log(tau) = a + c * k^-p, with `prefactor` a + b * log(k)
  + c * k^-p, over a grid of p (the other coefficients linear)."""
  ks, y = np.asarray(ks, float), np.asarray(log_tau, float)
  if ks.size < (5 if prefactor else 4):
    return None
  best = None
  for p in np.linspace(0.05, 3.0, 591) if p_grid is None else p_grid:
    design = np.stack([np.ones_like(ks)] + ([np.log(ks)] if prefactor else []) + [ks ** -p],
                      axis=1)
    coef, *_ = np.linalg.lstsq(design, y, rcond=None)
    sse = float(np.sum((design @ coef - y) ** 2))
    if best is None or sse < best[0]:
      best = (sse, float(p), [float(c) for c in coef])
  sse, p, coef = best
  if prefactor:
    return dict(zip(("p", "a", "b", "c"), [p, *coef]))
  total = float(np.sum((y - y.mean()) ** 2))
  return {"p": p, "a": coef[0], "c": coef[1], "r2": 1.0 - sse / total if total > 0 else None}


def analyse(raw: Mapping, *, min_escapes: int = 10, bootstrap: int = 200,
            seed: int = 0) -> dict:
  """The fits of the module docstring per optimizer, over the k with `min_escapes` escapes."""
  setup = raw["setup"]
  ks = np.asarray(setup["ks"], float)
  max_rounds = setup["max_rounds"]
  rng = np.random.default_rng(seed)
  out = {}
  for name, res in raw["optimizers"].items():
    per_k = res["per_k"]
    keep = [i for i, r in enumerate(per_k) if r["escaped"] >= min_escapes]
    k_used = ks[keep]
    log_tau = np.array([math.log(per_k[i]["tau"]) for i in keep])
    entry = {"k_used": k_used.tolist(), "log_tau": log_tau.tolist(),
             "r_inv_k": pearson(1.0 / k_used, log_tau),
             "r_inv_sqrt_k": pearson(1.0 / np.sqrt(k_used), log_tau),
             "fit": fit_exponent(k_used, log_tau), "p_interval": None,
             "fit_prefactor": fit_exponent(k_used, log_tau, prefactor=True),
             "p_prefactor_interval": None,
             "k_span": float(k_used.max() / k_used.min()) if keep else None}
    if entry["fit"] is not None and bootstrap:
      times = [np.asarray(res["times"][i]) for i in keep]
      ps = {"p_interval": [], "p_prefactor_interval": []}
      coarse = np.linspace(0.05, 3.0, 119)
      for _ in range(bootstrap):
        rates = [rate_estimate(rng.choice(t, size=t.size, replace=True), max_rounds)["rate"]
                 for t in times]
        if all(rates):  # every k still has an escape
          sample = [math.log(1.0 / rate) for rate in rates]
          for key, prefactor in (("p_interval", False), ("p_prefactor_interval", True)):
            found = fit_exponent(k_used, sample, p_grid=coarse, prefactor=prefactor)
            if found is not None:
              ps[key].append(found["p"])
      entry.update({key: [float(np.percentile(values, 5)), float(np.percentile(values, 95))]
                    for key, values in ps.items() if values})
    out[name] = entry
  return out
