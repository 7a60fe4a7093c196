#!/usr/bin/env bash
# The device check of issue 24, as one run: the kernel tests on the GPU backend, the advantage benchmark with
# bandwidth against a device copy, GiGPO, and the README's train step with and without compute_advantages.
# Logs go under $OUT (the device tool's folder), else ./gpu_out. The exit status is non-zero when any step
# failed; an import of jax or of this checkout's prm_jax that fails stops the run at once. Dry run on a
# CPU-only machine with tiny shapes (PYTHON: the interpreter to run, e.g. .venv/bin/python):
#   OUT=/tmp/gpu_out JAX_PLATFORMS=cpu DRY_RUN=1 PYTHON=.venv/bin/python bash benchmarks/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
PLATFORM=${JAX_PLATFORMS:-cuda}
export JAX_PLATFORMS=$PLATFORM PYTHONUNBUFFERED=1
if [ "${DRY_RUN:-0}" = 1 ]; then
  SHAPES=8x256,4x512; TEST_BOUND=900; REPEATS=3; STEP="--rows 16 --width 256 --repeats 3"
  GIGPO="--rows 64 --turns 8 --width 256 --repeats 3 --loop-repeats 1"
else
  SHAPES=1024x32768,8192x2048,256x8192,64x8192,16x32768; TEST_BOUND=240; REPEATS=20
  STEP="--rows 64 --width 8192"; GIGPO=""
fi
PY=${PYTHON:-python3}
failed=0
step() {  # step NAME EXIT_STATUS: record a failed step; the run goes on, the exit status says it
  echo "$1: exit $2"
  [ "$2" = 0 ] || failed=1
}

{ date -u; nvidia-smi 2>/dev/null || echo "no nvidia-smi"; } > "$OUT/machine.log"
# No install step: the checkout is put first on the import path (an editable install's effect, without the
# build step that failed on the device with "invalid command 'bdist_wheel'": pip's --no-build-isolation uses
# the image's setuptools). Whatever else goes wrong here stops the run, loudly.
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if ! $PY -c "import jax, prm_jax, sys; print(jax.__version__, jax.default_backend(), jax.devices(), prm_jax.__file__); \
sys.exit(0 if prm_jax.__file__.startswith('$PWD/') else 1)" | tee -a "$OUT/machine.log"; then
  echo "jax or this checkout's prm_jax does not import (see $OUT/machine.log)"; exit 1
fi

# 1. Kernel and pipeline tests on this backend; CPU-only tests (the native kernel) report their skip reason.
timeout "$TEST_BOUND" $PY -m pytest -q -p no:cacheprovider -rs tests/kernels > "$OUT/tests.log" 2>&1
step "tests ($(tail -1 "$OUT/tests.log"))" $?

# 2. GAE methods, compute_advantages (unchecked and checked), roofline and device copy per shape (float32),
#    γλ < 1 and γ = λ = 1; compile time reported apart.
for gl in "0.99 0.95" "1.0 1.0"; do
  set -- $gl
  $PY benchmarks/bench_advantages.py --shapes "$SHAPES" --repeats "$REPEATS" --gamma "$1" --lam "$2" --no-loop \
    --json "$OUT/bench_g$1_l$2.json" > "$OUT/bench_g$1_l$2.log" 2>&1
  step "bench gamma=$1 lam=$2" $?; grep -v WARNING "$OUT/bench_g$1_l$2.log" | tail -60
done

# 3. GiGPO at its CPU benchmark's size (the credit-assignment kernels of issue 22 join here once they land).
$PY benchmarks/bench_gigpo.py $GIGPO > "$OUT/gigpo.log" 2>&1
step "gigpo" $?; grep -v WARNING "$OUT/gigpo.log"

# 4. The README's train step with and without compute_advantages, and its host callbacks.
$PY benchmarks/bench_train_step.py $STEP > "$OUT/train_step.log" 2>&1
step "train step" $?; grep -v WARNING "$OUT/train_step.log"
$PY benchmarks/bench_train_step.py $STEP --check-values counts > "$OUT/train_step_counts.log" 2>&1
step "train step, checks as counts" $?; grep -v WARNING "$OUT/train_step_counts.log"

exit $failed
