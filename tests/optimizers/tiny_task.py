"""A tiny linear classification task for running optimizers inside TFF's FedAvg.

Labels are `x @ w > 0` for Gaussian features `x`; the model is one zero-initialised
dense layer with two logits.
"""

import collections
import functools

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff


def client_data(seed, w, n, batch):
  """`n` examples of the task labelled by direction `w`, in batches of `batch`."""
  w = np.asarray(w, np.float32)
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(n, w.size)).astype(np.float32)
  y = (x @ w > 0).astype(np.int32)
  return tf.data.Dataset.from_tensor_slices(collections.OrderedDict(x=x, y=y)).batch(batch)


def _model(w):
  keras_model = tf.keras.Sequential([
      tf.keras.layers.InputLayer(input_shape=(len(w),)),
      tf.keras.layers.Dense(2, kernel_initializer='zeros'),
  ])
  return tff.learning.models.from_keras_model(
      keras_model,
      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      input_spec=client_data(0, w, 1, 1).element_spec,
  )


def model_fn(w):
  """A no-argument model function for the task labelled by `w`."""
  return functools.partial(_model, tuple(w))
