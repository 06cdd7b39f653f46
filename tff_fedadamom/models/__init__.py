"""The model zoo: uncompiled Keras models returning logits, for TFF's ``from_keras_model``.

Ground floor: knows nothing of configs, runners or Ray. ``loss_and_metrics(MODELS[name].task)``
gives a model's loss and metrics.
"""

from tff_fedadamom.models.losses import (ACCURACY_METRIC, MaskedSparseCategoricalAccuracy,
                                         loss_and_metrics)
from tff_fedadamom.models.registry import (MODELS, ModelSpec, build_model, count_params,
                                           get_spec, list_models)

__all__ = ["ACCURACY_METRIC", "MODELS", "MaskedSparseCategoricalAccuracy", "ModelSpec",
           "build_model", "count_params", "get_spec", "list_models", "loss_and_metrics"]
