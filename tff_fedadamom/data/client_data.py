"""`ArrayClientData`: a TFF ClientData over per-client numpy arrays.

Why not ``tff.simulation.datasets.TestClientData``: TFF serializes the graph of each
client dataset it is handed, and a dataset slicing one big array captures the whole
array as a constant. Here each client's dataset holds that client's arrays only, images
as uint8 converted to float32 in [0, 1] by a ``map``, so the constant stays small too.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping, Sequence
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff


def client_id_strings(num_clients: int) -> list[str]:
  """Ids ``c0000, c0001, ...`` zero-padded so that string order is numeric order."""
  width = max(4, len(str(max(num_clients - 1, 0))))
  return [f"c{i:0{width}d}" for i in range(num_clients)]


# Not converted by AutoGraph: its branches are on static dtypes, which AutoGraph
# leaves as they are, and converting it delays each process's first data set.
@tf.autograph.experimental.do_not_convert
def convert_elements(element):
  """uint8 images become float32 in [0, 1]; labels become int32; the rest is kept."""
  out = collections.OrderedDict()
  for key, value in element.items():
    if value.dtype == tf.uint8:
      value = tf.cast(value, tf.float32) / 255.0
    elif value.dtype in (tf.int64, tf.uint16, tf.uint32, tf.int16, tf.int8):
      value = tf.cast(value, tf.int32)
    out[key] = value
  return out


def _converted_dtype(dtype) -> tf.DType:
  """The dtype an element of (numpy or TensorFlow) ``dtype`` has in the datasets."""
  dtype = tf.as_dtype(dtype)
  if dtype == tf.uint8:
    return tf.float32
  return tf.int32 if dtype.is_integer else dtype


def _converts(arrays: Mapping[str, np.ndarray]) -> bool:
  """Whether `convert_elements` changes a dtype of `arrays`."""
  return any(tf.as_dtype(a.dtype) != _converted_dtype(a.dtype) for a in arrays.values())


def arrays_to_dataset(arrays: Mapping[str, np.ndarray],
                      block: Optional[int] = None) -> tf.data.Dataset:
  """An unbatched dataset of ``OrderedDict`` elements, with the uint8 -> float32 map.

  The values may be numpy arrays or tensors (graph inputs too). With ``block``, the
  conversion runs on ``block`` examples at a time: it is elementwise, so each example
  gets the values a per-example ``map`` gives it, for one call per block.
  """
  arrays = collections.OrderedDict(arrays)
  ds = tf.data.Dataset.from_tensor_slices(arrays)
  if not _converts(arrays):
    return ds
  if block is None:
    return ds.map(convert_elements, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  size = ds.cardinality()  # which `unbatch` cannot know: it is told again
  ds = ds.batch(block).map(convert_elements).unbatch()
  return ds.apply(tf.data.experimental.assert_cardinality(size))


def held_out_dataset(arrays: Mapping[str, np.ndarray]) -> tf.data.Dataset:
  """A centralized test set, which evaluation batches whole: converted in blocks of
  1000 examples, a cost every run's first evaluation pays."""
  return arrays_to_dataset(arrays, block=1000)


class ArrayClientData(tff.simulation.datasets.ClientData):
  """Client data held as ``{client_id: {"x": array, "y": array}}``; every client must
  have the same keys, per-example shapes and dtypes, and at least one example."""

  def __init__(self, client_arrays: Mapping[str, Mapping[str, np.ndarray]]):
    if not client_arrays:
      raise ValueError("ArrayClientData needs at least one client.")
    self._arrays: dict[str, collections.OrderedDict] = {}
    first = None
    for cid, arrays in client_arrays.items():
      arrays = collections.OrderedDict((k, np.asarray(v)) for k, v in arrays.items())
      sizes = {len(v) for v in arrays.values()}
      if len(sizes) != 1 or 0 in sizes:
        raise ValueError(f"Client {cid!r}: arrays must be non-empty and equally long, "
                         f"got lengths {sorted(sizes)}.")
      signature = [(k, v.shape[1:], v.dtype) for k, v in arrays.items()]
      first = signature if first is None else first
      if signature != first:
        raise ValueError(f"Client {cid!r} has element signature {signature}, "
                         f"the first client has {first}.")
      self._arrays[str(cid)] = arrays
    self._client_ids = sorted(self._arrays)
    self._element_type_structure = collections.OrderedDict(
        (k, tf.TensorSpec(shape, _converted_dtype(dtype))) for k, shape, dtype in first)
    self._lookup_fn = None

  @classmethod
  def from_partition(cls, arrays: Mapping[str, np.ndarray],
                     parts: Sequence[np.ndarray]) -> "ArrayClientData":
    """Clients ``c0000..`` holding ``arrays[k][parts[i]]`` (copies, one per client)."""
    ids = client_id_strings(len(parts))
    return cls({cid: collections.OrderedDict((k, v[idx]) for k, v in arrays.items())
                for cid, idx in zip(ids, parts)})

  @property
  def client_ids(self) -> list[str]:
    return self._client_ids

  @property
  def element_type_structure(self):
    return self._element_type_structure

  @property
  def client_sizes(self) -> dict[str, int]:
    """Number of examples per client, without building any dataset."""
    return {cid: len(next(iter(a.values()))) for cid, a in self._arrays.items()}

  def client_arrays(self, client_id: str) -> collections.OrderedDict:
    """The raw (unconverted) numpy arrays of one client."""
    return self._arrays[client_id]

  def create_tf_dataset_for_client(self, client_id: str) -> tf.data.Dataset:
    """That client's examples only: the graph holds nothing of other clients."""
    try:
      arrays = self._arrays[client_id]
    except KeyError:
      raise ValueError(f"ID [{client_id}] is not a client in this ClientData. See "
                       "property `client_ids` for the list of valid ids.") from None
    return arrays_to_dataset(arrays)

  @property
  def serializable_dataset_fn(self):
    """A traceable ``fn(client_id) -> Dataset`` for TFF's one-off ``dataset_computation``,
    built lazily: it looks the client up in all clients' arrays, which its graph holds."""
    if self._lookup_fn is not None:
      return self._lookup_fn
    # numpy, not tensors: the function may be traced into a TFF graph, where an eager
    # tensor created here could not be captured; constants are made inside instead.
    ids = np.asarray(self._client_ids, dtype=object)
    sizes = [len(next(iter(self._arrays[c].values()))) for c in self._client_ids]
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    keys = list(self._element_type_structure)
    columns = {k: np.concatenate([self._arrays[c][k] for c in self._client_ids])
               for k in keys}
    needs_map = _converts(columns)

    def dataset_fn(client_id):
      found = tf.where(tf.equal(tf.constant(ids, tf.string), client_id))
      index = tf.reshape(found, [-1])[0]
      bounds = tf.constant(offsets)
      start, stop = bounds[index], bounds[index + 1]
      ds = tf.data.Dataset.from_tensor_slices(collections.OrderedDict(
          (k, tf.constant(columns[k])[start:stop]) for k in keys))
      return ds.map(convert_elements) if needs_map else ds

    self._lookup_fn = dataset_fn
    return dataset_fn


def read_client_arrays(client_data, client_id: str) -> collections.OrderedDict:
  """A client's examples as numpy arrays: raw for `ArrayClientData`, else read once."""
  if isinstance(client_data, ArrayClientData):
    return client_data.client_arrays(client_id)
  whole = next(iter(client_data.create_tf_dataset_for_client(client_id).batch(2**31 - 1)),
               None)
  if whole is None:
    raise ValueError("a client has no examples")
  return collections.OrderedDict((k, np.asarray(v)) for k, v in whole.items())
