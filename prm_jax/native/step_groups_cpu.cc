// GiGPO's step groups on the CPU, as an XLA FFI custom call (see prm_jax/native/_ffi.py).
//
// For each row of N entries (group g_i, anchor a_i): entries with a_i >= 0 and the same (g, a) pair form
// one step group, named by the index of its first entry; an entry with a_i < 0 (no anchor) is a group of
// its own. One pass with an open-addressing hash table (linear probing, at most half full) replaces the
// sort that XLA:CPU needs otherwise (a value sort of 32k keys costs ~1 ms there; this pass ~0.1 ms).

#include <cstdint>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

inline uint64_t Mix(uint64_t key) {  // splitmix64's finalizer: anchors are often small consecutive ids
  key ^= key >> 30;
  key *= 0xbf58476d1ce4e5b9ull;
  key ^= key >> 27;
  key *= 0x94d049bb133111ebull;
  return key ^ (key >> 31);
}

void StepGroupsRow(const int32_t* group, const int32_t* anchor, int32_t* segment, int64_t size,
                   std::vector<int64_t>& keys, std::vector<int32_t>& firsts) {
  uint64_t slots = 2;
  while (slots < 2 * static_cast<uint64_t>(size)) slots <<= 1;
  keys.assign(slots, -1);
  firsts.resize(slots);
  const uint64_t mask = slots - 1;
  for (int64_t i = 0; i < size; ++i) {
    if (anchor[i] < 0) {
      segment[i] = static_cast<int32_t>(i);
      continue;
    }
    // Both halves non-negative, so no pair collides with the empty marker -1.
    const int64_t key = (static_cast<int64_t>(static_cast<uint32_t>(group[i])) << 32) | anchor[i];
    uint64_t slot = Mix(static_cast<uint64_t>(key)) & mask;
    while (keys[slot] != -1 && keys[slot] != key) slot = (slot + 1) & mask;
    if (keys[slot] == -1) {
      keys[slot] = key;
      firsts[slot] = static_cast<int32_t>(i);
    }
    segment[i] = firsts[slot];
  }
}

ffi::Error StepGroupsImpl(ffi::Buffer<ffi::S32> group, ffi::Buffer<ffi::S32> anchor,
                          ffi::ResultBuffer<ffi::S32> segment) {
  const auto dims = group.dimensions();
  if (dims.size() == 0) return ffi::Error::InvalidArgument("step groups need an entry axis");
  if (anchor.element_count() != group.element_count()) {
    return ffi::Error::InvalidArgument("group and anchor need the same shape");
  }
  const int64_t size = dims.back();
  if (size >= (int64_t{1} << 31)) return ffi::Error::InvalidArgument("too many entries for int32 segment ids");
  const int64_t rows = size == 0 ? 0 : static_cast<int64_t>(group.element_count()) / size;
  std::vector<int64_t> keys;
  std::vector<int32_t> firsts;
  for (int64_t r = 0; r < rows; ++r) {
    StepGroupsRow(group.typed_data() + r * size, anchor.typed_data() + r * size,
                  segment->typed_data() + r * size, size, keys, firsts);
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(PrmJaxStepGroups, StepGroupsImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::S32>>()   // group [..., N]
                                  .Arg<ffi::Buffer<ffi::S32>>()   // anchor [..., N], -1 = none
                                  .Ret<ffi::Buffer<ffi::S32>>()); // segment [..., N]
