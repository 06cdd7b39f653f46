"""scripts/bootstrap.sh's GPU choice (`--plan` installs nothing)."""

import os
import subprocess

from tests.helpers import ROOT


def _plan(tmp_path, nvidia_smi_exit: int) -> dict:
  """What set-up would do on a machine whose `nvidia-smi -L` exits with `nvidia_smi_exit`."""
  fake = tmp_path / f"bin{nvidia_smi_exit}"
  fake.mkdir()
  (fake / "nvidia-smi").write_text(
      f'#!/bin/sh\n[ "$1" = "-L" ] && echo "GPU 0: Fake"\nexit {nvidia_smi_exit}\n')
  (fake / "nvidia-smi").chmod(0o755)
  env = dict(os.environ, PATH=f"{fake}{os.pathsep}{os.environ['PATH']}")
  out = subprocess.run(["bash", "scripts/bootstrap.sh", "--plan"], cwd=ROOT, env=env,
                       capture_output=True, text=True, check=True, timeout=60).stdout
  return dict(line.split(": ", 1) for line in out.splitlines())


def test_gpu_machine_gets_the_cuda_libraries(tmp_path):
  plan = _plan(tmp_path, 0)
  assert plan["gpu"] == "cuda"
  with open(os.path.join(ROOT, "requirements.cuda.txt")) as f:
    wanted = [line.strip() for line in f if line.strip() and not line.startswith("#")]
  assert plan["cuda"].split() == wanted
  assert "nvidia-cudnn-cu11==8.7.0.84" in wanted


def test_no_working_driver_gets_nothing_extra(tmp_path):
  plan = _plan(tmp_path, 9)
  assert plan["gpu"] == "none"
  assert "cuda" not in plan


def test_gaining_a_gpu_changes_the_stamp(tmp_path):
  assert _plan(tmp_path, 0)["stamp"] != _plan(tmp_path, 9)["stamp"]
