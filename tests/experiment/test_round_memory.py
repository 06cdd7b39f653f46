"""A long run's memory stays flat: the in-process rounds keep nothing behind.

In TensorFlow 2.14 on Python 3.11 each eager tensor created leaves a block of
Python memory behind unless released (`runtime.eager_release`); a round part
by part makes about 30 tensors per client. Python's count of allocated blocks,
taken after a full collection, shows what rounds keep: it depends on what ran,
not on the machine's load.
"""

import gc
import sys

import pytest

from tff_fedadamom.config import load_config
from tff_fedadamom.experiment import parts as parts_lib

# Blocks a round may keep for good. Before the rounds released their tensors,
# one of this config kept about 110 (3 clients).
MAX_BLOCKS_PER_ROUND = 10


def _blocks() -> int:
  gc.collect()
  return sys.getallocatedblocks()


def test_rounds_keep_no_memory_behind(tmp_path):
  config = load_config({
      "seed": 0, "rounds": 100, "clients_per_round": 3, "output_dir": str(tmp_path),
      "data": {"name": "digits", "num_clients": 8}, "model": {"name": "logistic"},
      "client": {"learning_rate": 0.1, "batch_size": 16},
      "server": {"optimizer": "fedadamom", "learning_rate": 1.0, "beta_2": 0.05}})
  plan = parts_lib.make_plan(config)
  parts = parts_lib.build_parts(plan)
  process, data = parts.process, parts.data
  state = parts_lib.initial_state(plan, process)
  clients = data.train.client_ids[:3]
  try:
    def rounds(first, count):
      nonlocal state
      for round_num in range(first, first + count):
        state = process.next_for_clients(state, clients, round_num).state
        process.get_model_weights(state)  # as every run's hooks do, each round

    rounds(1, 10)  # caches, pools and the allocator settle
    before = _blocks()
    rounds(11, 60)
    per_round = (_blocks() - before) / 60
  finally:
    process.close()
  assert per_round < MAX_BLOCKS_PER_ROUND, per_round
