"""Ray Tune sweeps over FedAdamom and its baselines, on top of `tff_fedadamom`.

    from tuning import load_sweep, run_sweep, export_sweep
    result = run_sweep("configs/sweeps/quickstart.yaml")
    export_sweep(result.sweep_dir)

Names are imported lazily: `import tuning` loads neither Ray nor TensorFlow.
"""

from tff_fedadamom.lazy import lazy_exports

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
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
