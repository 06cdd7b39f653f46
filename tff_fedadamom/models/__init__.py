"""The model zoo: Keras models for ``tff.learning.models.from_keras_model``.

Ground floor: knows nothing of configs, runners or Ray. Every model is built by
``build_model(name, input_shape=..., num_classes=..., seed=..., **options)``,
is uncompiled and returns logits; ``loss_and_metrics(MODELS[name].task)``
gives the matching loss and metrics.
"""

from tff_fedadamom.models.losses import (ACCURACY_METRIC, MaskedSparseCategoricalAccuracy,
                                         loss_and_metrics)
from tff_fedadamom.models.registry import (MODELS, ModelSpec, build_model, count_params,
                                           get_spec, list_models)

__all__ = ["ACCURACY_METRIC", "MODELS", "MaskedSparseCategoricalAccuracy", "ModelSpec",
           "build_model", "count_params", "get_spec", "list_models", "loss_and_metrics"]
