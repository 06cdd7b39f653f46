"""Tests for pipeline/runtime.py: child processes never outlive or hang their parent."""

import subprocess
import sys
import textwrap

# Runs in a fresh interpreter: `shutdown` kills every worker of its process, which
# inside pytest would include the TFF worker other tests share.
_HANGING_RELEASE = textwrap.dedent("""
    import os, signal, subprocess, sys, time
    from tff_fedadamom.pipeline import runtime

    child = subprocess.Popen([sys.executable, "-c",
        "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); "
        "print('ready', flush=True); time.sleep(600)"], stdout=subprocess.PIPE)
    child.stdout.readline()
    runtime._WORKERS.add(child.pid)  # as if TFF had started it

    def release():  # what TFF does to stop its worker: SIGINT, then an unbounded wait
      os.kill(child.pid, signal.SIGINT)
      child.wait()

    runtime._release_tff_context = release
    started = time.monotonic()
    runtime.shutdown(timeout_s=float(sys.argv[1]))
    print("returncode", child.returncode, "waited", round(time.monotonic() - started, 1))
""")


def _python(script: str, *args: str) -> str:
  """Runs `script` in a fresh interpreter; returns its stdout."""
  done = subprocess.run([sys.executable, "-c", script, *args], capture_output=True,
                        text=True, timeout=120)
  assert done.returncode == 0, done.stderr[-2000:]
  return done.stdout


def test_shutdown_kills_a_worker_that_ignores_sigint():
  out = _python(_HANGING_RELEASE, "1.0")
  # Killed by the watchdog (SIGKILL), not left waiting for the 600 s sleep.
  assert "returncode -9" in out, out
  waited = float(out.split("waited")[1])
  assert waited < 60.0, out


def test_clean_release_is_not_cut_short():
  script = textwrap.dedent("""
      import subprocess, sys
      from tff_fedadamom.pipeline import runtime
      child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
      runtime._WORKERS.add(child.pid)
      runtime._release_tff_context = child.wait
      runtime.shutdown(timeout_s=30.0)
      print("returncode", child.returncode)
  """)
  out = _python(script)
  assert "returncode 0" in out, out
