"""The one data set registry and load_federated_data's validation."""

import inspect

import pytest

import tff_fedadamom.data as data
from tff_fedadamom.data import DATASETS, DataNotFoundError, list_datasets, load_federated_data
from tff_fedadamom.data import registry

ALL = ["cifar10", "cifar100", "digits", "emnist", "fashion_mnist", "femnist", "mnist5k",
       "shakespeare", "synthetic", "tiny_imagenet"]


def test_list_datasets_and_specs():
  assert list_datasets() == ALL
  for name, spec in DATASETS.items():
    assert spec.name == name and callable(spec.loader)
    assert spec.description and spec.source and spec.license
    # The declared options are exactly the loader's keyword options, with its defaults.
    params = inspect.signature(spec.loader).parameters
    assert {k: params[k].default for k in spec.options} == dict(spec.options)
  assert {n for n, s in DATASETS.items() if s.natural_clients} == {
      "emnist", "femnist", "shakespeare", "synthetic"}
  assert {n for n, s in DATASETS.items() if s.needs_path} == {
      "cifar10", "cifar100", "tiny_imagenet"}
  assert DATASETS["synthetic"].options["alpha"] == 1.0
  assert DATASETS["shakespeare"].options["seq_length"] == 80
  with pytest.raises(TypeError):
    DATASETS["nope"] = None
  with pytest.raises(TypeError):
    DATASETS["synthetic"].options["alpha"] = 2.0


def test_public_api_exports():
  for name in ["FederatedData", "DATASETS", "DatasetSpec", "list_datasets",
               "load_federated_data", "DataNotFoundError", "PARTITIONERS",
               "partition_summary", "save_partition_summary", "plot_partition_summary",
               "client_dataset", "client_round_seed", "test_dataset", "ArrayClientData"]:
    assert hasattr(data, name), name
  assert issubclass(DataNotFoundError, FileNotFoundError)


def test_unknown_name_lists_valid_names():
  with pytest.raises(ValueError, match="'mnist'.*cifar10, cifar100, digits"):
    load_federated_data("mnist")


def test_unknown_option_names_it_and_lists_valid_ones():
  with pytest.raises(ValueError, match="'sequence_length'.*max_clients, min_chars, "
                                       "seq_length, test_fraction"):
    load_federated_data("shakespeare", sequence_length=80)
  with pytest.raises(ValueError, match="'alpha'.*valid options: \\(none\\)"):
    load_federated_data("fashion_mnist", alpha=0.1)


def test_partition_name_and_options_are_validated_for_every_dataset():
  with pytest.raises(ValueError, match="'pathological'.*dirichlet, iid, shards"):
    load_federated_data("digits", partition="pathological")
  with pytest.raises(ValueError, match="'alpa'.*alpha"):
    load_federated_data("synthetic", partition_options={"alpa": 0.1})


def test_partition_options_reach_the_partitioner_and_summary():
  fd = load_federated_data("digits", num_clients=8, partition="dirichlet",
                           partition_options={"alpha": 0.05}, seed=4)
  assert fd.partition_summary["partition"] == {
      "method": "dirichlet", "options": {"alpha": 0.05}, "seed": 4}
  assert fd.partition_summary["num_examples"] == sum(fd.train.client_sizes.values())
  assert list(fd.train.client_sizes.values()) == fd.partition_summary["client_sizes"]
  wide = load_federated_data("digits", num_clients=8, partition_options={"alpha": 100.0},
                             seed=4)
  het = lambda f: f.partition_summary["heterogeneity"]["mean_tv_distance"]
  assert het(fd) > het(wide)


def test_default_number_of_clients():
  fd = load_federated_data("digits")
  assert len(fd.train.client_ids) == registry.DEFAULT_NUM_CLIENTS


def test_needs_path_without_path_is_data_not_found():
  with pytest.raises(DataNotFoundError, match="CIFAR-10.*no path given.*cifar-10"):
    load_federated_data("cifar10")


def test_natural_datasets_record_their_clients_as_the_partition():
  fd = load_federated_data("synthetic", num_clients=4, seed=2, partition="shards")
  assert fd.partition_summary["partition"] == {"method": "natural", "options": {}, "seed": 2}
  assert fd.partition_summary["num_clients"] == 4
