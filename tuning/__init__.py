"""Ray Tune sweeps over FedAdamom and its baselines, on top of `tff_fedadamom`.

    from tuning import load_sweep, run_sweep, export_sweep
    result = run_sweep("configs/sweeps/quickstart.yaml")
    export_sweep(result.sweep_dir)

Names are imported lazily: `import tuning` (and the CLI's parser) pulls in
neither Ray nor TensorFlow.
"""

import importlib

_EXPORTS = {
    "load_sweep": "tuning.schema",
    "Sweep": "tuning.schema",
    "SweepConfigError": "tuning.errors",
    "run_sweep": "tuning.sweep",
    "SweepError": "tuning.errors",
    "SweepResult": "tuning.sweep",
    "export_sweep": "tuning.export",
    "ExportResult": "tuning.export",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
  if name in _EXPORTS:
    return getattr(importlib.import_module(_EXPORTS[name]), name)
  raise AttributeError(f"module 'tuning' has no attribute {name!r}")


def __dir__():
  return sorted(list(globals()) + list(_EXPORTS))
