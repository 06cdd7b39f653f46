"""The command line: run, compare, validate, plot, tune, export.

    tff-fedadamom run CONFIG [--set key=value ...]
    tff-fedadamom compare CONFIG --optimizers fedadamom,fedadam,fedavgm [--set ...]
    tff-fedadamom validate CONFIG [--set ...]
    tff-fedadamom plot RUN_DIR [RUN_DIR ...] [--out PATH]
    tff-fedadamom tune SWEEP [--resume] [--smoke-test]
    tff-fedadamom export SWEEP_DIR

Ray is imported only by `tune` and `export`.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Optional


def _add_overrides(parser, cache: bool = True):
  """`--set KEY=VALUE`, and `--no-cache`, which appends the override `runtime.cache=false`."""
  parser.add_argument("--set", dest="overrides", action="append", default=[],
                      metavar="KEY=VALUE",
                      help="override a config value by dotted key, e.g. server.learning_rate=0.5")
  if cache:
    parser.add_argument("--no-cache", dest="overrides", action="append_const",
                        const="runtime.cache=false",
                        help="build the learning process instead of loading it from the "
                        "machine's cache of compiled processes (runtime.cache: false)")


def _cmd_validate(args) -> int:
  from tff_fedadamom.config import dump_config, load_config

  config = load_config(args.config, args.overrides)
  print(f"{args.config}: valid")
  if args.show:
    print(dump_config(config), end="")
  return 0


def _print_summary(summary, output_dir) -> None:
  status = summary["status"]
  line = (f"{status}: {summary['rounds_completed']} rounds, final test accuracy "
          f"{_fmt(summary['final_test_accuracy'])}, best {_fmt(summary['best_test_accuracy'])}"
          f" (round {summary['best_round']})")
  if status == "diverged":
    line += f"; diverged at round {summary['diverged_round']}"
  print(line)
  print(f"outputs in {output_dir}")


def _fmt(value) -> str:
  return "n/a" if value is None else f"{value:.4f}"


def _cmd_run(args) -> int:
  from tff_fedadamom.config import load_config
  from tff_fedadamom.session import Session, startup_imports

  with startup_imports(args.owns_process):  # only in a process of its own (`entry`)
    from tff_fedadamom.experiment import run_experiment
  config = load_config(args.config, args.overrides)
  Session(threads=config.runtime.threads).apply()  # before TensorFlow runs anything
  result = run_experiment(config, progress=not args.quiet, on_round=args.interrupts.check)
  _print_summary(result.summary, result.output_dir)
  return 0 if result.summary["status"] == "completed" else 3


def _cmd_compare(args) -> int:
  from tff_fedadamom.config import load_config
  from tff_fedadamom.session import Session, startup_imports

  with startup_imports(args.owns_process):  # only in a process of its own (`entry`)
    from tff_fedadamom.experiment.compare import compare

  names = [n.strip() for n in args.optimizers.split(",") if n.strip()]
  config = load_config(args.config, args.overrides)
  Session(threads=config.runtime.threads).apply()
  table = compare(config, names, progress=not args.quiet)
  print(table)
  return 0


def _cmd_plot(args) -> int:
  from tff_fedadamom.experiment.compare import plot_runs

  for path in plot_runs(args.run_dirs, out=args.out):
    print(f"wrote {path}")
  return 0


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog="tff-fedadamom",
      description="FedAdamom and its baselines in TensorFlow Federated, from YAML.")
  sub = parser.add_subparsers(dest="command", required=True)

  p = sub.add_parser("run", help="run (or resume) one experiment")
  p.add_argument("config")
  _add_overrides(p)
  p.add_argument("--quiet", action="store_true", help="no progress bar")
  p.set_defaults(fn=_cmd_run)

  p = sub.add_parser("compare", help="one run per server optimizer, same data and seed")
  p.add_argument("config")
  p.add_argument("--optimizers", required=True,
                 help="comma-separated names, e.g. fedadamom,fedadam,fedavgm")
  _add_overrides(p)
  p.add_argument("--quiet", action="store_true")
  p.set_defaults(fn=_cmd_compare)

  p = sub.add_parser("validate", help="check a config without running it")
  p.add_argument("config")
  _add_overrides(p, cache=False)
  p.add_argument("--show", action="store_true", help="print the resolved config")
  p.set_defaults(fn=_cmd_validate)

  p = sub.add_parser("plot", help="draw learning curves and optimizer telemetry of runs")
  p.add_argument("run_dirs", nargs="+")
  p.add_argument("--out", default=None, help="output directory (default: the first run's)")
  p.set_defaults(fn=_cmd_plot)

  try:
    from tuning import cli as tuning_cli
  except ImportError:  # pragma: no cover - tuning not installed
    return parser
  tuning_cli.add_tune_parser(sub)
  tuning_cli.add_export_parser(sub)
  return parser


class _Interrupts:
  """SIGINT and SIGTERM end the command, even when they arrive in a finalizer.

  A signal's handler runs at the main thread's next bytecode, which may be in a
  `__del__` or weakref callback (TensorFlow's objects run them all the time),
  where an exception is printed as "Exception ignored" and dropped. So the
  handler remembers the signal, and when its exception is dropped
  (`sys.unraisablehook`) a one-shot SIGALRM timer (10 ms) raises it again.

  SIGINT raises KeyboardInterrupt; SIGTERM SystemExit(128 + 15), so `finally`
  blocks and exit handlers run. A SIGINT ignored at start (`nohup`) stays ignored.
  """

  def __init__(self):
    self.signum = None

  def install(self) -> None:
    import signal

    signal.signal(signal.SIGTERM, self._on_signal)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
      signal.signal(signal.SIGINT, self._on_signal)
    signal.signal(signal.SIGALRM, self._raise)
    self._previous_hook = sys.unraisablehook
    sys.unraisablehook = self._unraisable

  def check(self, *_) -> None:
    """Raises the signal's exception if one arrived. A run calls it after every
    round, so a signal whose exception a bare `except:` swallowed still ends
    the run, with that round's checkpoint on disk."""
    if self.signum is not None:
      self._raise(self.signum, None)

  def _on_signal(self, signum, frame) -> None:
    self.signum = signum
    self._raise(signum, frame)

  def _raise(self, signum, frame) -> None:
    import signal

    del signum, frame
    if self.signum == signal.SIGINT:
      raise KeyboardInterrupt
    raise SystemExit(128 + self.signum)

  def _unraisable(self, unraisable) -> None:
    import signal

    if self.signum is not None and isinstance(unraisable.exc_value,
                                              (KeyboardInterrupt, SystemExit)):
      signal.setitimer(signal.ITIMER_REAL, 0.01)
      return
    self._previous_hook(unraisable)


def main(argv=None, interrupts: Optional[_Interrupts] = None, owns_process: bool = False) -> int:
  """The command with `argv` (default: `sys.argv[1:]`); returns its exit status.
  `entry` passes `interrupts` and `owns_process` (set the collector around imports)."""
  from tff_fedadamom import session

  # The command's own process, before TensorFlow is imported (the package
  # docstring says why; a value the user set is kept).
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  from tff_fedadamom.config import ConfigError

  args = build_parser().parse_args(argv)
  args.interrupts = interrupts if interrupts is not None else _Interrupts()
  args.owns_process = owns_process
  session.release_tff_at_exit()
  try:
    return args.fn(args)
  except ConfigError as e:
    print(f"config error: {e}", file=sys.stderr)
    return 2
  except (FileNotFoundError, OSError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  except KeyboardInterrupt:
    hint = ("add --resume to continue the sweep" if args.command == "tune"
            else "re-run the same command to resume from the last checkpoint")
    print(f"interrupted; {hint}", file=sys.stderr)
    return 130


def _exit_code(code) -> int:
  """`sys.exit`'s rule for an exit status: None is 0, a non-integer is printed and is 1."""
  if code is None:
    return 0
  if isinstance(code, int):
    return code
  print(code, file=sys.stderr)
  return 1


def entry() -> None:
  """The `tff-fedadamom` command: `main`, then a prompt exit.

  Python's normal exit ends with a full garbage collection, which TensorFlow's
  and TFF's heap makes cost seconds. The command's `finally` blocks have run by
  then, so the exit handlers run, the streams are flushed, and the process
  ends without the collection.
  """
  import atexit
  import contextlib
  import signal

  interrupts = _Interrupts()
  interrupts.install()
  try:
    code = _exit_code(main(interrupts=interrupts, owns_process=True))
  except SystemExit as e:  # SIGTERM (`_Interrupts`), or argparse's usage errors
    code = _exit_code(e.code)
  except KeyboardInterrupt:  # a Ctrl-C raised again after `main` returned
    code = 130
  signal.setitimer(signal.ITIMER_REAL, 0)  # a re-raise not yet due is moot now
  atexit._run_exitfuncs()  # noqa: SLF001 - what interpreter shutdown would run
  for stream in (sys.stdout, sys.stderr):
    with contextlib.suppress(OSError, ValueError):  # a closed pipe: nothing left to say
      stream.flush()
  os._exit(code)


if __name__ == "__main__":
  entry()
