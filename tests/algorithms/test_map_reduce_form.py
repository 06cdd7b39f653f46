"""Every process of `tff_fedadamom.algorithms` compiles to TFF's MapReduceForm
(the in-process backend runs processes from it)."""

import pytest
import tensorflow_federated as tff

from tests.algorithms import linear
from tff_fedadamom.algorithms import build_fafed, build_fedcada


@pytest.mark.parametrize('builder', [build_fedcada, build_fafed])
@pytest.mark.parametrize('loop', list(tff.learning.LoopImplementation))
def test_compiles_to_map_reduce_form(builder, loop):
  process = builder(linear.model_fn, 0.1, clip_norm=1.0, weight_decay=1e-3,
                    client_lr_decay=0.99,
                    client_weighting=tff.learning.ClientWeighting.NUM_EXAMPLES,
                    loop_implementation=loop)
  # The compiler raises when the computation has no MapReduceForm.
  form = tff.backends.mapreduce.get_map_reduce_form_for_computation(process.next)
  # What the in-process backend relies on: plain sums (no secure aggregation),
  # `work` on the process's client datasets, and `update` returning the
  # process's own state.
  assert not form.securely_aggregates_tensors
  state_type, data_type = (t.member for t in process.next.type_signature.parameter)
  assert form.work.type_signature.parameter[0].is_equivalent_to(data_type)
  assert form.update.type_signature.result[0].is_equivalent_to(state_type)
  init = tff.backends.mapreduce.get_state_initialization_computation(process.initialize)
  process.initialize.type_signature.result.member.check_assignable_from(
      init.type_signature.result)
