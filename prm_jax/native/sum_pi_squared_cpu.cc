// sum_v pi_v^2 of each row's softmax(z / temperature) on the CPU, as an XLA FFI custom call (see
// prm_jax/native/_ffi.py and prm_jax/kernels/_otb.py's sum_pi_squared, OTB's input; verl's multi-turn OTB (verl-project/verl @ 1dda039b, core_algos.py compute_multi_turn_optimal_token_baseline_advantage; arXiv 2602.07078); prm-jax's rules where verl's break (the credit-assignment guide states each)).
//
// Per row of V logits, two passes: the maximum, then e = exp((z - max) / temperature) with the two sums
// s1 = sum e and s2 = sum e^2 in the same pass: sum pi^2 = s2 / s1^2. XLA:CPU computes this as separate fused
// loops, each with its own exponential (3.3 to 4 times one logsumexp over the same logits); here there is one
// exponential per logit, as in logsumexp. The loops keep kLanes independent partial sums (and maxima), so the
// compiler vectorizes them without reassociating a sum it must not; the exponential is a polynomial
// (Cody-Waite range reduction, degree-6 Taylor on [-ln2/2, ln2/2]; within 3e-7 relative of exp) written
// without branches, so it vectorizes too. On x86-64 Linux the row loop is also built for AVX2 + FMA and
// chosen when the library loads (target_clones). Rows are split over XLA's intra-op pool.

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "row_tasks.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using prm_jax::Completed;

constexpr int kLanes = 16;

// exp(x) for x <= 0 (a logit less its row's maximum). Below -87 (exp(-87) is near float's least normal), and
// at -inf, x is raised to -87: a term of at most 1.7e-38 against a sum of at least 1. NaN stays NaN. (The
// select is written on the bits: a conditional, or arithmetic on -inf, would stop the vectorizer or give NaN.)
inline __attribute__((always_inline)) float ExpNonPositive(float x) {
  const int32_t below = -static_cast<int32_t>(x < -87.0f);
  x = __builtin_bit_cast(float, (__builtin_bit_cast(int32_t, -87.0f) & below) | (__builtin_bit_cast(int32_t, x) & ~below));
  const float t = x * 1.44269504088896341f;                    // x / ln 2
  const float rounded = (t + 12582912.0f) - 12582912.0f;       // to the nearest integer (1.5 * 2^23 added)
  const float r = (x - rounded * 0.693145751953125f) - rounded * 1.428606765330187045e-06f;
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(rounded) + 127) << 23;  // 2^n, n in [-126, 0]
  return p * __builtin_bit_cast(float, bits);
}

#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__)
__attribute__((target_clones("avx2,fma", "default")))
#endif
void SumPiSquaredRows(const float* __restrict__ logits, float* __restrict__ out, int64_t begin, int64_t end,
                      int64_t vocab, float inverse_temperature) {
  for (int64_t b = begin; b < end; ++b) {
    const float* z = logits + b * vocab;
    float top[kLanes];
    for (int j = 0; j < kLanes; ++j) top[j] = -INFINITY;
    int64_t v = 0;
    for (; v + kLanes <= vocab; v += kLanes) {
      for (int j = 0; j < kLanes; ++j) top[j] = std::max(top[j], z[v + j]);
    }
    float highest = -INFINITY;
    for (int j = 0; j < kLanes; ++j) highest = std::max(highest, top[j]);
    for (; v < vocab; ++v) highest = std::max(highest, z[v]);
    float first[kLanes] = {}, second[kLanes] = {};
    v = 0;
    for (; v + kLanes <= vocab; v += kLanes) {
      for (int j = 0; j < kLanes; ++j) {
        const float e = ExpNonPositive((z[v + j] - highest) * inverse_temperature);
        first[j] += e;
        second[j] += e * e;
      }
    }
    double s1 = 0.0, s2 = 0.0;
    for (int j = 0; j < kLanes; ++j) {
      s1 += first[j];
      s2 += second[j];
    }
    for (; v < vocab; ++v) {
      const float e = ExpNonPositive((z[v] - highest) * inverse_temperature);
      s1 += e;
      s2 += static_cast<double>(e) * e;
    }
    // A row without a finite maximum (all -inf, or one holding +inf or NaN) has no distribution: NaN.
    out[b] = std::isfinite(highest) ? static_cast<float>(s2 / (s1 * s1)) : NAN;
  }
}

ffi::Future SumPiSquaredImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> logits, ffi::ResultBuffer<ffi::F32> out,
                             float temperature) {
  const auto dims = logits.dimensions();
  if (dims.size() == 0) return Completed(ffi::Error::InvalidArgument("sum_pi_squared needs a vocabulary axis"));
  if (!(temperature > 0.0f)) return Completed(ffi::Error::InvalidArgument("temperature must be > 0"));
  const int64_t vocab = dims.back();
  const int64_t rows = vocab == 0 ? 0 : static_cast<int64_t>(logits.element_count()) / vocab;
  const float* z = logits.typed_data();
  float* result = out->typed_data();
  const float inverse = 1.0f / temperature;
  return prm_jax::ForRowTasks(
      pool, rows, vocab, /*lanes=*/1,
      [=](int64_t begin, int64_t end) { SumPiSquaredRows(z, result, begin, end, vocab, inverse); },
      [] { return ffi::Error::Success(); });
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(PrmJaxSumPiSquared, SumPiSquaredImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()    // logits [..., V]
                                  .Ret<ffi::Buffer<ffi::F32>>()    // sum pi^2 [...]
                                  .Attr<float>("temperature"));
