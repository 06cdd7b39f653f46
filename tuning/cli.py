"""The `tune` and `export` subcommands, added to the project's CLI parser.

    tff-fedadamom tune SWEEP.yaml [--set KEY=VALUE ...] [--resume] [--smoke-test]
                       [--progress-every S] [--no-reuse]
    tff-fedadamom export SWEEP_DIR

Both import Ray only when they run. Exit codes: 0 done, 2 invalid sweep or
directory, 130 interrupted."""

from __future__ import annotations

import argparse
import sys


def _cmd_tune(args) -> int:
  from tff_fedadamom.config import ConfigError
  from tff_fedadamom.session import startup_imports
  from tuning import schema
  from tuning.errors import SweepError

  try:
    # The driver's imports (Ray Tune; TensorFlow and TFF, which validating the
    # base experiment imports) are frozen out of the collector's walks.
    with startup_imports(args.owns_process):
      from tuning.sweep import run_sweep

      sweep = schema.load_sweep(args.sweep, overrides=args.overrides)
    result = run_sweep(sweep, resume=args.resume, smoke_test=args.smoke_test,
                       progress_interval_s=args.progress_every,
                       reuse_actors=not args.no_reuse)
  except ConfigError as e:  # the sweep file's (SweepConfigError) or an override's
    print(f"sweep config error: {e}", file=sys.stderr)
    return 2
  except SweepError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  if result.interrupted:
    return 130
  print(f"sweep directory: {result.sweep_dir}")
  for optimizer, best in result.export.best.items():
    print(f"best {optimizer}: {best.config_path}")
  return 0


def _cmd_export(args) -> int:
  from tuning.errors import SweepConfigError, SweepError
  from tuning.export import export_sweep

  try:
    result = export_sweep(args.sweep_dir, plots=not args.no_plots)
  except (SweepConfigError, SweepError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  print(result.leaderboard_markdown)
  for path in result.files:
    print(f"wrote {path}")
  return 0


def add_tune_parser(subparsers) -> argparse.ArgumentParser:
  """Adds `tune SWEEP [--resume] [--smoke-test]` to an argparse subparsers object."""
  p = subparsers.add_parser(
      "tune", help="run a Ray Tune sweep over server optimizers (then export it)",
      description="Runs the sweep file's trials with Ray Tune, the same budget for every "
      "optimizer, and exports best configs, leaderboard and plots into the sweep directory.")
  p.add_argument("sweep", help="sweep YAML (see configs/sweeps/)")
  p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                 help="override a sweep value by dotted key, e.g. budget.rounds=4 or "
                 "optimizers=[fedadamom,fedadam]")
  p.add_argument("--resume", action="store_true",
                 help="continue an interrupted sweep; finished trials are not re-run")
  p.add_argument("--smoke-test", action="store_true",
                 help="one trial per optimizer, 2 rounds: check the whole path quickly")
  p.add_argument("--progress-every", type=float, default=30.0, metavar="SECONDS",
                 help="seconds between progress tables (default 30)")
  p.add_argument("--no-reuse", action="store_true",
                 help="start a new Tune actor for every trial instead of reusing actors, "
                 "which keep data and built processes between trials (same results, slower)")
  p.set_defaults(fn=_cmd_tune)
  return p


def add_export_parser(subparsers) -> argparse.ArgumentParser:
  """Adds `export SWEEP_DIR` to an argparse subparsers object."""
  p = subparsers.add_parser(
      "export", help="best configs, leaderboard and plots of a sweep directory")
  p.add_argument("sweep_dir", help="<storage_path>/<sweep name>")
  p.add_argument("--no-plots", action="store_true", help="skip the matplotlib plots")
  p.set_defaults(fn=_cmd_export)
  return p


def main(argv=None, owns_process: bool = False) -> int:
  """`python -m tuning.cli tune ...` / `export ...` (the same as tff-fedadamom's).
  `owns_process`: the caller is this process's entry point (`__main__`), so
  `tune` may set the garbage collector around its imports, as the command does."""
  parser = argparse.ArgumentParser(prog="python -m tuning.cli")
  sub = parser.add_subparsers(dest="command", required=True)
  add_tune_parser(sub)
  add_export_parser(sub)
  args = parser.parse_args(argv)
  args.owns_process = owns_process
  try:
    return args.fn(args)
  except KeyboardInterrupt:
    print("interrupted; continue with --resume", file=sys.stderr)
    return 130


if __name__ == "__main__":
  sys.exit(main(owns_process=True))
