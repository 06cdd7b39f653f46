"""Each client's examples as tensors, made once; its round's batches built in-graph.

A `tf.data` pipeline built in Python per sampled client and round costs more
than a small model's local training, and traces new dataset functions into
TensorFlow's eager context, which keeps growing. Here a client's examples become
tensors the first time it is sampled, and `ClientTensors.dataset` builds its
round's dataset from them and a round seed with graph ops alone, inside the
client's training call (`runtime.tf_computation.Feed`).

The batches are exactly those of `preprocess.client_dataset` over the client's
`create_tf_dataset_for_client` (the same function, given tensors): TensorFlow
derives the shuffle op's seed pair from a tensor seed as from a Python int
(`random_seed.get_seed`), so a run keeps its data order and a resumed run stays exact.
"""

from __future__ import annotations

import collections
import threading
from typing import Optional

import numpy as np
import tensorflow as tf

from tff_fedadamom.data.client_data import (ArrayClientData, convert_elements,
                                           read_client_arrays)
from tff_fedadamom.data.preprocess import client_dataset, client_round_seed


# What a client's round pipeline runs with: no graph rewrites and no autotuning, which
# tf.data does each time an iterator is made over a pipeline (once per client and
# round here): that costs more than reading a small client's batches, and changes none.
STATIC_OPTIONS = tf.data.Options()
STATIC_OPTIONS.experimental_optimization.apply_default_optimizations = False
STATIC_OPTIONS.autotune.enabled = False

# The keys of a client's stacked round batches (`ClientTensors.stacked`).
EXAMPLES, FULL, LAST = "examples", "full", "last"


def batch_of(element: collections.OrderedDict, positions) -> collections.OrderedDict:
  """The batch of a stacked element (`ClientTensors.stacked_element`) at
  `positions`: a row of its FULL positions, or its LAST ones."""
  return collections.OrderedDict(
      (key, tf.gather(array, positions)) for key, array in element[EXAMPLES].items())


class ClientTensors:
  """A federated training set's clients as tensors, and their round datasets.

  Args:
    client_data: The training `ClientData` (`read_client_arrays`, on first use).
    seed: The experiment seed (`client_round_seed(seed, round, client)`).
    batch_size, local_epochs, augment: As in `preprocess.client_dataset`.
    max_examples: Keep only a client's first `max_examples` examples.
  """

  def __init__(self, client_data, *, seed: int, batch_size: int, local_epochs: int,
               augment: Optional[str] = None, max_examples: Optional[int] = None):
    self._client_data = client_data
    self._seed = int(seed)
    self._batch_size = batch_size
    self._local_epochs = local_epochs
    self._augment = augment
    self._max_examples = max_examples
    self._tensors: dict[str, list[tf.Tensor]] = {}
    self._lock = threading.Lock()
    first = self._arrays(client_data.client_ids[0])
    self.keys = list(first)
    self.signature = [tf.TensorSpec([None, *a.shape[1:]], tf.as_dtype(a.dtype))
                      for a in first.values()] + [tf.TensorSpec([], tf.int64)]

  def _arrays(self, client_id: str) -> collections.OrderedDict:
    arrays = read_client_arrays(self._client_data, client_id)
    if self._max_examples is not None:
      arrays = collections.OrderedDict((k, v[:self._max_examples]) for k, v in arrays.items())
    return arrays

  def examples(self, client_id: str) -> list[tf.Tensor]:
    """The client's example tensors (made on first use, on the CPU, then kept)."""
    with self._lock:
      tensors = self._tensors.get(client_id)
    if tensors is None:
      with tf.device("CPU:0"):
        tensors = [tf.constant(a) for a in self._arrays(client_id).values()]
      with self._lock:
        tensors = self._tensors.setdefault(client_id, tensors)
    return tensors

  def args(self, client_id: str, round_num: int) -> list[tf.Tensor]:
    """What `dataset` takes for this client in round `round_num`: examples and seed."""
    # A numpy scalar, not a Python int: TensorFlow caches the tensor of every Python
    # number it converts, for the life of the process, and every round seed is new.
    seed = np.int64(client_round_seed(self._seed, round_num, client_id))
    return [*self.examples(client_id), tf.constant(seed, tf.int64)]

  def _converted(self, args):
    """`args`' examples converted, their count and the round seed.

    The element conversion (uint8 images to float32 in [0, 1], integer labels to
    int32) is elementwise: applied to the whole client at once it gives the values
    a per-example map gives, in one op instead of one function call per example.
    """
    *examples, seed = args
    arrays = convert_elements(collections.OrderedDict(zip(self.keys, examples)))
    return arrays, tf.shape(examples[0], out_type=tf.int64)[0], seed

  def dataset(self, *args) -> tf.data.Dataset:
    """The client's round dataset from `args(...)`'s tensors (or graph inputs of
    `signature`), as `preprocess.client_dataset` makes it (without its prefetch)."""
    arrays, size, seed = self._converted(args)
    # No prefetch: the client's training reads each batch as soon as it is made,
    # in the same call, so a prefetch thread only adds a hand-over per batch.
    ds = client_dataset(tf.data.Dataset.from_tensor_slices(arrays), batch_size=self._batch_size,
                        local_epochs=self._local_epochs, seed=seed,
                        shuffle_buffer=tf.maximum(size, 1), augment=self._augment,
                        prefetch=False)
    return ds.with_options(STATIC_OPTIONS)

  def batch_count(self, client_id: str) -> int:
    """How many batches the client's round dataset has (every round the same)."""
    size = int(self._arrays(client_id)[self.keys[0]].shape[0])
    return -(-size * self._local_epochs // self._batch_size)

  def batch_counts(self) -> Optional[list[int]]:
    """Every client's round batch count, in `client_ids` order, or None where that
    would read every client's data (not an `ArrayClientData`)."""
    if not isinstance(self._client_data, ArrayClientData):
      return None
    return [self.batch_count(cid) for cid in self._client_data.client_ids]

  def stacked(self, *args) -> tf.data.Dataset:
    """The batches `dataset(*args)` yields, in order, as one stacked element
    (`algorithms.unrolled`): the client's examples and each batch's positions.

    The order is drawn as `preprocess.client_dataset` draws it: the same shuffle op,
    seed and buffer, over the examples' positions (a shuffle's order depends only on
    its seed, buffer and element count), repeated for the local epochs. The element
    is `OrderedDict(examples=<converted as in dataset>, full=<the full batches'
    positions, [F, batch] int64>, last=<the shorter last batch's, [r] int64, r >= 0>)`;
    `batch_of` gathers a batch as it is trained on (gathering them all at once would
    hold a copy of the examples per epoch). Not for augmented data.
    """
    return tf.data.Dataset.from_tensors(self.stacked_element(*args))

  def stacked_element(self, *args) -> collections.OrderedDict:
    """`stacked(*args)`'s one element (see there)."""
    if self._augment is not None:
      raise ValueError("stacked batches cannot augment; use dataset(...)")
    arrays, size, seed = self._converted(args)
    epochs = self._local_epochs
    # tf.data's own shuffle, though it is a large part of a small model's round: a
    # stateless Fisher-Yates `tf.while_loop`, or one pipeline over all clients, is slower.
    order = (tf.data.Dataset.range(size)
             .shuffle(tf.maximum(size, 1), seed=seed, reshuffle_each_iteration=True)
             .repeat(epochs).batch(size * epochs).with_options(STATIC_OPTIONS)
             .get_single_element())
    split = size * epochs // self._batch_size * self._batch_size
    return collections.OrderedDict([
        (EXAMPLES, arrays),
        (FULL, tf.reshape(order[:split], [-1, self._batch_size])),
        (LAST, order[split:])])

  def datasets(self, client_ids, round_num: int) -> list[tf.data.Dataset]:
    """Round `round_num`'s datasets of `client_ids`, built eagerly (for TFF's runtime)."""
    return [self.dataset(*self.args(cid, round_num)) for cid in client_ids]
