#!/usr/bin/env bash
# The device check (issues 47 and 56), as one run that fits one lease: at most 6 minutes on the GPU machine
# (its parts' bounds add up to 334 s, tests/test_gpu_check.py holds them to it), in this order:
#   tests     the backend-dependent kernel, pipeline and scorer-array tests first (the GAE methods auto picks
#             here, GiGPO's sort, OTB's scatter, the option matrix, the checks' callbacks, the arrays path and
#             ModelScorer), then every other kernel test while the bound allows; each failure's traceback is
#             written as it fails (failures.log), so a cut run still says why;
#   gae       every GAE method, compute_advantages (unchecked and checked), the roofline and a device copy at
#             the issue's five shapes (each method compiled once per shape), at gamma*lam < 1 and = 1; auto's
#             rule as these runs measured it (benchmarks/auto_table.py); XLA's account of each method and of
#             the checked and unchecked pipelines (profile_gae.py);
#   credit    compute_advantages under every registered estimator at one shape (1024x2048), the credit
#             kernels, GiGPO, OTB's sum_pi_squared and every policy loss with its gradient;
#   scorer    ModelScorer through score_arrays against the hand-batched loop, chunks of 8, 64 and 256 rows;
#   step      the train step with and without compute_advantages and the loss, and its host round trips.
# Everything comes back in at most 8 files under $OUT (machine.log, tests.log, failures.log, gae.log,
# gae.json, gae1.json, credit.log, scorer_step.log), each written as its part goes (a part cut by its bound
# keeps what it printed); a failed or cut part makes the exit status non-zero; an import of jax or of this
# checkout's prm_jax that fails stops the run at once. PARTS names the parts to run (default: all, in the
# order above), e.g. PARTS="tests scorer" to rerun two. On the device:
#   run(command="bash benchmarks/gpu_check.sh", carry=[".gpu-wheels"], timeout_s=420)
#
# The device's image (the device tool's KINDS.md) has jax, chex, flax, optax, anyio, pyyaml, httpx, pytest,
# pytest-xdist and hypothesis but not msgspec (a run-time dependency): `python3 dev.py gpu` downloads its
# wheels into .gpu-wheels/ (carry it), and this script unpacks the one for the device's Python when msgspec
# is missing.
# `python3 dev.py gpu` also dry-runs this script on the CPU, in a virtual environment holding what the image
# holds, with tiny shapes (and runs the backend-dependent kernel tests with a GPU's choices,
# PRM_JAX_TESTS_AS_PLATFORM=cuda):
#   OUT=/tmp/gpu_out JAX_PLATFORMS=cpu DRY_RUN=1 PYTHON=.venv-gpu/bin/python bash benchmarks/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
PLATFORM=${JAX_PLATFORMS:-cuda}
export JAX_PLATFORMS=$PLATFORM PYTHONUNBUFFERED=1
# The compilation cache outlives a run on a warm machine (an ignored path is kept between calls): a rerun
# compiles nothing twice. First calls read from it then (first_call_s is a cache load, not a compile).
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-$PWD/.jax_cache}
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0.2
ALL_PARTS="tests gae credit scorer step"
PARTS=${PARTS:-$ALL_PARTS}
for part in $PARTS; do  # a misspelt part would otherwise run nothing and pass
  [[ " $ALL_PARTS " == *" $part "* ]] || { echo "PARTS: no part named '$part' (the parts: $ALL_PARTS)"; exit 2; }
done
# The issue's shapes, the one its bandwidth question is asked at first (a part cut short keeps the first).
SHAPES=8192x2048,1024x32768,256x8192,64x8192,16x32768; ESTIMATORS_AT=1024x32768
if [ "${DRY_RUN:-0}" = 1 ]; then
  SHAPES=8x256,4x512; ESTIMATORS_AT=8x256; REPEATS=2; STEP="--rows 16 --width 256 --repeats 2"
  CREDIT="--rows 16 --turns 2 --tokens 64 --group 4 --repeats 2"
  GIGPO="--rows 64 --turns 8 --width 256 --repeats 2 --loop-repeats 1"
  LOSSES="--rows 16 --width 256 --repeats 2"; SPS="--rows 16 --vocab 1000 --chunk 256 --repeats 2"
  SCORER="--sessions 32 --repeats 2"; SCALE=10  # bounds x10: a 2-core CPU compiles slower than the device runs
else
  REPEATS=10; STEP="--rows 64 --width 8192 --repeats 20"
  CREDIT=""; GIGPO="--loop-repeats 1"; LOSSES="--rows 64 --width 8192 --repeats 10"; SPS=""
  SCORER="--sessions 256 --repeats 3"; SCALE=1
fi
PY=${PYTHON:-python3}
failed=0
started=$SECONDS

step() {  # step NAME EXIT_STATUS SECONDS: record a part; the run goes on, the exit status says it
  local how="exit $2"
  [ "$2" = 124 ] && how="cut at its bound (exit 124)"
  echo "$1: $how, $3 s"
  [ "$2" = 0 ] || failed=1
}
wanted() { [[ " $PARTS " == *" $1 "* ]]; }
bounded() {  # bounded SECONDS LOG COMMAND...: the command under a time bound, its output into LOG
  local bound=$(($1 * SCALE)) log=$2
  shift 2
  timeout "$bound" "$@" >> "$log" 2>&1
}

{ date -u; nvidia-smi 2>/dev/null || echo "no nvidia-smi"; } > "$OUT/machine.log"
# No install step: the checkout is put first on the import path (an editable install's effect, without the
# build step that failed on the device with "invalid command 'bdist_wheel'": pip's --no-build-isolation uses
# the image's setuptools). Whatever else goes wrong here stops the run, loudly.
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if ! $PY -c "import msgspec" 2>/dev/null; then
  tag=$($PY -c "import sys; print(f'cp{sys.version_info[0]}{sys.version_info[1]}')")
  wheel=$(ls .gpu-wheels/msgspec-*-"$tag"-*.whl 2>/dev/null | head -1)
  if [ -z "$wheel" ]; then
    echo "msgspec is missing and .gpu-wheels/ has no wheel for $tag: run python3 dev.py gpu, carry .gpu-wheels"
    exit 1
  fi
  rm -rf .gpu-site && $PY -m zipfile -e "$wheel" .gpu-site && export PYTHONPATH="$PYTHONPATH:$PWD/.gpu-site"
  echo "msgspec from $wheel" | tee -a "$OUT/machine.log"
fi
if ! $PY -c "import jax, msgspec, prm_jax, sys; print(jax.__version__, jax.default_backend(), jax.devices(), \
prm_jax.__file__); sys.exit(0 if prm_jax.__file__.startswith('$PWD/') else 1)" | tee -a "$OUT/machine.log"; then
  echo "jax, msgspec or this checkout's prm_jax does not import (see $OUT/machine.log)"; exit 1
fi
echo "compilation cache: $(ls "$JAX_COMPILATION_CACHE_DIR" 2>/dev/null | wc -l) entries at the start" \
  | tee -a "$OUT/machine.log"

if wanted scorer || wanted step; then : > "$OUT/scorer_step.log"; fi
# tests: in WORKERS pytest-xdist processes (compiling is most of a test's time and runs on the host's cores),
# test by test in the order given, one line per test (a cut run still says how far it got); CPU-only cases
# (the native kernels) report their skip reason. A dry run collects every file and runs three.
if wanted tests; then
  t=$SECONDS
  first=(tests/kernels/test_recurrence.py tests/kernels/test_token_gae.py tests/kernels/test_strategy.py
         tests/kernels/test_gigpo.py tests/kernels/test_otb.py tests/kernels/test_alignment.py
         tests/kernels/test_check_callbacks.py tests/kernels/test_progress.py tests/kernels/test_normalization.py
         tests/kernels/test_matrix.py tests/runtime/test_arrays.py tests/runtime/test_model_scorer.py
         tests/test_stage_inputs.py)
  rest=$(ls tests/kernels/test_*.py | grep -v -F -x -f <(printf '%s\n' "${first[@]}"))
  : > "$OUT/tests.log"; rm -f "$OUT/failures.log"
  if [ "${DRY_RUN:-0}" = 1 ]; then  # every file collected (its imports in this environment), three of them run
    $PY -m pytest -q --collect-only -p no:cacheprovider "${first[@]}" $rest >> "$OUT/tests.log" 2>&1 \
      || { step "tests collected" 1 $((SECONDS - t)); tail -30 "$OUT/tests.log"; }
    first=(tests/kernels/test_strategy.py tests/kernels/test_check_callbacks.py tests/runtime/test_model_scorer.py)
    rest=""
  fi
  workers=${WORKERS:-$(( $(nproc) / 2 > 1 ? $(nproc) / 2 : 1 ))}
  # (each failure's traceback written as it fails, tests/conftest.py: a run cut by its bound still says why)
  PRM_JAX_FAILURES="$OUT/failures.log" XLA_PYTHON_CLIENT_PREALLOCATE=false bounded 110 "$OUT/tests.log" \
    $PY -m pytest -v -p no:cacheprovider -rs -n "$workers" --dist load "${first[@]}" $rest
  code=$?
  counts="$(grep -c -E " PASSED( |$)" "$OUT/tests.log") passed, $(grep -c -E " SKIPPED( |$)" "$OUT/tests.log") \
skipped, $(grep -c -E " (FAILED|ERROR)( |$)" "$OUT/tests.log") failed or errors"
  step "tests ($counts; $workers workers; $(tail -1 "$OUT/tests.log"))" $code $((SECONDS - t))
  grep -E " (FAILED|ERROR)( |$)|^(FAILED|ERROR) " "$OUT/tests.log" | head -40
  [ -s "$OUT/failures.log" ] && { echo "tracebacks: $OUT/failures.log"; head -c 20000 "$OUT/failures.log"; }
fi
# gae: the GAE methods and the pipeline at the five shapes, both regimes (float32; first calls apart), auto's
# rule from the two runs, and XLA's account of each method and of the checked and unchecked pipelines.
if wanted gae; then
  t=$SECONDS; : > "$OUT/gae.log"; code=0
  echo "== gamma=0.99 lam=0.95" >> "$OUT/gae.log"
  bounded 55 "$OUT/gae.log" $PY benchmarks/bench_advantages.py --shapes "$SHAPES" --repeats "$REPEATS" \
    --gamma 0.99 --lam 0.95 --no-loop --json "$OUT/gae.json" || code=$?
  echo "== gamma=lam=1 (cumsum joins)" >> "$OUT/gae.log"
  bounded 25 "$OUT/gae.log" $PY benchmarks/bench_advantages.py --shapes "$SHAPES" --repeats "$REPEATS" \
    --gamma 1.0 --lam 1.0 --no-loop --json "$OUT/gae1.json" || code=$?
  if [ -s "$OUT/gae.json" ] && [ -s "$OUT/gae1.json" ]; then
    echo "== auto's rule from these runs (benchmarks/auto_table.py)" >> "$OUT/gae.log"
    $PY benchmarks/auto_table.py "$OUT/gae.json" "$OUT/gae1.json" >> "$OUT/gae.log" 2>&1 || code=$?
  fi
  echo "== what bounds each method and the checks (profile_gae.py)" >> "$OUT/gae.log"
  bounded 20 "$OUT/gae.log" $PY benchmarks/profile_gae.py --shape "${SHAPES%%,*}" || code=$?
  step "gae (both regimes, auto's rule, XLA's account)" $code $((SECONDS - t)); grep -v WARNING "$OUT/gae.log"
fi
# credit: compute_advantages under every registered estimator at one shape (each compiles once), the credit
# kernels and compute_advantages under each credit mode, GiGPO, OTB's sum_pi_squared and every policy loss
# with its gradient, at their CPU benchmarks' sizes (the float64 loops run on the host).
if wanted credit; then
  t=$SECONDS; : > "$OUT/credit.log"; code=0
  bounded 25 "$OUT/credit.log" $PY benchmarks/bench_advantages.py --shapes "$ESTIMATORS_AT" --repeats "$REPEATS" \
    --gamma 0.99 --lam 0.95 --no-loop --estimators || code=$?
  bounded 15 "$OUT/credit.log" $PY benchmarks/bench_credit.py $CREDIT || code=$?
  bounded 10 "$OUT/credit.log" $PY benchmarks/bench_gigpo.py $GIGPO || code=$?
  bounded 8 "$OUT/credit.log" $PY benchmarks/bench_sum_pi_squared.py $SPS || code=$?
  bounded 12 "$OUT/credit.log" $PY benchmarks/bench_train_step.py --losses $LOSSES || code=$?
  step "credit (estimators, credit kernels, gigpo, sum_pi_squared, losses)" $code $((SECONDS - t))
  grep -v WARNING "$OUT/credit.log"
fi
# scorer: ModelScorer through score_arrays against the hand-batched loop, chunks of 8, 64 and 256 rows, with
# the PRM and with a model that costs nothing (the host path's overhead alone).
if wanted scorer; then
  t=$SECONDS; code=0
  for model in prm free; do
    echo "== ModelScorer, model $model" >> "$OUT/scorer_step.log"
    bounded 12 "$OUT/scorer_step.log" $PY benchmarks/bench_scorers.py $SCORER --only 4 --chunks 8,64,256 \
      --model $model || code=$?
  done
  step "scorer (ModelScorer chunks)" $code $((SECONDS - t)); grep -v WARNING "$OUT/scorer_step.log"
fi
# step: the train step with and without compute_advantages and the loss; a host round trip fails the part.
if wanted step; then
  t=$SECONDS; code=0
  for checks in off counts; do
    echo "== train step, --check-values $checks" >> "$OUT/scorer_step.log"
    bounded 15 "$OUT/scorer_step.log" $PY benchmarks/bench_train_step.py $STEP --check-values $checks || code=$?
  done
  step "train step" $code $((SECONDS - t)); grep -v WARNING "$OUT/scorer_step.log" | tail -40
fi

echo "total $((SECONDS - started)) s"
exit $failed
