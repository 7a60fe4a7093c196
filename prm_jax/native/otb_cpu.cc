// The optimal token baseline's alignment by generated-token index on the CPU, as two XLA FFI custom calls
// (see prm_jax/native/_ffi.py and prm_jax/kernels/_otb.py, whose module docstring states the rule;
// verl's multi-turn OTB (verl-project/verl @ 1dda039b, core_algos.py compute_multi_turn_optimal_token_baseline_advantage; arXiv 2602.07078); prm-jax's rules where verl's break (the credit-assignment guide states each)). OTB's baseline is taken per group and per generated-token index k (holes such as
// tool outputs removed), so each row is compacted before the group sums and put back after; XLA:CPU does
// that with a scatter and a gather, several times plain GAE's whole pipeline at 256 x 8192. Here each is
// one pass over a row's row-major buffers (rows split over XLA's intra-op pool); the group sums and the
// baselines stay in XLA (a small matrix product per group).
//
//   PrmJaxOtbCompact: rewards, token weights w, trained mask [rows, width] -> the row's reward-to-go G_k and
//     running weight W_k over its trained timesteps, compacted to k = 0 .. L - 1 and 0 after; L [rows].
//   PrmJaxOtbExpand: G_k [rows, width], the groups' baselines B [groups, width], each row's group and cut
//     [rows], the trained mask -> advantages G_k - (k < cut ? B[group, k] : 0) and returns G_k at the row's
//     k-th trained timestep, 0 at the others.

#include <cstdint>

#include "row_tasks.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using prm_jax::Completed;

void CompactRows(const float* __restrict__ reward, const float* __restrict__ weight, const bool* __restrict__ active,
                 float* __restrict__ to_go, float* __restrict__ running, int32_t* __restrict__ length,
                 int64_t begin, int64_t end, int64_t width) {
  for (int64_t b = begin; b < end; ++b) {
    const int64_t base = b * width;
    int64_t k = 0;
    float total = 0.0f;
    for (int64_t t = 0; t < width; ++t) {  // (the mask's spans are long: a branch predicts well)
      if (active[base + t]) {
        total += weight[base + t];
        running[base + k] = total;
        to_go[base + k] = reward[base + t];
        ++k;
      }
    }
    float sum = 0.0f;
    for (int64_t j = k - 1; j >= 0; --j) {
      sum += to_go[base + j];
      to_go[base + j] = sum;
    }
    for (int64_t j = k; j < width; ++j) {
      running[base + j] = 0.0f;
      to_go[base + j] = 0.0f;
    }
    length[b] = static_cast<int32_t>(k);
  }
}

void ExpandRows(const float* __restrict__ to_go, const float* __restrict__ baseline, const int32_t* __restrict__ group,
                const int32_t* __restrict__ cut, const bool* __restrict__ active, float* __restrict__ advantages,
                float* __restrict__ returns, int64_t begin, int64_t end, int64_t width) {
  for (int64_t b = begin; b < end; ++b) {
    const int64_t base = b * width;
    const float* row_baseline = baseline + static_cast<int64_t>(group[b]) * width;
    const int64_t until = cut[b];
    int64_t k = 0;
    for (int64_t t = 0; t < width; ++t) {
      if (active[base + t]) {
        const float g = to_go[base + k];
        advantages[base + t] = k < until ? g - row_baseline[k] : g;
        returns[base + t] = g;
        ++k;
      } else {
        advantages[base + t] = 0.0f;
        returns[base + t] = 0.0f;
      }
    }
  }
}

// The rows of a [rows, width] buffer's dimensions (-1 for another rank), and its width.
template <typename Dims>
int64_t RowsOf(const Dims& dims, int64_t* width) {
  *width = dims.size() == 2 ? dims[1] : 0;
  return dims.size() == 2 ? dims[0] : -1;
}

ffi::Future CompactImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> rewards, ffi::Buffer<ffi::F32> weights,
                        ffi::Buffer<ffi::PRED> mask, ffi::ResultBuffer<ffi::F32> to_go,
                        ffi::ResultBuffer<ffi::F32> running, ffi::ResultBuffer<ffi::S32> lengths) {
  int64_t width = 0;
  const int64_t rows = RowsOf(rewards.dimensions(), &width);
  if (rows < 0) return Completed(ffi::Error::InvalidArgument("OTB takes [rows, width] arrays"));
  if (weights.element_count() != rewards.element_count() || mask.element_count() != rewards.element_count()) {
    return Completed(ffi::Error::InvalidArgument("OTB's rewards, weights and mask need the same shape"));
  }
  const float* reward = rewards.typed_data();
  const float* weight = weights.typed_data();
  const bool* active = mask.typed_data();
  float* g = to_go->typed_data();
  float* w = running->typed_data();
  int32_t* length = lengths->typed_data();
  return prm_jax::ForRowTasks(
      pool, rows, width, /*lanes=*/1,
      [=](int64_t begin, int64_t end) { CompactRows(reward, weight, active, g, w, length, begin, end, width); },
      [] { return ffi::Error::Success(); });
}

ffi::Future ExpandImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> to_go, ffi::Buffer<ffi::F32> baselines,
                       ffi::Buffer<ffi::S32> groups, ffi::Buffer<ffi::S32> cuts, ffi::Buffer<ffi::PRED> mask,
                       ffi::ResultBuffer<ffi::F32> advantages, ffi::ResultBuffer<ffi::F32> returns) {
  int64_t width = 0, baseline_width = 0;
  const int64_t rows = RowsOf(to_go.dimensions(), &width);
  const int64_t num_groups = RowsOf(baselines.dimensions(), &baseline_width);
  if (rows < 0 || num_groups < 0 || baseline_width != width) {
    return Completed(ffi::Error::InvalidArgument("OTB's returns and baselines need [rows, width], [groups, width]"));
  }
  if (static_cast<int64_t>(groups.element_count()) != rows || static_cast<int64_t>(cuts.element_count()) != rows ||
      static_cast<int64_t>(mask.element_count()) != rows * width) {
    return Completed(ffi::Error::InvalidArgument("OTB needs one group and one cut per row, and a [rows, width] mask"));
  }
  const int32_t* group = groups.typed_data();
  for (int64_t b = 0; b < rows; ++b) {  // (read as an offset: never outside the baselines)
    if (group[b] < 0 || group[b] >= num_groups) {
      return Completed(ffi::Error::InvalidArgument("OTB: a row's group is out of range"));
    }
  }
  const float* g = to_go.typed_data();
  const float* baseline = baselines.typed_data();
  const int32_t* cut = cuts.typed_data();
  const bool* active = mask.typed_data();
  float* a = advantages->typed_data();
  float* r = returns->typed_data();
  return prm_jax::ForRowTasks(
      pool, rows, width, /*lanes=*/1,
      [=](int64_t begin, int64_t end) { ExpandRows(g, baseline, group, cut, active, a, r, begin, end, width); },
      [] { return ffi::Error::Success(); });
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(PrmJaxOtbCompact, CompactImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()    // rewards [rows, width]
                                  .Arg<ffi::Buffer<ffi::F32>>()    // token weights w [rows, width]
                                  .Arg<ffi::Buffer<ffi::PRED>>()   // trained timesteps [rows, width]
                                  .Ret<ffi::Buffer<ffi::F32>>()    // G_k, compacted [rows, width]
                                  .Ret<ffi::Buffer<ffi::F32>>()    // W_k, compacted [rows, width]
                                  .Ret<ffi::Buffer<ffi::S32>>());  // trained timesteps per row [rows]

XLA_FFI_DEFINE_HANDLER_SYMBOL(PrmJaxOtbExpand, ExpandImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()    // G_k, compacted [rows, width]
                                  .Arg<ffi::Buffer<ffi::F32>>()    // each group's baseline B_k [groups, width]
                                  .Arg<ffi::Buffer<ffi::S32>>()    // each row's group [rows]
                                  .Arg<ffi::Buffer<ffi::S32>>()    // each row's cut: B = 0 from k = cut on [rows]
                                  .Arg<ffi::Buffer<ffi::PRED>>()   // trained timesteps [rows, width]
                                  .Ret<ffi::Buffer<ffi::F32>>()    // advantages [rows, width]
                                  .Ret<ffi::Buffer<ffi::F32>>());  // returns [rows, width]
