"""Study 4's analysis: log(tau) = -log(escape rate) (`escape.rate_estimate`) against the
sharpness k. Pearson r with 1/k and with 1/sqrt(k) (the paper's two forms); the exponent p of
log(tau) = a + c k^-p; that of log(tau) = a + b log(k) + c k^-p, whose log term takes the
Kramers prefactor (the attempt frequency, a power of k) that the two-term form folds into p;
90% bootstrap intervals of both exponents, particles resampled within each k.
"""

from __future__ import annotations

import math
from typing import Mapping, Optional

import numpy as np

from benchmarks.paper.escape import rate_estimate


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
  """The module docstring's fits per optimizer, over the k with `min_escapes` escapes."""
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
