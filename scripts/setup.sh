#!/usr/bin/env bash
# One-time (idempotent) set-up of a fresh machine: Fashion-MNIST (and, if missing, libgomp1)
# from Debian, the package with its test extras, and PyTorch 2.13.0 (CPU) as the optional
# test oracle.
set -euo pipefail
cd "$(dirname "$0")/.."

DATA_DIR=/usr/share/datasets/fashion-mnist
if [ ! -f "$DATA_DIR/train-images-idx3-ubyte.gz" ]; then
    if [ "$(id -u)" = 0 ]; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist >/dev/null
    else
        sudo apt-get update -qq
        sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist >/dev/null
    fi
fi

# oneDNN's library (the onednn-cpu-gomp wheel) runs on GNU OpenMP's runtime.
if ! ldconfig -p 2>/dev/null | grep -q 'libgomp\.so\.1'; then
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq libgomp1 >/dev/null
fi

if ! command -v java >/dev/null 2>&1; then
    echo "setup: Java is required by Spark (OpenJDK 17 works); install openjdk-17-jre-headless" >&2
    exit 1
fi

PIP="python -m pip"
$PIP install -q --disable-pip-version-check -e ".[test,data,mlflow]"
# torch is only a test oracle and benchmark peer; 2.13.0 is the CPU build on this machine's
# disk. Never ask for another version: that downloads gigabytes.
if ! python -c "import torch" >/dev/null 2>&1; then
    $PIP install -q --disable-pip-version-check "torch==2.13.0" || \
        echo "setup: torch==2.13.0 not installed; parity tests will be skipped" >&2
fi
