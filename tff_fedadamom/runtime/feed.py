"""What a computation's slot takes in place of its client data: a `Feed`.

A client's `work` takes its data as a TFF sequence, a `tf.data.Dataset`;
building that dataset in Python for every client and round costs more than a
small model's training. With a feed, a slot (`tf_computation._Slot`) takes the
client's example tensors and its round seed instead, and builds the data
inside the same graph, so a client's round is one TensorFlow call.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import tensorflow as tf


class Feed:
  """What turns a slot's own arguments into the computation's leading parameters.

  Attributes:
    signature: `tf.TensorSpec`s of the arguments that replace the parameters.
    replaces: How many leading parameter leaves they replace.
    to_params: `(*feed_args) -> list` of those `replaces` parameter tensors,
      called once, while the slot's graph is built.
    to_element: Optional, for a lone sequence parameter of one element
      (`replaces` 1): `(*feed_args) -> that element's flat tensors`. Where the
      computation reads its sequence with one `DatasetToSingleElement` op, the
      slot takes that op's outputs from here, and no dataset is built and read
      back (about 60 us a client: `algorithms.unrolled`'s stacked batches).
    source: What the feed's graph ops are built from (the run's
      `ClientTensors`): feeds of one source and kind build the same inputs, so
      slots of the same computation fed from it are shared
      (`tf_computation._slot_pool`). None: this feed alone.
  """

  def __init__(self, signature: Sequence[tf.TensorSpec], replaces: int, to_params,
               to_element=None, source=None):
    if to_element is not None and replaces != 1:
      raise ValueError(f"to_element replaces one sequence parameter, not {replaces}")
    self.signature = list(signature)
    self.replaces = replaces
    self.to_params = to_params
    self.to_element = to_element
    self.source = source

  def inputs(self, graph_def, sequence: str) -> Callable[[Sequence], tuple[dict, list]]:
    """For a slot importing `graph_def`, whose first parameter is the tensor
    named `sequence`: a function `(feed args) -> (input map entries, the
    replaced parameters' tensors)`, called while the slot's graph is built.

    With `to_element` and a lone `DatasetToSingleElement` reading `sequence`,
    that op is removed from `graph_def`, so it cannot run: the input map gives
    its outputs, what waited for it (TFF's compiler adds control edges) waits
    for the element instead, and the parameter is an empty dataset that
    nothing reads.
    """
    reader = _single_element_reader(graph_def, sequence) if self.to_element else None
    if reader is None:
      return lambda args: ({}, list(self.to_params(*args)))
    name, outputs = reader
    kept = [node for node in graph_def.node if node.name != name]
    del graph_def.node[:]
    graph_def.node.extend(kept)

    def element_inputs(args):
      element = list(self.to_element(*args))
      if len(element) != outputs:
        raise ValueError(f"the feed gives {len(element)} element tensors, the computation "
                         f"reads {outputs}")
      entries = {f"{name}:{i}": t for i, t in enumerate(element)}
      entries[f"^{name}"] = element[0]
      return entries, [tf.data.Dataset.range(0)._variant_tensor]  # noqa: SLF001

    return element_inputs


def _single_element_reader(graph_def, sequence: str) -> Optional[tuple[str, int]]:
  """(name, outputs) of the one `DatasetToSingleElement` op that reads the
  tensor named `sequence` when nothing else reads it, else None."""
  op = sequence.split(":")[0]
  readers = [node for node in graph_def.node
             if any(i.split(":")[0].lstrip("^") == op for i in node.input)]
  if len(readers) != 1 or readers[0].op != "DatasetToSingleElement":
    return None
  return readers[0].name, len(readers[0].attr["output_types"].list.type)
