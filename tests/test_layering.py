"""The project's structure: layers that import only downward, small modules, and
imports that change nothing process-wide.

Layers, lowest first: the ground (data, models and the small shared modules),
optimizers, the learning processes of `algorithms`, the registry of methods
above both, config, the plan and TFF process a config builds, the runtime that
runs a process's rounds, the experiment around them, the CLI, then the sweep
layer `tuning`. A module may import its own layer and
those below it, never one above. The CLI alone may reach `tuning`, and only
inside a function (it adds the `tune`/`export` subcommands when it runs).
Imports are read with `ast`, so a lazy import inside a function counts too.
docs/DESIGN.md lists the layers and each concept's home; the tests below hold
the code to it.
"""

import ast
import os
import re
import subprocess
import sys
import typing

from tests.helpers import ROOT as REPO
from tests.helpers import PACKAGES, package_modules

# Module-name prefix -> layer; the longest matching prefix decides.
LAYERS = {
    "tff_fedadamom": 0,  # the package itself (its exports are lazy) and the shared modules
    "tff_fedadamom.data": 0,
    "tff_fedadamom.models": 0,
    "tff_fedadamom.optimizers": 1,
    "tff_fedadamom.algorithms": 2,
    "tff_fedadamom.methods": 3,
    "tff_fedadamom.config": 4,
    "tff_fedadamom.experiment.plan": 5,
    "tff_fedadamom.experiment.process": 5,
    "tff_fedadamom.runtime": 6,
    "tff_fedadamom.experiment": 7,
    "tff_fedadamom.cli": 8,
    "tff_fedadamom.__main__": 8,
    "tuning": 9,
}
# (importer, imported prefix): allowed upward, only from inside a function.
LAZY_UPWARD = {("tff_fedadamom.cli", "tuning")}
MAX_LINES = 400
MAX_FUNCTION_LINES = 60  # docstring excluded


def _layer(module: str) -> int:
  best = max((p for p in LAYERS if module == p or module.startswith(p + ".")), key=len)
  return LAYERS[best]


def _is_type_checking(node) -> bool:
  """`if TYPE_CHECKING:` (or `typing.TYPE_CHECKING`): imports for annotations only."""
  test = getattr(node, "test", None)
  return isinstance(node, ast.If) and (
      (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
      or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


class Import(typing.NamedTuple):
  name: str  # a module, or a name in one (`from a import b` gives a and a.b)
  line: int
  lazy: bool  # inside a function
  type_only: bool  # under `if TYPE_CHECKING:`, never run
  whole: bool  # the name itself is bound (not the `a` of `from a import b`)


def _imports(module: str, path: str) -> list[Import]:
  """Each project import of the module at `path`."""
  with open(path) as f:
    tree = ast.parse(f.read(), path)
  package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
  found = []

  def visit(node, in_function, type_only):
    for child in ast.iter_child_nodes(node):
      lazy = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
      bases = set()
      if isinstance(child, ast.Import):
        names = [a.name for a in child.names]
      elif isinstance(child, ast.ImportFrom):
        base = child.module or ""
        if child.level:
          parts = package.split(".")[:len(package.split(".")) - child.level + 1]
          base = ".".join(parts + ([child.module] if child.module else []))
        # `from a import b` may import module a.b: count both names.
        names = [base] + [f"{base}.{a.name}" for a in child.names]
        bases = {base}
      else:
        if _is_type_checking(child):
          visit(ast.Module(body=child.body, type_ignores=[]), lazy, True)
          visit(ast.Module(body=child.orelse, type_ignores=[]), lazy, type_only)
        else:
          visit(child, lazy, type_only)
        continue
      for name in names:
        if name.split(".")[0] in PACKAGES:
          found.append(Import(name, child.lineno, in_function, type_only,
                              name not in bases))
  visit(tree, False, False)
  return found


def _violations():
  out = []
  for module, path in package_modules():
    for imported, line, lazy, _, _ in _imports(module, path):
      if _layer(imported) <= _layer(module):
        continue
      allowed = any(module == m and (imported == p or imported.startswith(p + "."))
                    for m, p in LAZY_UPWARD)
      if allowed and lazy:
        continue
      out.append(f"{os.path.relpath(path, REPO)}:{line} imports {imported}")
  return out


def test_the_import_scan_sees_the_known_imports():
  """The scan itself works: known imports of each kind are found."""
  imports = dict(package_modules())
  cli = {(i.name, i.lazy) for i in _imports("tff_fedadamom.cli", imports["tff_fedadamom.cli"])}
  assert ("tuning.cli", True) in cli  # lazy, inside build_parser
  checks = {(i.name, i.type_only) for i in _imports("tuning.checks", imports["tuning.checks"])}
  assert ("tuning.space", False) in checks
  sweep = {i.name for i in _imports("tuning.sweep", imports["tuning.sweep"])}
  assert "tuning.joint" in sweep
  assert _layer("tff_fedadamom.experiment.runner") == 7
  assert _layer("tff_fedadamom.experiment.plan") == 5 < _layer("tff_fedadamom.runtime.ray") == 6
  assert _layer("tff_fedadamom.naming") == 0 and _layer("tuning.sweep") == 9


def test_nothing_imports_upward():
  assert _violations() == []


def _lazy_exports(path: str) -> dict[str, str]:
  """A package's lazy exports (`_EXPORTS = {name: module}`, see
  `tff_fedadamom.lazy`): what using each name imports."""
  with open(path) as f:
    tree = ast.parse(f.read(), path)
  for node in tree.body:
    if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == [
        "_EXPORTS"]:
      return ast.literal_eval(node.value)
  return {}


def _import_graph() -> dict[str, set]:
  """Module -> the project modules that importing it runs, functions included,
  `TYPE_CHECKING` blocks excluded.

  Importing `a.b.c` runs the package `a.b` (its `__init__`) first, so an import
  also points at each package above the imported module, except the packages
  the importer itself sits in (they are already being imported). A package
  with lazy exports imports their modules only when a name is used: `from P
  import name` points at the module of `name`; `import P` (or `from a import
  P`) at all of them, as any may be used.
  """
  paths = dict(package_modules())
  exports = {m: _lazy_exports(p) for m, p in paths.items() if p.endswith("__init__.py")}
  graph = {}
  for module, path in paths.items():
    own = {module.rsplit(".", k)[0] for k in range(module.count(".") + 1)}
    edges = set()
    for name, _, _, _, whole in _imports(module, path):
      package, _, attribute = name.rpartition(".")
      if attribute in exports.get(package, {}):
        edges.add(exports[package][attribute])
      if name not in paths:
        continue
      parts = name.split(".")
      edges.update(".".join(parts[:k]) for k in range(1, len(parts) + 1))
      if whole:
        edges.update(exports.get(name, {}).values())
    graph[module] = {m for m in edges if m in paths and m not in own}
  return graph


def import_cycles(graph: dict[str, set]) -> list[list[str]]:
  """The import cycles of `graph`: its strongly connected components with more
  than one module (Tarjan's algorithm), each sorted, the list sorted."""
  index, low, stack, on_stack, out = {}, {}, [], set(), []

  def connect(node):
    index[node] = low[node] = len(index)
    stack.append(node)
    on_stack.add(node)
    for nxt in sorted(graph.get(node, ())):
      if nxt not in index:
        connect(nxt)
        low[node] = min(low[node], low[nxt])
      elif nxt in on_stack:
        low[node] = min(low[node], index[nxt])
    if low[node] == index[node]:
      component = []
      while True:
        member = stack.pop()
        on_stack.discard(member)
        component.append(member)
        if member == node:
          break
      if len(component) > 1:
        out.append(sorted(component))

  for node in sorted(graph):
    if node not in index:
      connect(node)
  return sorted(out)


# Cycles known and being removed; delete an entry once its cycle is gone.
KNOWN_CYCLES = []


def test_import_cycles_are_found():
  graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a", "e"}, "e": {"d"}, "f": {"f"}}
  assert import_cycles(graph) == [["a", "b", "c"], ["d", "e"]]
  assert import_cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
  graph = _import_graph()
  # A lazy import counts, and so does the package it passes through.
  assert "tff_fedadamom.experiment.plan" in graph["tff_fedadamom.experiment.process"]
  assert "tff_fedadamom.config" in graph["tff_fedadamom.experiment.compare"]
  assert "tff_fedadamom.experiment" not in graph["tff_fedadamom.experiment.compare"]
  assert "tuning.schema" in graph["tuning.sweep"] and "tuning.schema" not in graph["tuning.space"]
  # Lazy exports: a used name imports its module; a submodule, not the exports.
  assert "tuning.sweep" in graph["tuning.cli"]  # `from tuning.sweep import run_sweep`
  assert "tff_fedadamom.methods" in graph["tff_fedadamom.config.validate"]
  assert "tff_fedadamom.methods" not in graph[
      "tff_fedadamom.algorithms._common"]


def test_no_import_cycles():
  """No module imports one that imports it back, in either package, counting
  imports inside functions (they run too, only later) and TYPE_CHECKING
  blocks (a circle of types is a circle of concepts). The root packages' exports are lazy (`__getattr__`), so they import
  nothing and close no cycle."""
  cycles = import_cycles(_import_graph())
  assert [c for c in cycles if c not in KNOWN_CYCLES] == []


DESIGN = os.path.join(REPO, "docs", "DESIGN.md")


def _design_rows(heading: str) -> list[list[str]]:
  """The cells of the table under `## heading` in docs/DESIGN.md."""
  with open(DESIGN, encoding="utf-8") as f:
    section = f.read().split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
  rows = [line.strip().strip("|").split("|") for line in section.splitlines()
          if line.startswith("|")]
  return [[cell.strip() for cell in row] for row in rows[2:]]  # after header and rule


def _ticked(cell: str) -> list[str]:
  return re.findall(r"`([^`]+)`", cell)


def _definitions(path: str) -> dict[str, bool]:
  """Top-level names the module at `path` defines -> whether the definition is
  its own (a def, a class, a computed value) rather than an alias of a name
  defined elsewhere."""
  with open(path) as f:
    tree = ast.parse(f.read(), path)
  out = {}
  for node in tree.body:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
      out[node.name] = True
    elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
      own = not isinstance(node.value, (ast.Name, ast.Attribute))  # `X = other.X` aliases
      for target in (node.targets if isinstance(node, ast.Assign) else [node.target]):
        for name in ast.walk(target):
          if isinstance(name, ast.Name):
            out[name.id] = own
  return out


def test_the_design_notes_list_the_layers():
  documented = {}
  for layer, modules in _design_rows("Layers"):
    for module in _ticked(modules):
      documented[module] = int(layer)
  assert documented == LAYERS


def test_each_concept_has_the_one_home_the_design_notes_name():
  modules = dict(package_modules())
  definitions = {m: _definitions(p) for m, p in modules.items()}
  rows = _design_rows("Where each concept lives")
  assert len(rows) >= 10
  problems = []
  for _, home, names in rows:
    (path,) = _ticked(home)
    module = path[:-3].replace("/", ".")
    assert module in modules, path
    for name in _ticked(names):
      if not definitions[module].get(name):
        problems.append(f"{path} does not define {name}")
      problems += [f"{other} defines {name} again (home: {path})"
                   for other, names_there in definitions.items()
                   if other != module and names_there.get(name)]
  assert problems == []


def test_no_module_exceeds_the_size_limit():
  sizes = {m: sum(1 for _ in open(p)) for m, p in package_modules()}
  assert {m: n for m, n in sizes.items() if n > MAX_LINES} == {}


def _function_lengths(path: str):
  """(name, lines without the docstring) of every function in the file."""
  with open(path) as f:
    tree = ast.parse(f.read(), path)
  for node in ast.walk(tree):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
      first = node.body[0]
      docstring = (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                   and isinstance(first.value.value, str))
      skipped = first.end_lineno - first.lineno + 1 if docstring else 0
      yield node.name, node.end_lineno - node.lineno + 1 - skipped


def test_no_function_exceeds_the_length_limit():
  long = {(m, name): n for m, p in package_modules() for name, n in _function_lengths(p)
          if n > MAX_FUNCTION_LINES}
  assert long == {}


def _run(code: str) -> str:
  """stdout of `code` run by a fresh Python in a minimal environment (without
  TF_CPP_MIN_LOG_LEVEL, and without what this test process may have set)."""
  env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG", "TMPDIR") if k in os.environ}
  env.update(PYTHONPATH=REPO, CUDA_VISIBLE_DEVICES="")
  out = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True,
                       text=True, timeout=300)
  assert out.returncode == 0, out.stderr
  return out.stdout.strip()


def test_importing_the_package_changes_no_environment_variable():
  """A library import leaves os.environ alone. (TensorFlow itself sets
  TF_CPP_MIN_LOG_LEVEL when it is imported: the environment is compared after
  TensorFlow's and TFF's own imports.)"""
  _run("import os\n"
       "import tff_fedadamom, tff_fedadamom.cli\n"
       "assert 'TF_CPP_MIN_LOG_LEVEL' not in os.environ\n"
       "import tensorflow, tensorflow_federated\n"
       "before = dict(os.environ)\n"
       "import tff_fedadamom.process_table, tff_fedadamom.config, tff_fedadamom.experiment\n"
       "import tff_fedadamom.optimizers, tff_fedadamom.experiment.telemetry\n"
       "assert dict(os.environ) == before, set(os.environ.items()) ^ set(before.items())\n")


def test_the_command_quiets_tensorflow_for_itself():
  out = _run("import os\n"
             "from tff_fedadamom import cli\n"
             "assert cli.main(['validate', '/nonexistent/config.yaml']) == 2\n"
             "print(os.environ.get('TF_CPP_MIN_LOG_LEVEL'))\n")
  assert out.splitlines()[-1] == "3"


def _metric_names() -> tuple[set, tuple]:
  """The metric names `tff_fedadamom.metric_names` defines, and their prefixes
  (`train/`, `test/`, `opt/`, `time/`)."""
  from tff_fedadamom import metric_names

  names = {v for k, v in vars(metric_names).items() if k.isupper() and isinstance(v, str)}
  return names, tuple(sorted({n.split("/")[0] + "/" for n in names if "/" in n}))


def _keyed(node, parent) -> bool:
  """Whether `node` is used as a key of a metrics row: `row[node]`, `node in
  row`, `x == node`, `row.get(node)` (also `pop`, `setdefault`)."""
  if isinstance(parent, ast.Subscript):
    return parent.slice is node
  if isinstance(parent, ast.Compare):
    return parent.left is node or any(c is node for c in parent.comparators)
  return (isinstance(parent, ast.Call) and isinstance(parent.func, ast.Attribute)
          and parent.func.attr in ("get", "pop", "setdefault") and node in parent.args[:1])


def _metric_literals(path: str, names: set, prefixes: tuple) -> list[int]:
  """Lines of the module at `path` that spell a metric name: a string that is
  one and is used as a row's key, or any string under a metric prefix. (Axis
  labels and summary.json's own fields may read like a name; they are not keys.)"""
  with open(path) as f:
    tree = ast.parse(f.read(), path)
  parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
  return sorted(node.lineno for node in ast.walk(tree)
                if isinstance(node, ast.Constant) and isinstance(node.value, str)
                and (node.value.startswith(prefixes)
                     or node.value in names and _keyed(node, parents.get(node))))


def test_metric_names_are_spelled_only_in_their_home(tmp_path):
  names, prefixes = _metric_names()
  assert {"round", "train/loss", "opt/beta1_mean"} <= names
  assert prefixes == ("async/", "opt/", "test/", "time/", "train/", "validation/")
  sample = tmp_path / "sample.py"
  sample.write_text('row["round"]; "round" in row; row.get("round"); h[0] != "round"\n'
                    'x = "opt/v"\n'
                    'ax.set(xlabel="round"); summary = {"round": 1}; f(round=1)\n')
  assert _metric_literals(str(sample), names, prefixes) == [1, 1, 1, 1, 2]
  home = os.path.join(REPO, "tff_fedadamom", "metric_names.py")
  found = {os.path.relpath(p, REPO): lines for _, p in package_modules() if p != home
           for lines in [_metric_literals(p, names, prefixes)] if lines}
  assert found == {}


# Where the library may write the environment: the session object an entry
# point applies, and the command's own main (it quiets TensorFlow for itself).
ENVIRONMENT_WRITERS = {("tff_fedadamom.session", "apply"), ("tff_fedadamom.cli", "main")}
_ENVIRON_METHODS = {"update", "setdefault", "pop", "popitem", "clear", "__setitem__",
                    "__delitem__"}


def _is_environ(node) -> bool:
  """`os.environ` (or a bare `environ`)."""
  return ((isinstance(node, ast.Attribute) and node.attr == "environ")
          or (isinstance(node, ast.Name) and node.id == "environ"))


def _environment_writes(path: str) -> list[tuple[str, int]]:
  """(enclosing function, line) of each write to the environment in the file:
  `os.environ[k] = v`, `del os.environ[k]`, `os.environ.update(...)` and the
  like, `os.putenv`, `os.unsetenv`."""
  with open(path) as f:
    tree = ast.parse(f.read(), path)
  found = []

  def writes(node) -> bool:
    if isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
      targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
      return any(isinstance(t, ast.Subscript) and _is_environ(t.value) for t in targets)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
      func = node.func
      return ((func.attr in _ENVIRON_METHODS and _is_environ(func.value))
              or func.attr in ("putenv", "unsetenv"))
    return False

  def visit(node, function):
    for child in ast.iter_child_nodes(node):
      inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) \
          else function
      if writes(child):
        found.append((function, child.lineno))
      visit(child, inner)

  visit(tree, "<module>")
  return found


def test_only_entry_points_write_the_environment(tmp_path):
  sample = tmp_path / "sample.py"
  sample.write_text("import os\n"
                    "os.environ['A'] = '1'\n"
                    "def f():\n"
                    "  os.environ.update(B='2'); os.environ.get('C'); del os.environ['D']\n"
                    "  os.putenv('E', '5'); env = dict(os.environ); env['F'] = '6'\n")
  assert _environment_writes(str(sample)) == [("<module>", 2), ("f", 4), ("f", 4), ("f", 5)]
  found = {(m, function, line) for m, p in package_modules()
           for function, line in _environment_writes(p)}
  assert {(m, f) for m, f, _ in found} <= ENVIRONMENT_WRITERS, sorted(found)
  assert {(m, f) for m, f, _ in found} == ENVIRONMENT_WRITERS  # the scan sees both
