"""The sweep layer's imports: no module of `tuning` imports another that imports
it back (at import time or inside a function), and `tff_fedadamom` never imports
`tuning` except in its CLI, which dispatches `tune` and `export` to it."""

import ast
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _modules(package: str) -> dict[str, str]:
  """Dotted module name -> file, for every .py file under `package`."""
  out = {}
  for root, _, files in os.walk(os.path.join(REPO, package)):
    for name in files:
      if name.endswith(".py"):
        path = os.path.join(root, name)
        dotted = os.path.relpath(path, REPO)[:-3].replace(os.sep, ".")
        out[dotted[:-len(".__init__")] if dotted.endswith(".__init__") else dotted] = path
  return out


def _is_type_checking(node: ast.If) -> bool:
  test = node.test
  return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
      isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imported(path: str, known: set) -> set:
  """The modules of `known` that the file imports anywhere (functions included),
  except under `if TYPE_CHECKING:` (annotations only, never run)."""
  out = set()

  def visit(node):
    if isinstance(node, ast.If) and _is_type_checking(node):
      for child in node.orelse:
        visit(child)
      return
    if isinstance(node, ast.Import):
      out.update(a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      out.add(node.module)
      out.update(f"{node.module}.{a.name}" for a in node.names)  # `from pkg import mod`
    for child in ast.iter_child_nodes(node):
      visit(child)

  with open(path, encoding="utf-8") as f:
    visit(ast.parse(f.read(), path))
  return {m for m in out if m in known}


def find_cycle(graph: dict[str, set]) -> list:
  """One import cycle of `graph` as [a, b, ..., a], or [] when there is none."""
  state, stack = {}, []

  def dfs(node):
    state[node] = "open"
    stack.append(node)
    for nxt in sorted(graph.get(node, ())):
      if state.get(nxt) == "open":
        return stack[stack.index(nxt):] + [nxt]
      if nxt not in state:
        cycle = dfs(nxt)
        if cycle:
          return cycle
    state[node] = "done"
    stack.pop()
    return []

  for node in sorted(graph):
    if node not in state:
      cycle = dfs(node)
      if cycle:
        return cycle
  return []


def test_find_cycle_finds_one():
  assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
  assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_tuning_has_no_import_cycle():
  modules = _modules("tuning")
  graph = {name: imported(path, set(modules)) - {name} for name, path in modules.items()}
  assert not find_cycle(graph), " -> ".join(find_cycle(graph))


def test_tff_fedadamom_imports_tuning_only_from_its_cli():
  tuning = set(_modules("tuning"))
  users = {name for name, path in _modules("tff_fedadamom").items()
           if imported(path, tuning)}
  assert users <= {"tff_fedadamom.cli"}, users


@pytest.mark.parametrize("module", sorted(_modules("tuning")))
def test_each_tuning_module_imports_alone(module):
  """Imported first in a fresh interpreter, each module must load: a cycle that
  only works in one import order fails here."""
  result = subprocess.run([sys.executable, "-c", f"import {module}"], cwd=REPO,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": REPO})
  assert result.returncode == 0, result.stderr[-3000:]
