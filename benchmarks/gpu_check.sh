#!/usr/bin/env bash
# Issue 15's device check, as one run: the kernel tests on the GPU backend, the advantage benchmark with
# bandwidth against a device copy, and the README's train step. Logs go under $OUT (the device tool's
# folder), else ./gpu_out. Dry run on a CPU-only machine with tiny shapes:
#   OUT=/tmp/gpu_out JAX_PLATFORMS=cpu DRY_RUN=1 bash benchmarks/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
PLATFORM=${JAX_PLATFORMS:-cuda}
export JAX_PLATFORMS=$PLATFORM PYTHONUNBUFFERED=1
if [ "${DRY_RUN:-0}" = 1 ]; then
  SHAPES=8x256,4x512; TEST_BOUND=600; REPEATS=3; STEP="--rows 16 --width 256 --repeats 3"
else
  SHAPES=1024x32768,256x8192,64x8192,16x32768; TEST_BOUND=240; REPEATS=20; STEP="--rows 64 --width 8192"
fi
PY=${PYTHON:-python3}
{ date -u; nvidia-smi 2>/dev/null || echo "no nvidia-smi"; } > "$OUT/machine.log"
$PY -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/install.log" 2>&1 || { echo "install failed"; tail "$OUT/install.log"; }
$PY -c "import jax; print(jax.__version__, jax.default_backend(), jax.devices())" | tee -a "$OUT/machine.log"

# 1. Kernel and pipeline tests on this backend; CPU-only tests (the native kernel) report their skip reason.
timeout "$TEST_BOUND" $PY -m pytest -q -p no:cacheprovider -rs tests/test_gae.py tests/test_pipeline.py \
  tests/test_normalization.py tests/test_shaping.py tests/test_alignment_kl.py tests/test_areal_parity.py \
  > "$OUT/tests.log" 2>&1
echo "tests: exit $? ($(tail -1 "$OUT/tests.log"))"

# 2. GAE methods, compute_advantages, roofline and device copy per shape (float32), γλ < 1 and γ = λ = 1.
for gl in "0.99 0.95" "1.0 1.0"; do
  set -- $gl
  $PY benchmarks/bench_advantages.py --shapes "$SHAPES" --repeats "$REPEATS" --gamma "$1" --lam "$2" --no-loop \
    --json "$OUT/bench_g$1_l$2.json" > "$OUT/bench_g$1_l$2.log" 2>&1
  echo "bench gamma=$1 lam=$2: exit $?"; grep -v WARNING "$OUT/bench_g$1_l$2.log" | tail -40
done

# 3. The README's train step with and without compute_advantages, and its host callbacks.
$PY benchmarks/bench_train_step.py $STEP > "$OUT/train_step.log" 2>&1
echo "train step: exit $?"; grep -v WARNING "$OUT/train_step.log"
