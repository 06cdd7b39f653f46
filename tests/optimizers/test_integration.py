"""FedAdamom inside `tff.learning.algorithms.build_weighted_fed_avg` on tiny data."""

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tests.optimizers import tiny_task
from tff_fedadamom import build_fedadamom


_W = [1.0, -2.0, 0.5, 1.5]  # The labelling direction.
_model_fn = tiny_task.model_fn(_W)


def _client_data(seed):
  return tiny_task.client_data(seed, _W, n=24, batch=8)


def test_fed_avg_with_fedadamom_reduces_loss():
  process = tff.learning.algorithms.build_weighted_fed_avg(
      _model_fn,
      client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.5),
      server_optimizer_fn=build_fedadamom(1.0, beta_2=0.1),
      client_weighting=tff.learning.ClientWeighting.UNIFORM,
  )
  clients = [_client_data(s) for s in range(3)]
  state = process.initialize()
  losses = []
  for _ in range(5):
    output = process.next(state, clients)
    state = output.state
    losses.append(float(output.metrics['client_work']['train']['loss']))
  assert all(np.isfinite(losses))
  assert losses[-1] < 0.7 * losses[0], losses
  # The server optimizer state lives in the process state, as FedAdamom's slots.
  server_state = state.finalizer
  assert 'preconditioner' in server_state and 'accumulator' in server_state
  assert float(np.max(tf.nest.flatten(server_state['preconditioner'])[0])) > 0
