"""How the command ends: `cli.entry` runs the exit handlers, flushes, and skips
the interpreter's final collection of TensorFlow's heap (seconds per command)."""

import os
import subprocess
import sys

import pytest

from tests.helpers import ROOT


# A module global whose `__del__` runs only in the interpreter's teardown, and an
# exit handler that must still run; then the command with `argv`.
PROGRAM = """
import atexit, sys
from tff_fedadamom import cli

class Teardown:
  def __del__(self):
    print("teardown ran", flush=True)

marker = Teardown()
atexit.register(lambda: print("exit handler ran"))  # printed, not flushed: entry flushes
sys.argv = ["tff-fedadamom", *{argv!r}]
cli.entry()
print("entry returned")
"""


def _python(program: str) -> subprocess.CompletedProcess:
  """`program` run by a fresh Python that imports this checkout."""
  return subprocess.run([sys.executable, "-c", program], env={**os.environ, "PYTHONPATH": ROOT},
                        cwd=ROOT, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("argv, status, stderr", [
    (["validate", "/nonexistent/config.yaml"], 2, "error: "),  # main's own status
    (["run"], 2, "usage: "),                                    # argparse's SystemExit(2)
    (["--help"], 0, ""),                                        # SystemExit(0)
])
def test_entry_exits_with_the_status_after_the_exit_handlers(argv, status, stderr):
  out = _python(PROGRAM.format(argv=argv))
  assert out.returncode == status, out.stderr
  assert stderr in out.stderr
  assert "exit handler ran" in out.stdout.splitlines()
  assert "teardown ran" not in out.stdout  # no final collection
  assert "entry returned" not in out.stdout


def test_exit_code_follows_sys_exit():
  from tff_fedadamom.cli import _exit_code

  assert _exit_code(None) == 0
  assert _exit_code(143) == 143
  assert _exit_code("a message") == 1


# A signal that lands while a finalizer runs: its handler's exception is dropped
# there ("Exception ignored"), and without a second raise the program goes on.
# The program restores SIGINT's default handler first: a suite started in the
# background (a non-interactive shell's `&`) hands it an ignored SIGINT, which
# `install` keeps ignored, as a command's should be.
IN_FINALIZER = """
import os, signal, sys, threading, time
from tff_fedadamom.cli import _Interrupts

signal.signal(signal.SIGINT, signal.default_int_handler)
_Interrupts().install()
inside = threading.Event()

class Finalized:
  def __del__(self):
    if not inside.is_set():  # the first one: the signal is handled in here
      inside.set()
      started = time.time()
      while time.time() - started < 0.5:
        pass

threading.Thread(target=lambda: (inside.wait(), os.kill(os.getpid(), {signum})),
                 daemon=True).start()
try:
  deadline = time.time() + 10
  while time.time() < deadline:
    Finalized()  # deleted at once, its __del__ run by the main thread
  print("went on")
except KeyboardInterrupt:
  print("ended by KeyboardInterrupt")
except SystemExit as e:
  print("ended by SystemExit", e.code)
"""


@pytest.mark.parametrize("signum, ending", [(2, "ended by KeyboardInterrupt"),
                                            (15, "ended by SystemExit 143")])
def test_a_signal_handled_inside_a_finalizer_still_ends_the_command(signum, ending):
  out = _python(IN_FINALIZER.format(signum=signum))
  assert out.stdout.strip() == ending, out.stderr
  assert "Exception ignored" not in out.stderr


def test_an_unrelated_exception_in_a_finalizer_is_still_reported():
  program = ("import sys\nfrom tff_fedadamom.cli import _Interrupts\n_Interrupts().install()\n"
             "class Broken:\n  def __del__(self):\n    raise ValueError('from __del__')\n"
             "Broken()\nprint('went on')\n")
  out = _python(program)
  assert out.stdout.strip() == "went on"
  assert "ValueError: from __del__" in out.stderr


def test_a_signal_whose_exception_was_swallowed_whole_ends_the_run_at_the_round_end():
  """A bare `except:` reports nothing to the unraisable hook; the run's per-round
  check (`on_round`) raises the signal's exception again."""
  from tff_fedadamom.cli import _Interrupts

  interrupts = _Interrupts()  # not installed: this test process keeps its handlers
  interrupts.check(1, {})  # no signal yet: nothing happens
  for signum, raised, code in ((15, SystemExit, 143), (2, KeyboardInterrupt, None)):
    try:
      interrupts._on_signal(signum, None)  # noqa: SLF001 - as the handler is called
    except BaseException:  # noqa: BLE001 - the swallowing code under test
      pass
    with pytest.raises(raised) as info:
      interrupts.check(2, {})
    if code is not None:
      assert info.value.code == code
