// Turns on the CPU, as an XLA FFI custom call (see prm_jax/native/_ffi.py and prm_jax/kernels/_turns.py).
//
// For each row of T timesteps (turn id k_t, active flag m_t): n_t, the turn id of the row's next active
// timestep after t, or -1 where none follows. A turn continues at t where n_t equals k_t, so a hole in the
// loss mask inside a turn does not split it (the comparisons are left to XLA, which fuses them into their
// consumers: a byte of verdicts per timestep written here cost twice this pass). One reverse pass over the row-major buffers (on XLA:CPU the same
// answer takes a masked-carry scan or a reverse running minimum and a gather: several passes). As in
// gae_cpu.cc, four rows run side by side (four independent carries fill the pipeline), the carry is a
// branch-free select (holes alternate unpredictably), and large batches are split into blocks of rows on
// XLA's intra-op thread pool, the last block completing the returned future.

#include <cstdint>

#include "row_tasks.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using prm_jax::Completed;

inline int32_t Select(bool take_first, int32_t first, int32_t second) {
  const int32_t keep = -static_cast<int32_t>(take_first);
  return (first & keep) | (second & ~keep);
}

// The next active id of every timestep of rows [begin, end), right to left.
void NextActiveRows(const int32_t* __restrict__ id, const bool* __restrict__ active, int32_t* __restrict__ out,
                    int64_t begin, int64_t end, int64_t width) {
  int64_t r = begin;
  for (; r + 4 <= end; r += 4) {
    const int64_t b0 = r * width, b1 = b0 + width, b2 = b1 + width, b3 = b2 + width;
    int32_t f0 = -1, f1 = -1, f2 = -1, f3 = -1;
    for (int64_t t = width - 1; t >= 0; --t) {
      out[b0 + t] = f0;
      out[b1 + t] = f1;
      out[b2 + t] = f2;
      out[b3 + t] = f3;
      f0 = Select(active[b0 + t], id[b0 + t], f0);
      f1 = Select(active[b1 + t], id[b1 + t], f1);
      f2 = Select(active[b2 + t], id[b2 + t], f2);
      f3 = Select(active[b3 + t], id[b3 + t], f3);
    }
  }
  for (; r < end; ++r) {
    const int64_t base = r * width;
    int32_t following = -1;
    for (int64_t t = width - 1; t >= 0; --t) {
      out[base + t] = following;
      following = Select(active[base + t], id[base + t], following);
    }
  }
}

ffi::Future NextActiveIdsImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::S32> ids, ffi::Buffer<ffi::PRED> mask,
                              ffi::ResultBuffer<ffi::S32> next) {
  const auto dims = ids.dimensions();
  if (dims.size() == 0) return Completed(ffi::Error::InvalidArgument("turn ids need a time axis"));
  if (mask.element_count() != ids.element_count()) {
    return Completed(ffi::Error::InvalidArgument("turn ids and mask need the same shape"));
  }
  const int64_t width = dims.back();
  const int64_t rows = width == 0 ? 0 : static_cast<int64_t>(ids.element_count()) / width;
  const int32_t* id = ids.typed_data();
  const bool* active = mask.typed_data();
  int32_t* out = next->typed_data();
  return prm_jax::ForRowTasks(
      pool, rows, width, /*lanes=*/4,
      [=](int64_t begin, int64_t end) { NextActiveRows(id, active, out, begin, end, width); },
      [] { return ffi::Error::Success(); });
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(PrmJaxNextActiveIds, NextActiveIdsImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::S32>>()     // turn ids [..., T]
                                  .Arg<ffi::Buffer<ffi::PRED>>()    // active [..., T]
                                  .Ret<ffi::Buffer<ffi::S32>>());   // next active id [..., T], -1: none
