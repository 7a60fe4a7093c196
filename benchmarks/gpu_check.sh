#!/usr/bin/env bash
# The device check of issue 47, as one run: the kernel, pipeline and scorer-array tests on the GPU backend; the
# advantage benchmark (every GAE method, compute_advantages under every estimator, a roofline and a device copy
# of the same bytes) at the issue's five shapes, and what bounds each GAE method at 8192x2048 (profile_gae.py);
# the credit kernels, GiGPO, sum_pi_squared and the policy losses at their CPU benchmarks' sizes; ModelScorer
# against a hand-batched loop at chunks of 8, 64 and 256 rows; the train step with and without
# compute_advantages and the loss, and its host round trips.
#
# Device time is short (15 minutes, starts included), so every part has a time bound (425 s in all; each of
# its processes starts jax and the GPU anew, a few seconds) and the run leaves room for one rerun: PARTS names
# the parts to run (default: all, in this order: bench bench1 profile credit scorer step tests), e.g.
# PARTS="tests scorer" to rerun two. Each part writes its log under $OUT as it goes (a part cut by its bound
# still leaves the figures it printed), prints its wall time, and a failed or cut part makes the exit status
# non-zero; an import of jax or of this checkout's prm_jax that fails stops the run at once. On the device:
#   run(command="bash benchmarks/gpu_check.sh", carry=[".gpu-wheels"], timeout_s=480)
#
# The device's image (the device tool's KINDS.md) has jax, chex, flax, optax, anyio, pyyaml, httpx, pytest,
# pytest-xdist and hypothesis but not msgspec (a run-time dependency): `python3 dev.py gpu` downloads its
# wheels into .gpu-wheels/ (carry it), and this script unpacks the one for the device's Python when msgspec
# is missing.
# `python3 dev.py gpu` also dry-runs this script on the CPU, in a virtual environment holding what the image
# holds, with tiny shapes:
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
ALL_PARTS="bench bench1 profile credit scorer step tests"
PARTS=${PARTS:-$ALL_PARTS}
for part in $PARTS; do  # a misspelt part would otherwise run nothing and pass
  [[ " $ALL_PARTS " == *" $part "* ]] || { echo "PARTS: no part named '$part' (the parts: $ALL_PARTS)"; exit 2; }
done
# The issue's shapes, the one its bandwidth question is asked at first (a part cut short keeps the first).
SHAPES=8192x2048,1024x32768,256x8192,64x8192,16x32768
if [ "${DRY_RUN:-0}" = 1 ]; then
  SHAPES=8x256,4x512; REPEATS=2; STEP="--rows 16 --width 256 --repeats 2"
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

# bench: every GAE method, compute_advantages (unchecked, checked, under every registered estimator), the
# roofline and the device copy at the five shapes, float32, gamma*lam < 1; first calls (compile) apart.
if wanted bench; then
  t=$SECONDS; : > "$OUT/bench.log"
  bounded 90 "$OUT/bench.log" $PY benchmarks/bench_advantages.py --shapes "$SHAPES" --repeats "$REPEATS" \
    --gamma 0.99 --lam 0.95 --no-loop --estimators --json "$OUT/bench.json"
  step "bench (gamma=0.99 lam=0.95, estimators)" $? $((SECONDS - t)); grep -v WARNING "$OUT/bench.log" | tail -150
fi
# bench1: the GAE methods again at gamma = lam = 1 (cumsum joins): auto's other regime.
if wanted bench1; then
  t=$SECONDS; : > "$OUT/bench1.log"
  bounded 35 "$OUT/bench1.log" $PY benchmarks/bench_advantages.py --shapes "$SHAPES" --repeats "$REPEATS" \
    --gamma 1.0 --lam 1.0 --no-loop --json "$OUT/bench1.json"
  step "bench1 (gamma=lam=1)" $? $((SECONDS - t)); grep -v WARNING "$OUT/bench1.log" | tail -70
fi
# auto's rule as these runs measured it, and the README's table (benchmarks/auto_table.py).
if [ -s "$OUT/bench.json" ] && [ -s "$OUT/bench1.json" ]; then
  $PY benchmarks/auto_table.py "$OUT/bench.json" "$OUT/bench1.json" > "$OUT/auto_table.md" 2>&1
  step "auto_table" $? 0; cat "$OUT/auto_table.md"
fi
# profile: what bounds each GAE method at 8192x2048 (XLA's bytes and launches; a profiler trace under $OUT).
if wanted profile; then
  t=$SECONDS; : > "$OUT/profile.log"
  bounded 25 "$OUT/profile.log" $PY benchmarks/profile_gae.py --shape "${SHAPES%%,*}" --trace "$OUT/profile"
  step "profile" $? $((SECONDS - t)); grep -v WARNING "$OUT/profile.log"
fi
# credit: the credit kernels and compute_advantages under each credit mode, GiGPO, OTB's sum_pi_squared and
# every policy loss with its gradient, at their CPU benchmarks' sizes (the float64 loops run on the host).
if wanted credit; then
  t=$SECONDS; : > "$OUT/credit.log"
  code=0
  bounded 20 "$OUT/credit.log" $PY benchmarks/bench_credit.py $CREDIT || code=$?
  bounded 20 "$OUT/credit.log" $PY benchmarks/bench_gigpo.py $GIGPO || code=$?
  bounded 15 "$OUT/credit.log" $PY benchmarks/bench_sum_pi_squared.py $SPS || code=$?
  bounded 20 "$OUT/credit.log" $PY benchmarks/bench_train_step.py --losses $LOSSES || code=$?
  step "credit, gigpo, sum_pi_squared, losses" $code $((SECONDS - t)); grep -v WARNING "$OUT/credit.log"
fi
# scorer: ModelScorer through score_arrays against the hand-batched loop, chunks of 8, 64 and 256 rows.
if wanted scorer; then
  t=$SECONDS; : > "$OUT/scorer.log"
  bounded 40 "$OUT/scorer.log" $PY benchmarks/bench_scorers.py $SCORER --only 4 --chunks 8,64,256
  step "ModelScorer chunks" $? $((SECONDS - t)); grep -v WARNING "$OUT/scorer.log"
fi
# step: the train step with and without compute_advantages and the loss; a host round trip fails the part.
if wanted step; then
  t=$SECONDS; : > "$OUT/step.log"
  code=0
  for checks in off counts; do
    echo "--check-values $checks" >> "$OUT/step.log"
    bounded 20 "$OUT/step.log" $PY benchmarks/bench_train_step.py $STEP --check-values $checks || code=$?
  done
  step "train step" $code $((SECONDS - t)); grep -v WARNING "$OUT/step.log"
fi
# tests: the kernel, pipeline and scorer-array tests on this backend, in WORKERS pytest-xdist processes (the
# image has pytest-xdist; compiling is most of a test's time and runs on the host's cores), test by test in
# the order given: the backend-dependent paths first (the GAE methods auto picks here, GiGPO's sort, OTB's
# scatter, the option matrix, the arrays path and ModelScorer), then every other kernel test while the bound
# allows; one line per test, so a cut run still says how far it got. CPU-only tests (the native kernel)
# report their skip reason. A dry run collects every file and runs two.
if wanted tests; then
  t=$SECONDS
  first=(tests/kernels/test_recurrence.py tests/kernels/test_token_gae.py tests/kernels/test_strategy.py
         tests/kernels/test_gigpo.py tests/kernels/test_otb.py tests/kernels/test_alignment.py
         tests/kernels/test_matrix.py tests/runtime/test_arrays.py tests/runtime/test_model_scorer.py
         tests/test_stage_inputs.py)
  rest=$(ls tests/kernels/test_*.py | grep -v -F -x -f <(printf '%s\n' "${first[@]}"))
  if [ "${DRY_RUN:-0}" = 1 ]; then  # every file collected (its imports in this environment), two of them run
    $PY -m pytest -q --collect-only -p no:cacheprovider "${first[@]}" $rest > "$OUT/tests.collect.log" 2>&1 \
      || { step "tests collected" 1 $((SECONDS - t)); tail -30 "$OUT/tests.collect.log"; }
    first=(tests/kernels/test_strategy.py tests/runtime/test_model_scorer.py); rest=""
  fi
  workers=${WORKERS:-$(( $(nproc) / 2 > 1 ? $(nproc) / 2 : 1 ))}
  rm -f "$OUT/tests.log" "$OUT/failures.log"
  # (each failure's traceback written as it fails, tests/conftest.py: a run cut by its bound still says why)
  PRM_JAX_FAILURES="$OUT/failures.log" XLA_PYTHON_CLIENT_PREALLOCATE=false bounded 120 "$OUT/tests.log" \
    $PY -m pytest -v -p no:cacheprovider -rs -n "$workers" --dist load "${first[@]}" $rest
  code=$?
  counts="$(grep -c -E " PASSED( |$)" "$OUT/tests.log") passed, $(grep -c -E " SKIPPED( |$)" "$OUT/tests.log") \
skipped, $(grep -c -E " (FAILED|ERROR)( |$)" "$OUT/tests.log") failed or errors"
  step "tests ($counts; $workers workers; $(tail -1 "$OUT/tests.log"))" $code $((SECONDS - t))
  grep -E " (FAILED|ERROR)( |$)|^(FAILED|ERROR) " "$OUT/tests.log" | head -40
  [ -s "$OUT/failures.log" ] && { echo "tracebacks: $OUT/failures.log"; head -c 20000 "$OUT/failures.log"; }
fi

echo "total $((SECONDS - started)) s"
exit $failed
