"""A one-parameter linear model on tiny hand-made data, and numpy references.

The model is `w * x` with the mean squared error, so a batch's gradient is
`mean(2 x (w x - y))`; every reference below is written from the update rules
in the algorithms' docstrings, in float64, independently of the TFF code.
"""

import collections

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

W0 = 0.5
# Client data as (x, y) batches of one example each.
CLIENTS = (
    [(1.0, 2.0), (2.0, 4.0)],
    [(1.0, 1.0), (-1.0, -1.0), (3.0, 3.0)],
    [(2.0, -1.0)],
)
_SPEC = collections.OrderedDict(x=tf.TensorSpec([None, 1], tf.float32),
                                y=tf.TensorSpec([None, 1], tf.float32))


def model_fn():
  keras_model = tf.keras.Sequential([tf.keras.layers.Dense(
      1, use_bias=False, input_shape=(1,),
      kernel_initializer=tf.keras.initializers.Constant(W0))])
  return tff.learning.models.from_keras_model(
      keras_model, loss=tf.keras.losses.MeanSquaredError(), input_spec=_SPEC)


def datasets(indices=range(len(CLIENTS))):
  out = []
  for i in indices:
    xs, ys = zip(*CLIENTS[i])
    out.append(tf.data.Dataset.from_tensor_slices(collections.OrderedDict(
        x=np.array(xs, np.float32)[:, None], y=np.array(ys, np.float32)[:, None])).batch(1))
  return out


def grad(w, x, y):
  return 2.0 * x * (w * x - y)


def weighted_mean(values, weights):
  weights = np.asarray(weights, np.float64)
  return sum(w * v for w, v in zip(weights, values)) / weights.sum()


def scalar(tensor_list):
  """The single value of a one-element weight list."""
  return float(np.asarray(tensor_list[0]).ravel()[0])
