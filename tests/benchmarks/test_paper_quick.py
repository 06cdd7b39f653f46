"""End to end: `python -m benchmarks.paper.reproduce --quick` writes a unit file per
trial and run, a report whose tables hold numbers, its plots, and results.json; a
rerun loads the stored units and runs only a missing one; --report-only rebuilds
the report from the units."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from tff_fedadamom.metric_names import DROPPED, MAX_STALENESS, MEAN_STALENESS, VIRTUAL_TIME

from benchmarks.paper import plan
from benchmarks.paper import report_format
from benchmarks.paper import units

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLOTS = ("fmnist_curves.png", "shakespeare_curves.png", "beta2.png", "escape.png",
         "heterogeneity.png", "async_curves.png")
SECTIONS = ("## 1. Equal-budget comparison on Fashion-MNIST",
            "## 2. Equal-budget comparison on Shakespeare",
            "## 3. FedAdamom beta_2 sensitivity",
            "## 4. Escape from sharp minima",
            "## 5. Heterogeneity: FedAdamom - FedAdam",
            "## 6. Asynchronous training (FedBuff)")
NUMBER = re.compile(r"[-+]?\d+(\.\d+)?(e[-+]?\d+)?")
# Hang protection for the first run, below the suite's per-test limit (900 s in
# .ci/run); a heavily shared machine may need longer (every unit pays a TFF
# set-up, which slows down with the machine's load: 12.4 min at load average 7).
TIMEOUT_S = float(os.environ.get("PAPER_QUICK_TIMEOUT_S", "840"))


def _run(out_dir, timeout, *extra):
  """Runs the quick reproduction in its own process group: on a timeout the whole
  group is killed, the pool workers it spawned included (killing `reproduce`
  alone would leave them running)."""
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
  proc = subprocess.Popen(
      [sys.executable, "-m", "benchmarks.paper.reproduce", "--quick", "--out", str(out_dir),
       *extra],
      cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
      start_new_session=True)
  try:
    stdout, stderr = proc.communicate(timeout=timeout)
  except subprocess.TimeoutExpired:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()
    raise
  # Nothing it started outlives it: not a pool worker, not multiprocessing's
  # resource tracker.
  try:
    os.killpg(proc.pid, 0)
  except ProcessLookupError:
    pass
  else:
    os.killpg(proc.pid, signal.SIGKILL)
    raise AssertionError("a process of the reproduction outlived it")
  return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def record_of(out, name):
  return json.loads((out / "results" / f"{name}.json").read_text())


def _tables(markdown):
  """Every markdown table as a list of rows (header first), separator rows dropped."""
  tables, current = [], []
  for line in markdown.splitlines():
    if line.startswith("|"):
      cells = [c.strip() for c in line.strip().strip("|").split("|")]
      if not all(set(c) <= set("-: ") for c in cells):
        current.append(cells)
    elif current:
      tables.append(current)
      current = []
  if current:
    tables.append(current)
  return tables


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
  """The quick study with one worker: its units run in its own process. (The
  rerun below runs its one unit in a spawned worker of the default pool, and
  checks that unit's result against this run's.)"""
  out = tmp_path_factory.mktemp("paper-quick")
  started = time.monotonic()
  proc = _run(out, TIMEOUT_S, "--workers", "1")
  elapsed = time.monotonic() - started
  assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
  return out, proc, elapsed


def test_report_plots_and_results(quick_run):
  out, proc, elapsed = quick_run
  report = (out / "REPORT.md").read_text()
  for section in SECTIONS:
    assert section in report
  assert "Not run yet" not in report
  # Its units ran in its own process, which logs TensorFlow's errors only, as a
  # worker does (the escape study traces its rounds once per optimizer).
  assert "WARNING:tensorflow" not in proc.stderr, proc.stderr[-2000:]
  for name in PLOTS:
    path = out / "plots" / name
    assert path.exists() and path.stat().st_size > 5000, name
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"plots/{name}" in report
  results = json.loads((out / "results.json").read_text())
  assert set(results["results"]) == {"fmnist", "shakespeare", "beta2", "escape", "hetero",
                                     "async"}
  assert "## Incomplete" not in report
  # Every comparison states its chance accuracy, computed from its test set.
  comparisons = [*results["results"]["fmnist"].values(), results["results"]["shakespeare"],
                 *results["results"]["async"].values()]
  chances = [c["setup"]["chance_accuracy"] for c in comparisons]
  assert chances[0] == chances[-1] == 0.1 and 0.1 < chances[len(plan.QUICK.partitions)] < 0.3
  assert all(isinstance(row["failed"], int) for c in comparisons for row in c["table"].values())
  assert "- Methods: FedAvg, FedAdamom (this budget's subset).\n" in report
  # The report is results.json rendered, the run's timings included.
  from benchmarks.paper import report as report_lib

  assert report_lib.render(results) == report
  assert results["timings"]["mode"] == "quick"
  assert f"- wall time: {results['timings']['wall time']}\n" in report


def test_every_table_holds_numbers(quick_run):
  out, _, _ = quick_run
  tables = _tables((out / "REPORT.md").read_text())
  # Studies 1 (one table per partition), 2, 3, 4 (escape times and fits), 5 and 6
  # (one table per spread).
  spreads = len(plan.QUICK.async_spreads)
  assert len(tables) >= len(plan.QUICK.partitions) + 5 + spreads
  for table in tables:
    header, rows = table[0], table[1:]
    assert rows, header
    for row in rows:
      assert len(row) == len(header), (header, row)
      numeric = [c for c in row[1:] if NUMBER.search(c)]
      assert numeric, f"row without numbers: {row}"
  # The accuracy columns of the comparison tables are numbers (not '-').
  comparisons = [t for t in tables if t[0][0] == "optimizer" and "final acc (%)" in t[0]]
  assert len(comparisons) == len(plan.QUICK.partitions) + 1 + spreads
  # Fashion-MNIST: every method, the new baselines included, with its communication
  # per round; Shakespeare and asynchronous steps: the quick budget's two, in the
  # report's order.
  methods = ([plan.OPTIMIZERS] * len(plan.QUICK.partitions) + [plan.QUICK.shakespeare_methods]
             + [plan.QUICK.async_methods] * spreads)
  assert plan.QUICK.shakespeare_methods == ("fedavg", "fedadamom")
  for table, planned in zip(comparisons, methods, strict=True):
    assert [row[0] for row in table[1:]] == [report_format.name(o) for o in planned]
    comm = {row[0]: row[table[0].index("communication per round")] for row in table[1:]}
    assert comm["FedAvg"] == "1x" and comm.get("FedAdamom", "1x") == "1x"
    if "FedCAda" in comm:
      assert comm["FedCAda"] == "3x" and comm["FAFED"] == "3x"
    col = table[0].index("final acc (%)")
    for row in table[1:]:
      assert re.match(r"^\d+\.\d+( ± \d+\.\d+)?$", row[col]), row


def test_every_method_has_its_unit_files(quick_run):
  out, _, _ = quick_run
  sweeps = {f"fmnist-{p}": plan.OPTIMIZERS for p in plan.QUICK.partitions}
  sweeps["shakespeare"] = plan.QUICK.shakespeare_methods
  sweeps.update({f"async-{plan.async_label(s)}": plan.QUICK.async_methods
                 for s in plan.QUICK.async_spreads})
  for sweep, methods in sweeps.items():
    assert sorted(os.listdir(out / "results" / "tune" / sweep)) == sorted(methods)
    for opt in methods:
      record = json.loads((out / "results" / "tune" / sweep / opt / "trial0.json").read_text())
      assert record["spec"]["server"]["optimizer"] == opt
      assert set(record["fingerprints"]) == {opt} and record["wall_time_s"] > 0
      assert record["result"]["status"] == "completed"
  # An asynchronous unit keeps every server step's staleness; a synchronous one has none.
  for sigma in plan.QUICK.async_spreads:
    record = json.loads((out / "results" / "tune" / f"async-{plan.async_label(sigma)}"
                         / "fadas" / "trial0.json").read_text())
    assert record["spec"]["asynchronous"]["durations"]["sigma"] == sigma
    steps = record["result"]["async_history"]
    assert len(steps) == record["result"]["rounds_completed"]
    assert {VIRTUAL_TIME, MEAN_STALENESS, MAX_STALENESS, DROPPED} <= set(steps[0])
  assert "async_history" not in record_of(out, "tune/fmnist-dir0.3/fadas/trial0")["result"]
  escape = json.loads((out / "results" / "escape" / "study.json").read_text())
  assert set(escape["fingerprints"]) == {"fedavgm", "fedadam", "fedadamom"}


def test_rerun_runs_only_the_missing_unit(quick_run):
  out, _, elapsed = quick_run
  before = (out / "results.json").read_text()
  # A unit that ran on the parts of the two before it (one structure: FedAdamom,
  # beta_2 held in the state) in the study's own process.
  missing = out / "results" / "beta2" / "dir0.3" / "b0.3" / "seed0.json"
  stored = json.loads(missing.read_text())
  missing.unlink()
  started = time.monotonic()
  proc = _run(out, TIMEOUT_S / 2)
  assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
  assert ("tuning shakespeare, fmnist-dir0.3, async-sigma1.5 (and escape/study): all 15 "
          "units stored") in proc.stdout
  assert re.search(r"runs: 1 of \d+ units to run", proc.stdout), proc.stdout[-3000:]
  assert time.monotonic() - started < max(120.0, 0.75 * elapsed)
  assert "(quick, 2 workers)" in proc.stdout
  assert os.listdir(out / "cache" / "logs")  # its worker's log: the unit ran in the pool
  rerun = json.loads(missing.read_text())
  assert rerun["key"] == stored["key"]
  # A spawned worker, building its own parts, gives the unit the numbers the
  # study's own process gave it.
  assert units.comparable(rerun["result"]) == units.comparable(stored["result"])
  after = json.loads((out / "results.json").read_text())
  assert after["results"] == json.loads(before)["results"]


def test_report_only_reads_the_units(quick_run, capsys):
  """In this process: --report-only runs nothing, so it starts no process."""
  from benchmarks.paper import reproduce

  out, _, _ = quick_run
  before = json.loads((out / "results.json").read_text())
  (out / "REPORT.md").unlink()
  assert reproduce.main(["--quick", "--out", str(out), "--report-only"]) == 0
  assert "units to run" not in capsys.readouterr().out
  after = json.loads((out / "results.json").read_text())
  assert after["results"] == before["results"]
  from benchmarks.paper import report as report_lib

  assert (out / "REPORT.md").read_text() == report_lib.render(after)
