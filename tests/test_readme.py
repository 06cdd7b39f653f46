"""The README is a manual that runs: each of its ```python and ```bash/```sh
blocks is run as a user would run it, and its methods table is the registry's.

A python block runs in a fresh `python` process, a shell block under
`bash -euo pipefail`, each from a temporary working directory holding the
repository's `configs/` (so `runs/` lands there, not in the checkout), with the
project importable as an installed user has it and `tff-fedadamom` on the PATH.
A block fails on a non-zero exit, or on "Traceback" or "Exception ignored" in
what it prints, or when a process it started outlives it.

The blocks run cheaper than written, by the visible rules below (2 rounds of 2
clients, `--smoke-test`); every rule must apply to some block, so a README edit cannot
turn one into a silent full-length run. Set-up blocks (`make run`, `make test`,
activating the environment) are shown, not run: they install the project.

Cheaper checks keep the docs from rotting: the README's size, its methods table
against `tff_fedadamom.methods`, every config and sweep field named in
docs/configs.md and docs/sweeps.md, links that resolve, and no sentence tied to
one run or measurement. `python -m tests.test_readme` prints the methods table
as the registry has it (sources carried over from the README).
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import time
import uuid

import pytest

from tests import process_table
from tests.helpers import ROOT

pytestmark = pytest.mark.readme

README = os.path.join(ROOT, "README.md")
DOCS = os.path.join(ROOT, "docs")
README_LIMIT_BYTES = 15_000
BLOCK_TIMEOUT_S = 900
# How long a block's processes may take to end after it exits (Ray's shut down asynchronously).
LEFTOVER_GRACE_S = 20.0

_FENCE = re.compile(r"^```([\w-]*)[ \t]*\n(.*?)^```[ \t]*$", re.M | re.S)
RUNNABLE = {"python": "python", "bash": "shell", "sh": "shell"}

# A shell block whose every command starts with one of these is set-up: shown, never run.
SETUP_COMMANDS = ("make ", "git clone ", "source .venv/bin/activate", "cd ")

# Rules that make the README's commands cheap: an experiment runs 2 rounds of 2 clients
# (the shipped configs' own rounds and clients are a real experiment's), a sweep its
# `--smoke-test` of two methods, a server optimizer and a learning process (a trial of
# each kind of method). Python: (text, replacement).
CHEAP_RUN = ("rounds=2", "clients_per_round=2")
PYTHON_OVERRIDES = (
    ('load_config("configs/quickstart.yaml")',
     f'load_config("configs/quickstart.yaml", overrides={list(CHEAP_RUN)!r})'),
)
# Shell: (a command line's start, what is added to the command).
SHELL_LINE_OVERRIDES = (
    (re.compile(r"^tff-fedadamom (run|compare) configs/"),
     "".join(f" --set {item}" for item in CHEAP_RUN)),
    (re.compile(r"^tff-fedadamom tune "), " --smoke-test --set optimizers=[fedadamom,fafed]"),
)
# Shell: (pattern, replacement). `--smoke-test` names its sweep `<name>-smoke`, so the
# commands that read the sweep's directory follow it there.
SHELL_TEXT_OVERRIDES = (
    (re.compile(r"runs/sweeps/quickstart\b(?!-)"), "runs/sweeps/quickstart-smoke"),
)


@dataclasses.dataclass(frozen=True)
class Block:
  kind: str  # "python" or "shell"
  code: str
  line: int  # of the opening fence, 1-based

  @property
  def id(self) -> str:
    return f"{self.kind}-line{self.line}"


def _read(path):
  with open(path, encoding="utf-8") as f:
    return f.read()


def readme_blocks(text: str) -> list[Block]:
  """The README's python and shell blocks, in order."""
  blocks = []
  for match in _FENCE.finditer(text):
    kind = RUNNABLE.get(match.group(1))
    if kind is not None:
      blocks.append(Block(kind, match.group(2), text.count("\n", 0, match.start()) + 1))
  return blocks


def _commands(code: str) -> list[str]:
  return [line.strip() for line in code.splitlines()
          if line.strip() and not line.strip().startswith("#")]


def is_setup(block: Block) -> bool:
  """A shell block of set-up commands only; one that mixes them with others is an error."""
  if block.kind != "shell":
    return False
  setup = [c.startswith(SETUP_COMMANDS) for c in _commands(block.code)]
  assert all(setup) or not any(setup), (
      f"README line {block.line}: a block mixes set-up commands ({SETUP_COMMANDS}) with "
      "commands to run; split it")
  return all(setup)


def _add_to_command(line: str, extra: str) -> str:
  """`line` with `extra` added before a trailing `# comment`, if any."""
  command, sep, comment = line.partition("  #")
  return command.rstrip() + extra + (("  " + sep.strip() + comment) if sep else "")


def cheap(block: Block) -> tuple[str, set]:
  """The block's code with the override rules applied, and which rules applied."""
  used, code = set(), block.code
  if block.kind == "python":
    for i, (text, replacement) in enumerate(PYTHON_OVERRIDES):
      if text in code:
        code = code.replace(text, replacement)
        used.add(("python", i))
    return code, used
  lines = []
  for line in code.splitlines():
    for i, (start, extra) in enumerate(SHELL_LINE_OVERRIDES):
      if start.match(line.strip()):
        line = _add_to_command(line, extra)
        used.add(("line", i))
    lines.append(line)
  code = "\n".join(lines) + "\n"
  for i, (pattern, replacement) in enumerate(SHELL_TEXT_OVERRIDES):
    code, n = pattern.subn(replacement, code)
    if n:
      used.add(("text", i))
  return code, used


BLOCKS = readme_blocks(_read(README))
RUN_BLOCKS = [b for b in BLOCKS if not is_setup(b)]


# ------------------------------------------------------------------ running the blocks


def _environment(tmp_path, marker: str) -> dict:
  """The user's environment (with the test session's caches), the project importable,
  `python` and `tff-fedadamom` on the PATH, and `marker` to find the block's processes."""
  env = dict(os.environ)
  env["PYTHONPATH"] = os.pathsep.join([ROOT] + [p for p in [env.get("PYTHONPATH")] if p])
  bin_dir = os.path.dirname(sys.executable)
  if not os.path.exists(os.path.join(bin_dir, "tff-fedadamom")):
    bin_dir = str(tmp_path / "bin")
    os.makedirs(bin_dir, exist_ok=True)
    shim = os.path.join(bin_dir, "tff-fedadamom")
    with open(shim, "w", encoding="utf-8") as f:
      f.write(f'#!/bin/sh\nexec "{sys.executable}" -m tff_fedadamom "$@"\n')
    os.chmod(shim, 0o755)
    os.symlink(sys.executable, os.path.join(bin_dir, "python"))
  env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
  env["TFF_FEDADAMOM_README_BLOCK"] = marker
  return env


def _marked(marker: str) -> list[int]:
  """The running processes whose environment carries `marker`."""
  tag = f"TFF_FEDADAMOM_README_BLOCK={marker}".encode()
  return process_table.still_running(
      [pid for pid in process_table.pids() if tag in (process_table.environ(pid) or ())])


def _leftovers(marker: str) -> list[int]:
  """The block's processes still running `LEFTOVER_GRACE_S` after it exited; ends them."""
  deadline = time.monotonic() + LEFTOVER_GRACE_S
  while (alive := _marked(marker)) and time.monotonic() < deadline:
    time.sleep(0.5)
  for pid in alive:
    try:
      os.kill(pid, 9)  # started by this block: end it so it does not outlive the test
    except OSError:
      pass
  return alive


def _run(argv, cwd, env) -> tuple[int, str]:
  proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, start_new_session=True)
  try:
    out, _ = proc.communicate(timeout=BLOCK_TIMEOUT_S)
  except subprocess.TimeoutExpired:
    os.killpg(proc.pid, 9)
    out, _ = proc.communicate()
    pytest.fail(f"timed out after {BLOCK_TIMEOUT_S} s:\n{out[-5000:]}")
  return proc.returncode, out


@pytest.mark.parametrize("block", RUN_BLOCKS, ids=[b.id for b in RUN_BLOCKS])
def test_block_runs(block, tmp_path):
  """The block runs to its end and prints no traceback; nothing it started outlives it."""
  os.symlink(os.path.join(ROOT, "configs"), tmp_path / "configs")
  code, _ = cheap(block)
  marker = uuid.uuid4().hex
  env = _environment(tmp_path, marker)
  if block.kind == "python":
    (tmp_path / "block.py").write_text(code, encoding="utf-8")
    argv = [sys.executable, "block.py"]
  else:
    (tmp_path / "block.sh").write_text(code, encoding="utf-8")
    argv = ["bash", "-euo", "pipefail", "block.sh"]
  started = time.monotonic()
  returncode, out = _run(argv, str(tmp_path), env)
  took = time.monotonic() - started
  leftovers = _leftovers(marker)
  where = f"README line {block.line} ({took:.0f} s), as run:\n{code}\n--- output ---\n"
  assert returncode == 0, where + out[-8000:]
  for bad in ("Traceback", "Exception ignored"):
    assert bad not in out, where + out[-8000:]
  assert not leftovers, where + f"processes outlived the block: {leftovers}"


def test_every_override_applies():
  """Each cheapening rule matches some block (a rule that matches none would let a
  block run at full length), and set-up blocks are only set-up."""
  used = set().union(*(cheap(b)[1] for b in RUN_BLOCKS))
  rules = ([("python", i) for i in range(len(PYTHON_OVERRIDES))]
           + [("line", i) for i in range(len(SHELL_LINE_OVERRIDES))]
           + [("text", i) for i in range(len(SHELL_TEXT_OVERRIDES))])
  assert [r for r in rules if r not in used] == []
  assert any(is_setup(b) for b in BLOCKS), "the README shows its set-up commands"
  assert {b.kind for b in RUN_BLOCKS} == {"python", "shell"}


def test_override_rules_rewrite_as_meant():
  block = Block("shell", "tff-fedadamom run configs/x.yaml  # a run\n"
                "tff-fedadamom tune configs/sweeps/quickstart.yaml\n"
                "tff-fedadamom export runs/sweeps/quickstart\n"
                "tff-fedadamom run runs/sweeps/quickstart/best/fedavg.yaml\n", 1)
  assert cheap(block)[0].splitlines() == [
      "tff-fedadamom run configs/x.yaml --set rounds=2 --set clients_per_round=2  # a run",
      "tff-fedadamom tune configs/sweeps/quickstart.yaml --smoke-test "
      "--set optimizers=[fedadamom,fafed]",
      "tff-fedadamom export runs/sweeps/quickstart-smoke",
      "tff-fedadamom run runs/sweeps/quickstart-smoke/best/fedavg.yaml"]
  with pytest.raises(AssertionError, match="mixes set-up"):
    is_setup(Block("shell", "make run\ntff-fedadamom run configs/x.yaml\n", 1))


# ------------------------------------------------------------------ the methods table

TABLE_HEADER = "| name | method | kind | hparams (defaults) | source of the defaults |"


def _number(value) -> str:
  """A default as the table writes it: YAML's true/false, numbers as `g` does, 1e-8 not 1e-08."""
  if isinstance(value, bool):
    return "true" if value else "false"
  return re.sub(r"e([+-])0*(\d)", lambda m: "e" + m.group(1).replace("+", "") + m.group(2),
                format(value, "g"))


def registry_rows() -> list[list[str]]:
  """The table's first four columns, from `tff_fedadamom.methods`."""
  from tff_fedadamom import methods

  rows = []
  for name, spec in methods.OPTIMIZERS.items():
    kind = ("server optimizer" if spec.kind == methods.SERVER_OPTIMIZER else
            f"learning process, {spec.communication:g}x FedAvg's communication")
    hparams = ", ".join(f"{k} {_number(v)}" for k, v in spec.defaults.items())
    rows.append([f"`{name}`", spec.display_name, kind, hparams])
  return rows


def readme_table_rows(text: str) -> list[list[str]]:
  lines = text.splitlines()
  assert TABLE_HEADER in lines, f"the README's methods table starts with {TABLE_HEADER!r}"
  rows = []
  for line in lines[lines.index(TABLE_HEADER) + 2:]:
    if not line.startswith("|"):
      break
    rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
  return rows


def expected_table(text: str) -> str:
  """The table as the registry has it, each row's source carried over from `text`."""
  sources = {row[0]: row[-1] for row in readme_table_rows(text) if len(row) == 5}
  lines = [TABLE_HEADER, "|---|---|---|---|---|"]
  for row in registry_rows():
    lines.append("| " + " | ".join(row + [sources.get(row[0], "")]) + " |")
  return "\n".join(lines)


def test_methods_table_is_the_registrys():
  text = _read(README)
  rows = readme_table_rows(text)
  hint = "\nThe registry's table (python -m tests.test_readme):\n" + expected_table(text)
  assert [row[:4] for row in rows] == registry_rows(), hint
  assert all(len(row) == 5 and row[4] for row in rows), "every row names its source" + hint


def test_formats_defaults_as_the_table_does():
  assert [_number(v) for v in (1.0, 0.05, 1e-3, 1e-08, 0.0, 0.999, True, 3)] == [
      "1", "0.05", "0.001", "1e-8", "0", "0.999", "true", "3"]


# ------------------------------------------------------------------ the docs


def test_readme_is_short():
  assert os.path.getsize(README) < README_LIMIT_BYTES


def _doc_texts():
  paths = [README] + sorted(os.path.join(DOCS, n) for n in os.listdir(DOCS) if n.endswith(".md"))
  return {os.path.relpath(p, ROOT): _read(p) for p in paths}


def test_links_resolve():
  """Every relative link of the README and docs/ names a file or folder that exists."""
  missing = []
  for rel, text in _doc_texts().items():
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
      if "://" in target:
        continue
      if not os.path.exists(os.path.join(ROOT, os.path.dirname(rel), target)):
        missing.append(f"{rel}: {target}")
  assert missing == []


# Sentences tied to one run, day or machine, and measured figures (decimal durations,
# sizes, ratios): those live in generated files (benchmarks/RESULTS.md, the paper's REPORT.md).
RUN_SPECIFIC = re.compile(
    r"this landing|\blanding\b|\b(later|slower|faster|earlier),? (slower |faster )?day\b"
    r"|\bin runs? \d|\breference machine\b|\bat this version\b"
    r"|\b\d+\.\d+ ?(ms|s|min|MB|GB)\b|\b\d+\.\d+x\b|\b\d+\.\d+%", re.I)


def test_no_run_specific_sentences():
  found = [f"{rel}: {m.group(0)!r}" for rel, text in _doc_texts().items()
           for m in RUN_SPECIFIC.finditer(text)]
  assert found == []


def test_run_specific_pattern_catches_what_it_means():
  for bad in ("as of this landing", "on a later, slower day", "in run 30", "took 1.9 s",
              "1.86x the trials", "52.5% saved", "784.6 MB"):
    assert RUN_SPECIFIC.search(bad), bad
  for fine in ("2 GB", "rounds: 30", "--smoke-test runs 2 rounds", "beta_2 0.05"):
    assert not RUN_SPECIFIC.search(fine), fine


def _mentioned(text: str, names) -> list[str]:
  return [n for n in names if f"`{n}`" not in text]


def test_configs_doc_names_every_field_and_registry_name():
  from tff_fedadamom.config import schema
  from tff_fedadamom.data import DATASETS, PARTITIONERS
  from tff_fedadamom.models import MODELS
  from tff_fedadamom.optimizers import schedules

  text = _read(os.path.join(DOCS, "configs.md"))
  fields = [f.name for f in dataclasses.fields(schema.ExperimentConfig)
            if f.name not in schema.SECTIONS]
  for section, cls in schema.SECTIONS.items():
    fields += [f"{section}.{f.name}" for f in dataclasses.fields(cls) if f.name != "hparams"]
  names = list(DATASETS) + list(PARTITIONERS) + list(MODELS) + list(schedules.SCHEDULES)
  options = {o for registry in (DATASETS, PARTITIONERS, MODELS) for spec in registry.values()
             for o in spec.options}
  options |= {o for spec in schedules.SCHEDULES.values() for o in spec.defaults}
  assert _mentioned(text, fields + names + sorted(options)) == []


def test_sweeps_doc_names_every_field():
  from tuning import schema

  text = _read(os.path.join(DOCS, "sweeps.md"))
  sections = {"budget": schema.Budget, "search": schema.Search, "scheduler": schema.Scheduler,
              "metric": schema.Metric, "resources": schema.Resources}
  fields = [key for key in schema.TOP_LEVEL if key not in sections]
  for section, cls in sections.items():
    fields += [f"{section}.{f.name}" for f in dataclasses.fields(cls)]
  kinds = list(schema.SEARCH_KINDS) + list(schema.SCHEDULER_KINDS) + list(schema.METRICS)
  assert _mentioned(text, fields + kinds) == []


if __name__ == "__main__":
  print(expected_table(_read(README)))
