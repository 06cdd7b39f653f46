"""The one model registry: name -> ModelSpec, and ``build_model`` on top of it.

A builder is ``builder(input_shape, num_classes, seed=None, *, **options)``; its
keyword-only parameters are its options (``ModelSpec.options``, read off the
signature so the defaults are written once). Each builder checks option values.
"""

from __future__ import annotations

import dataclasses
import inspect
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Optional

import tensorflow as tf

from tff_fedadamom.models import _common, char_lstm, cnn, dense, resnet


@dataclasses.dataclass(frozen=True)
class ModelSpec:
  """A registered model: its builder, option defaults and task ("classification"/"next_char")."""
  name: str
  builder: Callable[..., tf.keras.Model]
  options: Mapping[str, Any] = dataclasses.field(hash=False)
  description: str
  task: str


def _spec(name: str, builder: Callable[..., tf.keras.Model], task: str,
          description: str) -> ModelSpec:
  params = inspect.signature(builder).parameters.values()
  options = {p.name: p.default for p in params if p.kind is p.KEYWORD_ONLY}
  return ModelSpec(name=name, builder=builder, options=types.MappingProxyType(options),
                   description=description, task=task)


MODELS: Mapping[str, ModelSpec] = types.MappingProxyType({s.name: s for s in (
    _spec("logistic", dense.build_logistic, "classification",
          "Multinomial logistic regression (Flatten + Dense)."),
    _spec("mlp", dense.build_mlp, "classification",
          "Fully connected ReLU network; default is the 2NN of McMahan et al."),
    _spec("cnn", cnn.build_cnn, "classification",
          "EMNIST CNN of Reddi et al. (conv32, conv64, maxpool, dense128, dropout)."),
    _spec("resnet18", resnet.build_resnet18, "classification",
          "ResNet-18 with GroupNorm; CIFAR stem for inputs <= 64 px."),
    _spec("char_lstm", char_lstm.build_char_lstm, "next_char",
          "LEAF Shakespeare next-character model (embedding 8, two LSTM(256))."),
)})


def list_models() -> list[str]:
  """Registered model names, sorted."""
  return sorted(MODELS)


def get_spec(name: str) -> ModelSpec:
  """The ModelSpec for ``name``; ValueError listing the valid names otherwise."""
  try:
    return MODELS[name]
  except (KeyError, TypeError):
    raise ValueError(f"unknown model {name!r}; valid models: {list_models()}") from None


def build_model(name: str, *, input_shape: Sequence[int], num_classes: int,
                seed: Optional[int] = None, **options) -> tf.keras.Model:
  """Builds an uncompiled Keras model for ``name`` that returns logits.

  Args:
    input_shape: Shape of one example, without the batch dimension.
    num_classes: Number of classes (the vocabulary size for ``next_char``).
    seed: Non-negative int for deterministic initialization (per-layer seeds,
      `_common.SeedStream`), or None for Keras' nondeterministic default.
    **options: The model's options (``MODELS[name].options``).
  """
  spec = get_spec(name)
  unknown = sorted(set(options) - set(spec.options))
  if unknown:
    raise ValueError(f"unknown option(s) {unknown} for model {name!r}; "
                     f"valid options: {sorted(spec.options)}")
  if seed is not None:
    if not _common.is_int(seed) or seed < 0:
      raise ValueError(f"seed must be a non-negative integer or None, got {seed!r}")
    seed = int(seed)
  return spec.builder(input_shape, num_classes, seed, **options)


def count_params(model: tf.keras.Model) -> int:
  """Number of trainable parameters (what the server optimizer updates)."""
  return int(sum(v.shape.num_elements() for v in model.trainable_variables))

