"""The project's structure: layers that import only downward, small modules, and
imports that change nothing process-wide.

Layers, lowest first: the ground (data, models and the small shared modules),
optimizers (with the learning processes of `algorithms`), config, pipeline (and
the CLI), then the sweep layer `tuning`. A module may import its own layer and
those below it, never one above. The CLI alone may reach `tuning`, and only
inside a function (it adds the `tune`/`export` subcommands when it runs).
Imports are read with `ast`, so a lazy import inside a function counts too.
"""

import ast
import os
import subprocess
import sys


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("tff_fedadamom", "tuning")

# Module-name prefix -> layer; the longest matching prefix decides.
LAYERS = {
    "tff_fedadamom": 0,  # the package itself (its exports are lazy) and the shared modules
    "tff_fedadamom.data": 0,
    "tff_fedadamom.models": 0,
    "tff_fedadamom.algorithms": 1,
    "tff_fedadamom.optimizers": 1,
    "tff_fedadamom.config": 2,
    "tff_fedadamom.pipeline": 3,
    "tff_fedadamom.cli": 3,
    "tff_fedadamom.__main__": 3,
    "tuning": 4,
}
# (importer, imported prefix): allowed upward, only from inside a function.
LAZY_UPWARD = {("tff_fedadamom.cli", "tuning")}
MAX_LINES = 400


def _layer(module: str) -> int:
  best = max((p for p in LAYERS if module == p or module.startswith(p + ".")), key=len)
  return LAYERS[best]


def _modules():
  """(module name, path) of every Python file of the packages."""
  for package in PACKAGES:
    for folder, _, files in os.walk(os.path.join(REPO, package)):
      for name in sorted(files):
        if name.endswith(".py"):
          path = os.path.join(folder, name)
          module = os.path.relpath(path, REPO)[:-3].replace(os.sep, ".")
          yield module.removesuffix(".__init__"), path


def _imports(module: str, path: str):
  """(imported module, line, inside a function) for each project import."""
  with open(path) as f:
    tree = ast.parse(f.read(), path)
  package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
  found = []

  def visit(node, in_function):
    for child in ast.iter_child_nodes(node):
      lazy = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
      if isinstance(child, ast.Import):
        names = [a.name for a in child.names]
      elif isinstance(child, ast.ImportFrom):
        base = child.module or ""
        if child.level:
          parts = package.split(".")[:len(package.split(".")) - child.level + 1]
          base = ".".join(parts + ([child.module] if child.module else []))
        # `from a import b` may import module a.b: count both names.
        names = [base] + [f"{base}.{a.name}" for a in child.names]
      else:
        visit(child, lazy)
        continue
      for name in names:
        if name.split(".")[0] in PACKAGES:
          found.append((name, child.lineno, in_function))
  visit(tree, False)
  return found


def _violations():
  out = []
  for module, path in _modules():
    for imported, line, lazy in _imports(module, path):
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
  imports = dict(_modules())
  cli = {(name, lazy) for name, _, lazy in _imports("tff_fedadamom.cli",
                                                     imports["tff_fedadamom.cli"])}
  assert ("tuning.cli", True) in cli  # lazy, inside build_parser
  sweep = {name for name, _, _ in _imports("tuning.sweep", imports["tuning.sweep"])}
  assert "tff_fedadamom.pipeline.ray_session" in sweep
  assert _layer("tff_fedadamom.pipeline.runner") == 3
  assert _layer("tff_fedadamom.naming") == 0 and _layer("tuning.workers") == 4


def test_nothing_imports_upward():
  assert _violations() == []


def test_no_module_exceeds_the_size_limit():
  sizes = {m: sum(1 for _ in open(p)) for m, p in _modules()}
  assert {m: n for m, n in sizes.items() if n > MAX_LINES} == {}


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
       "import tff_fedadamom.processes, tff_fedadamom.config, tff_fedadamom.pipeline\n"
       "import tff_fedadamom.optimizers, tff_fedadamom.pipeline.telemetry\n"
       "assert dict(os.environ) == before, set(os.environ.items()) ^ set(before.items())\n")


def test_the_command_quiets_tensorflow_for_itself():
  out = _run("import os\n"
             "from tff_fedadamom import cli\n"
             "assert cli.main(['validate', '/nonexistent/config.yaml']) == 2\n"
             "print(os.environ.get('TF_CPP_MIN_LOG_LEVEL'))\n")
  assert out.splitlines()[-1] == "3"
