"""No test module imports another test module: what tests share lives in
tests/helpers.py (or a conftest.py, for a fixture). Importing a test module runs
its module-level code and puts its tests in the importer's namespace, where
pytest collects them a second time.

Imports are read with `ast`, in the module's code and in the programs it hands
to a subprocess or a Ray worker as a string (a string constant that parses as
Python and imports something). A program importing its own module's
definitions is that module's business (an actor class defined beside the test
that starts it); one importing another test module is not.
"""

import ast
import os
import textwrap

from tests.helpers import ROOT

TESTS = os.path.join(ROOT, "tests")


def _is_test_module(name: str) -> bool:
  """A module of the tests package that pytest collects (tests/**/test_*.py)."""
  parts = name.split(".")
  return parts[0] == "tests" and parts[-1].startswith("test_")


def _imported(tree, package: str) -> list[tuple[int, str]]:
  """(line, module) of every import in `tree`, relative imports resolved
  against `package`; `from a import b` counts `a.b` too (b may be a module)."""
  found = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      found += [(node.lineno, alias.name) for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
        base = ".".join(anchor + ([base] if base else []))
      found.append((node.lineno, base))
      found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
  return found


def _programs(tree) -> list[tuple[int, ast.AST]]:
  """(line, parsed program) of every string constant that is a Python program
  with an import in it."""
  programs = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and \
        "import" in node.value:
      try:
        programs.append((node.lineno, ast.parse(textwrap.dedent(node.value))))
      except SyntaxError:
        continue
  return programs


def violations(source: str, module: str) -> list[tuple[int, str]]:
  """(line, imported test module) for each import of another test module by
  `module` (its code, and its programs in strings), whose text is `source`."""
  package = module.rpartition(".")[0]
  tree = ast.parse(source)
  found = [(line, name) for line, name in _imported(tree, package)
           if _is_test_module(name) and name != module]
  for line, program in _programs(tree):
    found += [(line, name) for _, name in _imported(program, package)
              if _is_test_module(name) and name != module]
  return sorted(set(found))


def _test_files():
  for folder, _, files in os.walk(TESTS):
    for name in sorted(files):
      if name.endswith(".py"):
        path = os.path.join(folder, name)
        yield os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".").removesuffix(".__init__"), path


def _example(text: str) -> str:
  """An example module's source. Written with `TEST_` for `test_`, so that this
  file's own scan does not read its examples as imports of this file."""
  return textwrap.dedent(text).replace("TEST_", "test_")


def test_the_scan_sees_imports_of_test_modules():
  """The scan finds each way of importing another test module, and passes the
  allowed ones: helpers, conftest, and a program importing its own module."""
  bad = _example('''
      from tests.experiment.TEST_runner import tiny
      import tests.TEST_layering
      from tests.experiment import TEST_loop
      from .TEST_parts import rows
      def later():
        from tests.tuning.TEST_cluster import two_node_cluster
      CHILD = """
      import json
      from tests.experiment.TEST_tff_cpp import relay_and_worker
      """
  ''')
  assert sorted(name for _, name in violations(bad, "tests.experiment.test_x")) == [
      "tests.experiment.test_loop", "tests.experiment.test_parts",
      "tests.experiment.test_runner", "tests.experiment.test_tff_cpp",
      "tests.test_layering", "tests.tuning.test_cluster"]
  fine = _example('''
      from tests.helpers import tiny
      from tests import process_table as processes
      from tests.tuning.conftest import write_sweep
      import tests.data.fixtures
      CHILD = "from tests.experiment.TEST_x import SlowActor"
      TEXT = "not a program: import the tests"
  ''')
  assert violations(fine, "tests.experiment.test_x") == []


def test_no_test_module_imports_another():
  found = {}
  for module, path in _test_files():
    with open(path) as f:
      bad = violations(f.read(), module)
    if bad:
      found[os.path.relpath(path, ROOT)] = bad
  assert not found, f"import these from tests/helpers.py instead: {found}"
