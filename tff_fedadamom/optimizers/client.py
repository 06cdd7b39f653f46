"""The client optimizer of the reference setup: SGD with momentum, coupled weight
decay and global gradient-norm clipping, as a `tff.learning.optimizers.Optimizer`.

The order follows PyTorch's `clip_grad_norm_` then `SGD(weight_decay=...)`, which the
reference code uses:

```
g = g * min(1, clip_norm / ||g||)       # global norm over all tensors
g = g + weight_decay * w
(TFF SGD with momentum on g)
```

The state is TFF SGD's own, so the learning rate stays at the top level under
`LEARNING_RATE_KEY` and schedules apply to it unchanged.
"""

from __future__ import annotations

from typing import Optional

import tensorflow as tf
import tensorflow_federated as tff


def clip_and_decay(weights, gradients, weight_decay: float = 0.0,
                   clip_norm: Optional[float] = None):
  """The module docstring's clipping (the norm over every tensor with a gradient),
  then coupled decay. Leaves `None` gradients alone."""
  gradients = tff.learning.optimizers.handle_indexed_slices_gradients(gradients)
  flat_g = tf.nest.flatten(gradients)
  flat_w = tf.nest.flatten(weights)
  active = [i for i, g in enumerate(flat_g) if g is not None]
  if clip_norm is not None and active:
    clipped, _ = tf.clip_by_global_norm([flat_g[i] for i in active], clip_norm)
    for i, g in zip(active, clipped):
      flat_g[i] = g
  if weight_decay:
    for i in active:
      flat_g[i] = flat_g[i] + tf.cast(weight_decay, flat_w[i].dtype) * flat_w[i]
  return tf.nest.pack_sequence_as(gradients, flat_g)


def check_clip_and_decay(owner: str, weight_decay, clip_norm) -> None:
  if weight_decay < 0:
    raise ValueError(f"{owner} `weight_decay` must be >= 0, found {weight_decay}.")
  if clip_norm is not None and not clip_norm > 0:
    raise ValueError(f"{owner} `clip_norm` must be > 0 or None, found {clip_norm}.")


class _ClientSGD(tff.learning.optimizers.Optimizer):
  """See `build_client_sgd`."""

  def __init__(self, learning_rate, momentum, weight_decay, clip_norm):
    check_clip_and_decay("Client SGD", weight_decay, clip_norm)
    self._sgd = tff.learning.optimizers.build_sgdm(
        learning_rate=learning_rate, momentum=momentum or None)
    self._weight_decay = weight_decay
    self._clip_norm = clip_norm

  @tf.autograph.experimental.do_not_convert
  def initialize(self, specs):
    return self._sgd.initialize(specs)

  @tf.autograph.experimental.do_not_convert
  def next(self, state, weights, gradients):
    return self._sgd.next(state, weights, clip_and_decay(weights, gradients, self._weight_decay,
                                                         self._clip_norm))

  def get_hparams(self, state):
    return self._sgd.get_hparams(state)

  def set_hparams(self, state, hparams):
    return self._sgd.set_hparams(state, hparams)


def build_client_sgd(learning_rate: float, momentum: float = 0.0,
                     weight_decay: float = 0.0,
                     clip_norm: Optional[float] = None) -> tff.learning.optimizers.Optimizer:
  """SGD with heavy-ball `momentum` in [0, 1), coupled `weight_decay` and a
  global gradient-norm bound `clip_norm` or None (the reference: 1e-3 and 10)."""
  return _ClientSGD(learning_rate, momentum, weight_decay, clip_norm)
