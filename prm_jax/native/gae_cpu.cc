// GAE with masked carry on the CPU, as an XLA FFI custom call (see prm_jax/native/_ffi.py).
//
// For each row, right to left, from last = 0 and nextv = bootstrap:
//   mask_t = 1:  last = r_t + gamma * nextv - V_t + gamma_lam * last;  nextv = V_t
//   mask_t = 0:  last and nextv carried unchanged
//   A_t = last,  returns_t = A_t + V_t
// The mask is bool, or float32 (as verl and tunix pass it): a float entry is active when nonzero, and the
// kernel checks prm_jax.kernels._checks.mask_check's rule (every entry is 0 or 1; NaN is not) as it
// reads the mask: a violation fails the call with mask_check's message for the first bad entry in
// row-major order, so the rule costs no second pass over the mask and no host round trip.
// Rows are processed four at a time: four independent dependency chains overlap in the pipeline while
// the 4 rows x 5 arrays = 20 backward streams stay within what the hardware prefetchers follow (8 rows
// measured 2x slower, 1 row 2x slower). On x86 the four rows share SSE registers (GaeBlocksSse), which
// cuts the instructions per element several-fold; elsewhere, and for the leftover rows and timesteps,
// the scalar loop runs. Large batches are split into blocks of rows run on XLA's intra-op thread pool,
// and the handler returns an ffi::Future that the last block completes (no executor thread waits).

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <utility>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "row_tasks.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using prm_jax::Completed;

constexpr int64_t kLanes = 4;

// A branch-free select: masks of generated and tool tokens alternate unpredictably, and a mispredicted
// branch per token would cost more than the whole update.
inline float Select(bool take_first, float first, float second) {
  uint32_t a, b;
  std::memcpy(&a, &first, sizeof a);
  std::memcpy(&b, &second, sizeof b);
  const uint32_t keep = 0u - static_cast<uint32_t>(take_first);
  const uint32_t bits = (a & keep) | (b & ~keep);
  float out;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}

// A mask entry read as active, and whether it breaks the 0/1 rule (mask_check's: x != 0 and x != 1, so
// NaN breaks it and -0.0 does not). Bool entries never do.
inline bool Active(bool m) { return m; }
inline bool Active(float m) { return m != 0.0f; }
inline int32_t NotBinary(bool) { return 0; }
inline int32_t NotBinary(float m) { return static_cast<int32_t>((m != 0.0f) & (m != 1.0f)); }

// The recurrence over timesteps [t_begin, t_end) of rows [base, base + lanes), right to left, from and
// into the carried state; not_binary[j] counts row base + j's entries that break the 0/1 rule.
template <typename Mask>
void GaeSteps(const float* rewards, const float* values, const Mask* mask, const float* gamma,
              const float* gamma_lam, float* advantages, float* returns, int64_t base, int64_t lanes,
              int64_t width, int64_t t_begin, int64_t t_end, float* last, float* next_value,
              int32_t* not_binary) {
  for (int64_t t = t_end - 1; t >= t_begin; --t) {
    for (int64_t j = 0; j < lanes; ++j) {
      const int64_t i = (base + j) * width + t;
      const float value = values[i];
      const float updated = rewards[i] + gamma[base + j] * next_value[j] - value + gamma_lam[base + j] * last[j];
      const bool active = Active(mask[i]);
      not_binary[j] += NotBinary(mask[i]);
      last[j] = Select(active, updated, last[j]);
      next_value[j] = Select(active, value, next_value[j]);
      advantages[i] = last[j];
      returns[i] = last[j] + value;
    }
  }
}

#if defined(__SSE2__)
// The same recurrence for exactly four rows with one SSE register per quantity (lane j = row base + j),
// over whole blocks of four timesteps at the right end of the rows: each block's 4x4 tiles are
// transposed to put a timestep of all four rows in one register and back. The arithmetic is the scalar
// one, in the same order, so both paths give the same bits. Timesteps [0, returned value) are left to
// the scalar loop, with the carried state in last_io/next_value_io.
static_assert(kLanes == 4, "GaeBlocksSse holds one row per SSE lane");
// inactive[k]: all-ones lanes where timestep t0 + k of the four rows is inactive, from a 4x4 mask tile.
struct MaskTile {
  __m128 inactive[4];
};

inline MaskTile LoadTile(const bool* mask, const int64_t* row, __m128i* /*not_binary*/) {
  int32_t mask_bytes[4];
  for (int j = 0; j < 4; ++j) std::memcpy(&mask_bytes[j], mask + row[j], 4);
  const __m128i m = _mm_setr_epi32(mask_bytes[0], mask_bytes[1], mask_bytes[2], mask_bytes[3]);
  const __m128i low_byte = _mm_set1_epi32(0xFF);
  MaskTile tile;
  for (int k = 0; k < 4; ++k) {
    const __m128i byte = _mm_and_si128(_mm_srl_epi32(m, _mm_cvtsi32_si128(8 * k)), low_byte);
    tile.inactive[k] = _mm_castsi128_ps(_mm_cmpeq_epi32(byte, _mm_setzero_si128()));
  }
  return tile;
}

inline MaskTile LoadTile(const float* mask, const int64_t* row, __m128i* not_binary) {
  __m128 m[4];
  for (int j = 0; j < 4; ++j) m[j] = _mm_loadu_ps(mask + row[j]);
  _MM_TRANSPOSE4_PS(m[0], m[1], m[2], m[3]);  // m[k]: timestep t0 + k of the four rows
  const __m128 zero = _mm_setzero_ps();
  const __m128 one = _mm_set1_ps(1.0f);
  MaskTile tile;
  for (int k = 0; k < 4; ++k) {
    tile.inactive[k] = _mm_cmpeq_ps(m[k], zero);  // NaN != 0: active, as in Active()
    const __m128 bad = _mm_and_ps(_mm_cmpneq_ps(m[k], zero), _mm_cmpneq_ps(m[k], one));  // unordered: NaN is bad
    *not_binary = _mm_sub_epi32(*not_binary, _mm_castps_si128(bad));  // a bad lane is -1
  }
  return tile;
}

template <typename Mask>
int64_t GaeBlocksSse(const float* rewards, const float* values, const Mask* mask, const float* gamma,
                     const float* gamma_lam, float* advantages, float* returns, int64_t base, int64_t width,
                     float* last_io, float* next_value_io, int32_t* not_binary_io) {
  const __m128 g = _mm_loadu_ps(gamma + base);
  const __m128 gl = _mm_loadu_ps(gamma_lam + base);
  __m128 last = _mm_loadu_ps(last_io);
  __m128 next_value = _mm_loadu_ps(next_value_io);
  __m128i not_binary = _mm_loadu_si128(reinterpret_cast<const __m128i*>(not_binary_io));
  const int64_t t_begin = width % 4;
  for (int64_t t0 = width - 4; t0 >= t_begin; t0 -= 4) {
    int64_t row[4];
    __m128 r[4], v[4], adv[4], ret[4];
    for (int j = 0; j < 4; ++j) {
      row[j] = (base + j) * width + t0;
      r[j] = _mm_loadu_ps(rewards + row[j]);
      v[j] = _mm_loadu_ps(values + row[j]);
    }
    _MM_TRANSPOSE4_PS(r[0], r[1], r[2], r[3]);  // r[k]: timestep t0 + k of the four rows
    _MM_TRANSPOSE4_PS(v[0], v[1], v[2], v[3]);
    const MaskTile tile = LoadTile(mask, row, &not_binary);
    for (int k = 3; k >= 0; --k) {
      const __m128 inactive = tile.inactive[k];
      const __m128 updated =
          _mm_add_ps(_mm_sub_ps(_mm_add_ps(r[k], _mm_mul_ps(g, next_value)), v[k]), _mm_mul_ps(gl, last));
      last = _mm_or_ps(_mm_andnot_ps(inactive, updated), _mm_and_ps(inactive, last));
      next_value = _mm_or_ps(_mm_andnot_ps(inactive, v[k]), _mm_and_ps(inactive, next_value));
      adv[k] = last;
      ret[k] = _mm_add_ps(last, v[k]);
    }
    _MM_TRANSPOSE4_PS(adv[0], adv[1], adv[2], adv[3]);  // back to rows
    _MM_TRANSPOSE4_PS(ret[0], ret[1], ret[2], ret[3]);
    for (int j = 0; j < 4; ++j) {
      _mm_storeu_ps(advantages + row[j], adv[j]);
      _mm_storeu_ps(returns + row[j], ret[j]);
    }
  }
  _mm_storeu_ps(last_io, last);
  _mm_storeu_ps(next_value_io, next_value);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(not_binary_io), not_binary);
  return t_begin;
}
#endif

// Runs rows [row_begin, row_end); returns how many of their mask entries break the 0/1 rule.
template <typename Mask>
int64_t GaeRows(const float* rewards, const float* values, const Mask* mask, const float* gamma,
                const float* gamma_lam, const float* bootstrap, float* advantages, float* returns,
                int64_t row_begin, int64_t row_end, int64_t width) {
  int64_t not_binary_total = 0;
  for (int64_t base = row_begin; base < row_end; base += kLanes) {
    const int64_t lanes = std::min(kLanes, row_end - base);
    float last[kLanes] = {0};
    float next_value[kLanes] = {0};
    alignas(16) int32_t not_binary[kLanes] = {0};
    for (int64_t j = 0; j < lanes; ++j) next_value[j] = bootstrap[base + j];
    int64_t t_end = width;
#if defined(__SSE2__)
    if (lanes == 4) {
      t_end = GaeBlocksSse(rewards, values, mask, gamma, gamma_lam, advantages, returns, base, width, last,
                           next_value, not_binary);
    }
#endif
    GaeSteps(rewards, values, mask, gamma, gamma_lam, advantages, returns, base, lanes, width, 0, t_end, last,
             next_value, not_binary);
    for (int64_t j = 0; j < lanes; ++j) not_binary_total += not_binary[j];
  }
  return not_binary_total;
}

// The flat index of the first entry of rows [row_begin, row_end) that breaks the 0/1 rule, or -1 (a
// second pass over those rows, run only when the first found one).
template <typename Mask>
int64_t FirstNotBinary(const Mask* mask, int64_t row_begin, int64_t row_end, int64_t width) {
  for (int64_t i = row_begin * width; i < row_end * width; ++i) {
    if (NotBinary(mask[i])) return i;
  }
  return -1;
}

// mask_check's message (prm_jax/kernels/_checks.py), for the entry at flat index `first`.
template <typename Mask>
ffi::Error NotBinaryError(const Mask* mask, int64_t first, int64_t width) {
  char message[160];
  std::snprintf(message, sizeof message, "mask must be bool or hold only 0 and 1; row %lld, position %lld holds %.9g",
                static_cast<long long>(first / width), static_cast<long long>(first % width),
                static_cast<double>(mask[first]));
  return ffi::Error::InvalidArgument(message);
}

// Returns a future instead of blocking an executor thread: large batches are split into tasks on XLA's
// intra-op pool, and the last task to finish completes the future.
template <ffi::DataType MaskType>
ffi::Future GaeImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> rewards, ffi::Buffer<ffi::F32> values,
                    ffi::Buffer<MaskType> mask, ffi::Buffer<ffi::F32> gamma, ffi::Buffer<ffi::F32> gamma_lam,
                    ffi::Buffer<ffi::F32> bootstrap, ffi::ResultBuffer<ffi::F32> advantages,
                    ffi::ResultBuffer<ffi::F32> returns) {
  const auto dims = rewards.dimensions();
  if (dims.size() == 0) return Completed(ffi::Error::InvalidArgument("rewards must have a time axis"));
  const int64_t width = dims.back();
  const int64_t rows = width == 0 ? 0 : static_cast<int64_t>(rewards.element_count()) / width;
  if (static_cast<int64_t>(gamma.element_count()) != rows || static_cast<int64_t>(gamma_lam.element_count()) != rows ||
      static_cast<int64_t>(bootstrap.element_count()) != rows) {
    return Completed(ffi::Error::InvalidArgument("gamma, gamma_lam and bootstrap need one value per row"));
  }
  const float* r = rewards.typed_data();
  const float* v = values.typed_data();
  const auto* m = mask.typed_data();
  const float* g = gamma.typed_data();
  const float* gl = gamma_lam.typed_data();
  const float* b = bootstrap.typed_data();
  float* a = advantages->typed_data();
  float* ret = returns->typed_data();

  // Each task records the smallest flat index of a bad mask entry it found, so the error names the first
  // one in row-major order whichever task found it.
  auto first_bad = std::make_shared<std::atomic<int64_t>>(std::numeric_limits<int64_t>::max());
  auto work = [=](int64_t begin, int64_t end) {
    if (GaeRows(r, v, m, g, gl, b, a, ret, begin, end, width) == 0) return;
    const int64_t first = FirstNotBinary(m, begin, end, width);
    int64_t seen = first_bad->load();
    while (first < seen && !first_bad->compare_exchange_weak(seen, first)) {
    }
  };
  auto finish = [=]() {
    const int64_t first = first_bad->load();
    return first == std::numeric_limits<int64_t>::max() ? ffi::Error::Success() : NotBinaryError(m, first, width);
  };
  return prm_jax::ForRowTasks(pool, rows, width, kLanes, work, finish);
}

}  // namespace

#define PRM_JAX_GAE_HANDLER(name, mask_type)                                                      \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(name, GaeImpl<mask_type>,                                          \
                                ffi::Ffi::Bind()                                                     \
                                    .Ctx<ffi::ThreadPool>()                                          \
                                    .Arg<ffi::Buffer<ffi::F32>>()   /* rewards [..., T] */           \
                                    .Arg<ffi::Buffer<ffi::F32>>()   /* values [..., T] */            \
                                    .Arg<ffi::Buffer<mask_type>>()  /* mask [..., T] */              \
                                    .Arg<ffi::Buffer<ffi::F32>>()   /* gamma [...] */                \
                                    .Arg<ffi::Buffer<ffi::F32>>()   /* gamma * lam [...] */          \
                                    .Arg<ffi::Buffer<ffi::F32>>()   /* bootstrap [...] */            \
                                    .Ret<ffi::Buffer<ffi::F32>>()   /* advantages [..., T] */        \
                                    .Ret<ffi::Buffer<ffi::F32>>()); /* returns [..., T] */

PRM_JAX_GAE_HANDLER(PrmJaxGaeF32, ffi::PRED)
PRM_JAX_GAE_HANDLER(PrmJaxGaeF32FloatMask, ffi::F32)

// The XLA FFI API version of the headers this library was compiled against (major * 1000 + minor): XLA
// refuses, at registration, a handler of a newer API than its own; prm-jax doctor prints it.
extern "C" int PrmJaxFfiApiVersion() { return XLA_FFI_API_MAJOR * 1000 + XLA_FFI_API_MINOR; }
