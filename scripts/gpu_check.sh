#!/usr/bin/env bash
# The one script a session lent a GPU runs first: the GPU tests that need no Spark, then the
# GPU bench (bench/gpu.py), each bounded in time, everything printed also to files under
# $OUT (the device tool brings back what is there). Under ~10 minutes on an H100.
#
# Prepare it here (once; the data and any wheels travel as ignored folders named in carry):
#   echo /.gpu_data/ >> .git/info/exclude
#   mkdir -p .gpu_data/fashion-mnist && cp /usr/share/datasets/fashion-mnist/*.gz .gpu_data/fashion-mnist/
#   # only for a package the machine lacks (KINDS.md lists what it has), see the device README:
#   # echo /.whl/ >> .git/info/exclude; python3 -m pip download --no-deps ... -d .whl NAME==VERSION
# then run it with the device tool:
#   run(command="bash scripts/gpu_check.sh", carry=[".gpu_data", ".whl"], timeout_s=600)
#
# Budgets (seconds) can be changed by environment variables: TEST_SECONDS, BENCH_SECONDS.
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu_check_out}"
mkdir -p "$OUT"
LOG="$OUT/gpu_check.log"
TEST_SECONDS="${TEST_SECONDS:-300}"
BENCH_SECONDS="${BENCH_SECONDS:-240}"
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

main() {
echo "== gpu_check $(date -u '+%Y-%m-%d %H:%M:%S') UTC, commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"

if compgen -G ".whl/*.whl" > /dev/null; then
    echo "== installing the carried wheels"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && export PYTHONPATH="/tmp/site:$PYTHONPATH"
fi

echo "== the machine"
nvidia-smi -L || true
python3 - <<'EOF'
import numpy, sys
print("python", sys.version.split()[0], "numpy", numpy.__version__)
try:
    import cupy
    print("cupy", cupy.__version__, "devices", cupy.cuda.runtime.getDeviceCount(),
          "CUDA runtime", cupy.cuda.runtime.runtimeGetVersion())
except Exception as error:  # reported, not fatal: the bench then says it is a dry run
    print("cupy unavailable:", repr(error))
try:
    import torch
    print("torch", torch.__version__, "cuda", torch.cuda.is_available())
except Exception as error:
    print("torch unavailable:", repr(error))
from bigdl_py.autograd.ops import cublas, cudnn
print("bigdl_py cuBLAS route:", cublas.available(), " cuDNN route:", cudnn.available())
EOF

echo "== pytest -m gpu (the folders that need no Spark), at most ${TEST_SECONDS} s"
started=$SECONDS
timeout --signal=INT --kill-after=20 "$TEST_SECONDS" python3 -m pytest -m gpu -q -rfEs \
    -p no:cacheprovider --continue-on-collection-errors \
    --junitxml="$OUT/gpu_tests.xml" \
    tests/autograd tests/nn tests/optim tests/data tests/models tests/kernels tests/train \
    tests/test_step_graph.py tests/test_backend.py tests/test_backend_scatter.py \
    tests/test_strict_device.py tests/test_device_waits.py
echo "== pytest exit status $?, $((SECONDS - started)) s"

echo "== bench/gpu.py, at most ${BENCH_SECONDS} s"
fashion=()
if compgen -G ".gpu_data/fashion-mnist/*ubyte.gz" > /dev/null; then
    fashion=(--fashion-mnist .gpu_data/fashion-mnist)
elif [ -d /usr/share/datasets/fashion-mnist ]; then
    fashion=(--fashion-mnist /usr/share/datasets/fashion-mnist)
else
    echo "no Fashion-MNIST here (carry .gpu_data/fashion-mnist): part 2 skipped"
    fashion=(--no-fashion)
fi
started=$SECONDS
timeout --signal=INT --kill-after=20 "$BENCH_SECONDS" python3 bench/gpu.py "${fashion[@]}" \
    > "$OUT/gpu_bench.md"
status=$?
cat "$OUT/gpu_bench.md"
echo "== bench exit status $status, $((SECONDS - started)) s"
echo "== done; files in $OUT: $(ls "$OUT" | tr '\n' ' ')"
}

main 2>&1 | tee "$LOG"
