"""A pytest plugin: under pytest-xdist's `--dist loadgroup` (`make test`), the
tests of a module that share a module-, class- or package-scoped fixture (a
quick paper run, a killed Ray driver, a built process) go to one worker, which
makes the fixture once; every other test is scheduled on its own.

xdist schedules by the `@group` suffix its worker adds to a test's node id in
its own `pytest_collection_modifyitems`, from the `xdist_group` marks present
then. That hook is registered after the conftest that loads this plugin, so it
would run first (pluggy calls later registrations first) and see no mark: ours
must run first (`tryfirst`). tests/test_xdist_groups.py checks it on a real
xdist run.
"""

import pytest

# Fixtures made once per module (or class, or package) for the tests that share them.
SHARED_SCOPES = ("module", "class", "package")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
  del config
  for item in items:
    info = getattr(item, "_fixtureinfo", None)
    definitions = info.name2fixturedefs.values() if info is not None else ()
    if any(defs and defs[-1].scope in SHARED_SCOPES for defs in definitions):
      item.add_marker(pytest.mark.xdist_group(item.module.__name__))
