"""The data layer: offline data sets as TFF ``ClientData``, partitioners, preprocessing.

Ground floor: knows nothing of configs, runners or Ray; returns TFF-native types.
"""

from tff_fedadamom.data.base import (CentralizedData, DataNotFoundError, DatasetSpec,
                                     FederatedData)
from tff_fedadamom.data.client_data import ArrayClientData
from tff_fedadamom.data.partition import PARTITIONERS, PartitionerSpec
from tff_fedadamom.data.preprocess import client_dataset, client_round_seed, test_dataset
from tff_fedadamom.data.registry import DATASETS, list_datasets, load_federated_data
from tff_fedadamom.data.sampling import UniformSampler, sample_clients
from tff_fedadamom.data.summary import (partition_summary, plot_partition_summary,
                                        save_partition_summary)

__all__ = ["ArrayClientData", "CentralizedData", "DATASETS", "DataNotFoundError",
           "DatasetSpec", "FederatedData", "PARTITIONERS", "PartitionerSpec", "UniformSampler",
           "client_dataset", "client_round_seed", "list_datasets", "load_federated_data",
           "partition_summary", "plot_partition_summary", "sample_clients",
           "save_partition_summary", "test_dataset"]
