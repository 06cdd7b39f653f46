"""A timeline of a run's start: when each of its steps starts and how long it takes.

`Timeline` wraps the functions named in `STEPS` so that each call records its
start, end and nesting depth, in seconds since a given launch time. A module
already imported is wrapped at once (`install(now=True)`); one not yet
imported is wrapped as its import finishes, so the imports themselves are
timed where they happen and the timeline shows them (`import <module>`).

Run as a program, this module is the child process of
`process_load.py --warm-run`: it installs a timeline, runs
`tff-fedadamom run` (`tff_fedadamom.cli.main`) with the arguments it is given,
and when the first round's metrics are released (metrics.csv has its row)
writes the timeline as JSON and exits at once:

    python benchmarks/startup_timeline.py LAUNCH_TIME OUT.json run CONFIG --set ...
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import json
import os
import sys
import time

# Module -> the functions and methods of it the timeline times (a call of one
# inside another shows nested under it).
STEPS = {
    "tff_fedadamom.config.loader": ["load_config"],
    "tff_fedadamom.session": ["Session.apply"],
    "tff_fedadamom.pipeline.parts": [
        "make_plan", "build_parts", "learning_process", "initial_state", "layer_labels"],
    "tff_fedadamom.pipeline.parts_cache": ["PartsCache.get"],
    "tff_fedadamom.pipeline.evaluation": ["Evaluator.__init__", "Evaluator.__call__"],
    "tff_fedadamom.pipeline.process": [
        "load_data", "make_client_tensors", "make_keras_model", "build_server_optimizer",
        "data_signature"],
    "tff_fedadamom.pipeline.process_cache": ["ProcessCache.load", "process_key"],
    "tff_fedadamom.pipeline.backends.base": ["build_backend"],
    "tff_fedadamom.pipeline.runner": ["_run", "_progress_bar"],
    "tff_fedadamom.pipeline.resume": ["restore", "check_resumable"],
    "tff_fedadamom.pipeline.loop": ["run_rounds"],
    "tff_fedadamom.pipeline.backends.inprocess": [
        "InProcessLearningProcess.next_for_clients", "ClientFold.__call__"],
    "tff_fedadamom.pipeline.backends.server": [
        "ServerComputations.initialize", "ServerComputations.round",
        "ServerComputations.get_model_weights", "ServerComputations.get_hparams",
        "ServerComputations.set_hparams"],
    "tff_fedadamom.pipeline.hooks": [
        "Telemetry.start_round", "Telemetry.end_round", "Divergence.end_round",
        "Evaluate.end_round", "Release.end_round", "Checkpoint.end_round"],
}
# The step whose end is the first round's end: its metrics row is on disk.
ROUND_END = "Release.end_round"
# The step whose start is the first round's start, and the label of that instant.
ROUND_START = "run_rounds"
ROUND_START_MARK = "first round starts"


class Timeline:
  """Spans (label, start, end, depth) of the `STEPS` called, in seconds since
  `launch` (a `time.time()`); `on_round_end(timeline)`, if given, is called
  when a release of a round's metrics ends."""

  def __init__(self, launch: float, on_round_end=None):
    self.launch = launch
    self.spans: list[dict] = []
    self._depth = 0
    self._wrapped: dict[int, tuple] = {}
    self._on_round_end = on_round_end

  def now(self) -> float:
    return time.time() - self.launch

  def mark(self, label: str, start: float) -> None:
    self.spans.append({"label": label, "start": start, "end": self.now(),
                       "depth": self._depth})

  def _wrap(self, owner, attr: str, label: str) -> None:
    fn = getattr(owner, attr)

    @functools.wraps(fn)
    def timed(*args, **kwargs):
      start = self.now()
      if label == ROUND_START:  # the span itself ends after the round
        self.spans.append({"label": ROUND_START_MARK, "start": start, "end": start,
                           "depth": self._depth})
      self._depth += 1
      try:
        return fn(*args, **kwargs)
      finally:
        self._depth -= 1
        self.mark(label, start)
        if label == ROUND_END and self._on_round_end is not None:
          self._on_round_end(self)

    setattr(owner, attr, timed)
    self._wrapped[id(fn)] = (fn, timed)

  def wrap_module(self, name: str, module) -> None:
    for path in STEPS[name]:
      owner = module
      *parents, attr = path.split(".")
      for parent in parents:
        owner = getattr(owner, parent)
      self._wrap(owner, attr, path)

  def install(self, now: bool = False) -> None:
    """Wraps the steps of imported modules (`now`), and those of the others as
    they are imported."""
    for name in STEPS:
      if name in sys.modules:
        if not now:
          raise RuntimeError(f"{name} is imported already: install(now=True) times it")
        self.wrap_module(name, sys.modules[name])
    if now:  # names other modules imported (`from loop import run_rounds`) too
      for module in [m for n, m in sys.modules.items() if n.startswith("tff_fedadamom")]:
        for attr, value in list(vars(module).items()):
          if self._wrapped.get(id(value), (None,))[0] is value:
            setattr(module, attr, self._wrapped[id(value)][1])
    sys.meta_path.insert(0, _Finder(self))

  def first_round(self) -> tuple[float, float]:
    return first_round(self.spans)


class _Finder(importlib.abc.MetaPathFinder):
  """Wraps a module's `STEPS` once its import finishes, and times the import."""

  def __init__(self, timeline: Timeline):
    self._timeline = timeline

  def find_spec(self, name, path, target=None):
    if name not in STEPS:
      return None
    sys.meta_path.remove(self)
    try:
      spec = importlib.util.find_spec(name)
    finally:
      sys.meta_path.insert(0, self)
    execute = spec.loader.exec_module

    def exec_module(module):
      start = self._timeline.now()
      execute(module)
      self._timeline.mark(f"import {name}", start)
      self._timeline.wrap_module(name, module)

    spec.loader.exec_module = exec_module
    return spec


def first_round(spans: list[dict]) -> tuple[float, float]:
  """(start, end) of the first round, in seconds since launch."""
  start = min(s["start"] for s in spans if s["label"] == ROUND_START_MARK)
  end = min(s["end"] for s in spans if s["label"] == ROUND_END)
  return start, end


def format_timeline(spans: list[dict]) -> list[str]:
  """One line per span, by start: seconds since launch at its start, its
  duration, and its label indented by depth."""
  lines = []
  for span in sorted(spans, key=lambda s: (s["start"], -(s["end"] - s["start"]))):
    lines.append(f"  {span['start']:6.2f} {span['end'] - span['start']:6.2f}  "
                 f"{'  ' * span['depth']}{span['label']}")
  return lines


def _child(argv) -> None:
  launch, out, *cli_args = argv
  timeline = Timeline(float(launch))
  started = timeline.now()

  def write_and_exit(timeline):
    timeline.spans.append({"label": "python start", "start": 0.0, "end": started, "depth": 0})
    with open(out, "w") as f:
      json.dump(timeline.spans, f)
    sys.stdout.flush()
    from tff_fedadamom.session import remove_autograph_files

    remove_autograph_files()  # what the exit handlers skipped below would have done
    os._exit(0)  # noqa: SLF001 - the rest of the run is not measured

  timeline._on_round_end = write_and_exit  # noqa: SLF001
  timeline.install()
  from tff_fedadamom import cli

  sys.exit(cli.main(cli_args, owns_process=True))  # as `cli.entry` calls it


if __name__ == "__main__":
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  _child(sys.argv[1:])
