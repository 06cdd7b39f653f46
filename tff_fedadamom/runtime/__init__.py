"""The execution backends (`base` says which), behind one protocol.

Names are imported lazily (`tff_fedadamom.lazy`): importing the package imports
no backend.
"""

from tff_fedadamom.lazy import lazy_exports

_EXPORTS = {
    "Backend": "tff_fedadamom.runtime.base",
    "build_backend": "tff_fedadamom.runtime.base",
    "ray_settings": "tff_fedadamom.runtime.base",
    "round_devices": "tff_fedadamom.runtime.base",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
