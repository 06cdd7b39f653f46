"""Synthetic(alpha, beta) of the FedProx paper: 60 features, 10 classes, one device each.

Source: Li et al., "Federated Optimization in Heterogeneous Networks" (MLSys 2020),
generation recipe of https://github.com/litian96/FedProx (data/synthetic_*/
generate_synthetic.py), itself after Shamir et al. (2014). Generated here: no files.

Device k has a local model ``W_k ~ N(u_k, 1)`` (60x10), ``b_k ~ N(u_k, 1)`` with
``u_k ~ N(0, alpha)`` (alpha controls how much the local *models* differ) and inputs
``x ~ N(v_k, Sigma)``, ``v_k ~ N(B_k, 1)``, ``B_k ~ N(0, beta)`` (beta controls how much
the local *data* differ), ``Sigma`` diagonal with ``Sigma_jj = j^-1.2``; labels are
``argmax softmax(W_k x + b_k)``. As in the reference code, alpha and beta are used as the
normal's scale. Sample counts are lognormal(4, 2) + 50 per device. ``iid=True`` gives
Synthetic-IID (one global W, b; v_k = 0), as in the paper. Every device's last
``test_fraction`` of samples is pooled into the centralized test set.
"""

from __future__ import annotations

import collections
from typing import Optional

import numpy as np

from tff_fedadamom.data.base import FederatedData
from tff_fedadamom.data.client_data import ArrayClientData, client_id_strings, held_out_dataset
from tff_fedadamom.data.summary import summary_from_client_labels

NUM_FEATURES = 60
NUM_CLASSES = 10
DEFAULT_NUM_CLIENTS = 30


def generate(num_clients: int, alpha: float, beta: float, iid: bool,
             seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
  """Returns ``[(x_k float32 (n_k, 60), y_k int32 (n_k,))]`` for every device."""
  rng = np.random.default_rng(seed)
  sizes = rng.lognormal(4, 2, num_clients).astype(np.int64) + 50
  u = rng.normal(0.0, alpha, num_clients)
  big_b = rng.normal(0.0, beta, num_clients)
  std = np.arange(1, NUM_FEATURES + 1, dtype=np.float64) ** (-1.2 / 2)
  w_global = rng.normal(0.0, 1.0, (NUM_FEATURES, NUM_CLASSES))
  b_global = rng.normal(0.0, 1.0, NUM_CLASSES)
  devices = []
  for k in range(num_clients):
    v = np.zeros(NUM_FEATURES) if iid else rng.normal(big_b[k], 1.0, NUM_FEATURES)
    if iid:
      w, b = w_global, b_global
    else:
      w = rng.normal(u[k], 1.0, (NUM_FEATURES, NUM_CLASSES))
      b = rng.normal(u[k], 1.0, NUM_CLASSES)
    x = v + std * rng.standard_normal((sizes[k], NUM_FEATURES))
    y = np.argmax(x @ w + b, axis=1)  # softmax is monotone: argmax of the logits
    devices.append((x.astype(np.float32), y.astype(np.int32)))
  return devices


def load(*, path: Optional[str] = None, seed: int = 0, num_clients: Optional[int] = None,
         alpha: float = 1.0, beta: float = 1.0, iid: bool = False,
         test_fraction: float = 0.1) -> FederatedData:
  """Generates the devices (``num_clients``, default 30) and their pooled test set."""
  del path
  num_clients = DEFAULT_NUM_CLIENTS if num_clients is None else int(num_clients)
  if num_clients < 1:
    raise ValueError(f"synthetic: num_clients must be >= 1, got {num_clients}.")
  if alpha < 0 or beta < 0:
    raise ValueError(f"synthetic: alpha and beta must be >= 0, got {alpha}, {beta}.")
  if not 0.0 <= float(test_fraction) < 1.0:
    raise ValueError(f"synthetic: test_fraction must lie in [0, 1), got {test_fraction}.")
  devices = generate(num_clients, float(alpha), float(beta), bool(iid), int(seed))
  clients, test_x, test_y = {}, [], []
  for cid, (x, y) in zip(client_id_strings(num_clients), devices):
    n_train = max(1, int(len(y) * (1.0 - float(test_fraction))))
    clients[cid] = collections.OrderedDict(x=x[:n_train], y=y[:n_train])
    test_x.append(x[n_train:])
    test_y.append(y[n_train:])
  test = held_out_dataset(collections.OrderedDict(
      x=np.concatenate(test_x), y=np.concatenate(test_y)))
  train = ArrayClientData(clients)
  return FederatedData(
      name="synthetic", train=train, test=test, input_shape=(NUM_FEATURES,),
      num_classes=NUM_CLASSES,
      partition_summary=summary_from_client_labels(
          [clients[c]["y"] for c in train.client_ids], NUM_CLASSES))
