// A trainer's token arrays surveyed in one pass, on the host (called through ctypes on numpy buffers, whatever
// the JAX backend; see prm_jax/native/_ffi.py's survey_rows and prm_jax/runtime/_arrays.py).
//
// score_arrays must check every row before a model reads it: token ids in [0, 2^31 - 1], and AReaL's turn rule
// (a run of a row's turn tokens starts where the left neighbour is not a turn token or holds another id; the
// runs' ids, in order, are 0, 1, 2, ...), where a turn token has turn id >= 0 and attention. In numpy those
// checks are a dozen passes over the [B, T] int64 arrays (about half the row path's time beside a model that
// costs nothing, issue 56.6). Here: one pass over each array. Per row: the number of turns (-1 where the
// rule breaks: the caller names the row and what is wrong) and its length (last attended position + 1).
// Returned flags: 1, a token id out of range (the caller finds it); 2, a turn id >= 0 without attention; 4, an
// attention value other than 0 and 1.
//
// Most of a row is long stretches of one turn id and one attention value (a turn's tokens, a tool's output,
// the padding), so the rule is walked a block of 16 positions at a time: a block whose ids and attention
// words all equal its first position's (a comparison the compiler vectorizes) takes one step of the rule;
// any other block takes a step per position.

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace {

constexpr int64_t kBlock = 16;

struct RowState {
  int64_t last = -1;      // the id of the row's last turn token (valid: prev_valid)
  bool prev_valid = false;
  int64_t runs = 0;
  bool broken = false;
  bool outside = false;
  uint64_t attention_bits = 0;  // every attention value read, OR-ed: above 1 where one is not 0 or 1
  int64_t length = 0;
};

// One position of the rule (`attention`: the mask's value read unsigned).
inline void Step(RowState& s, int64_t id, uint64_t attention, int64_t t) {
  const bool attends = attention != 0;
  s.attention_bits |= attention;
  const bool present = id >= 0;
  const bool valid = present && attends;
  s.outside |= present && !attends;
  if (attends) s.length = t + 1;
  if (valid) {
    if (!s.prev_valid || id != s.last) {  // a new run: its id must be its index among the row's runs
      s.broken |= id != s.runs;
      ++s.runs;
    }
    s.last = id;
  }
  s.prev_valid = valid;
}

// Whether the kBlock values at p all equal p[0], compared as 16-byte words (SSE2 or NEON: every target's
// baseline) against p[0]'s bytes repeated.
template <typename T>
inline bool SameAsFirst(const T* p) {
  using Word = uint64_t __attribute__((vector_size(16)));
  static_assert(kBlock * sizeof(T) % 16 == 0, "a block is whole 16-byte words");
  using U = std::make_unsigned_t<T>;
  constexpr uint64_t kRepeat = sizeof(T) == 8 ? 1 : sizeof(T) == 4 ? 0x0000000100000001ull : 0x0101010101010101ull;
  const uint64_t pattern = static_cast<uint64_t>(static_cast<U>(p[0])) * kRepeat;
  const Word first = {pattern, pattern};
  Word differ = {0, 0};
  for (size_t i = 0; i < kBlock * sizeof(T) / 16; ++i) {
    Word word;
    std::memcpy(&word, reinterpret_cast<const char*>(p) + 16 * i, 16);
    differ |= word ^ first;
  }
  return (differ[0] | differ[1]) == 0;
}

// Whether positions [t, t + kBlock) all hold position t's id and attention word (the bits, so a mask of mixed
// nonzero values takes the exact path, which reads them as attention).
template <typename Id, typename Att, bool kHasAttention>
inline bool Uniform(const Id* id, const Att* att, int64_t t) {
  if constexpr (kHasAttention) {
    return SameAsFirst(id + t) && SameAsFirst(att + t);
  } else {
    return SameAsFirst(id + t);
  }
}

// The attention value at position k, read unsigned (1 without a mask).
template <typename Att, bool kHasAttention>
inline uint64_t Mask(const Att* att, int64_t k) {
  if constexpr (kHasAttention) {
    return static_cast<std::make_unsigned_t<Att>>(att[k]);
  } else {
    return 1;
  }
}

template <typename Tok>
inline bool TokensInRange(const Tok* tok, int64_t n) {
  using UTok = std::make_unsigned_t<Tok>;
  UTok high = 0;  // a negative id read unsigned, or one above 2^31 - 1, has a bit at 31 or above
  for (int64_t i = 0; i < n; ++i) high |= static_cast<UTok>(tok[i]) >> 31;
  return high == 0;
}

template <typename Tok, typename Id, typename Att, bool kHasAttention>
int64_t Survey(const void* tokens, const void* turn_ids, const void* attention, int64_t rows, int64_t width,
               int64_t* counts, int64_t* lengths) {
  const auto* tok = static_cast<const Tok*>(tokens);
  const auto* ids = static_cast<const Id*>(turn_ids);
  const auto* atts = static_cast<const Att*>(attention);
  int64_t flags = TokensInRange(tok, rows * width) ? 0 : 1;
  for (int64_t r = 0; r < rows; ++r) {
    const Id* id = ids + r * width;
    const Att* att = kHasAttention ? atts + r * width : nullptr;
    RowState s;
    int64_t t = 0;
    for (; t + kBlock <= width; t += kBlock) {
      const uint64_t first = Mask<Att, kHasAttention>(att, t);
      Step(s, static_cast<int64_t>(id[t]), first, t);
      if (Uniform<Id, Att, kHasAttention>(id, att, t)) {
        if (first != 0) s.length = t + kBlock;  // (the rest of the block continues position t's state)
        continue;
      }
      for (int64_t k = t + 1; k < t + kBlock; ++k) Step(s, static_cast<int64_t>(id[k]), Mask<Att, kHasAttention>(att, k), k);
    }
    for (; t < width; ++t) Step(s, static_cast<int64_t>(id[t]), Mask<Att, kHasAttention>(att, t), t);
    counts[r] = s.broken ? -1 : s.runs;
    lengths[r] = s.length;
    if (s.outside) flags |= 2;
    if (s.attention_bits > 1) flags |= 4;
  }
  return flags;
}

template <typename Tok, typename Id>
int64_t ByAttention(const void* tokens, const void* turn_ids, const void* attention, int attention_bytes,
                    int64_t rows, int64_t width, int64_t* counts, int64_t* lengths) {
  switch (attention_bytes) {
    case 0: return Survey<Tok, Id, int8_t, false>(tokens, turn_ids, attention, rows, width, counts, lengths);
    case 1: return Survey<Tok, Id, int8_t, true>(tokens, turn_ids, attention, rows, width, counts, lengths);
    case 4: return Survey<Tok, Id, int32_t, true>(tokens, turn_ids, attention, rows, width, counts, lengths);
    case 8: return Survey<Tok, Id, int64_t, true>(tokens, turn_ids, attention, rows, width, counts, lengths);
    default: return -1;
  }
}

template <typename Tok>
int64_t ByIds(const void* tokens, const void* turn_ids, int id_bytes, const void* attention, int attention_bytes,
              int64_t rows, int64_t width, int64_t* counts, int64_t* lengths) {
  switch (id_bytes) {
    case 4: return ByAttention<Tok, int32_t>(tokens, turn_ids, attention, attention_bytes, rows, width, counts, lengths);
    case 8: return ByAttention<Tok, int64_t>(tokens, turn_ids, attention, attention_bytes, rows, width, counts, lengths);
    default: return -1;
  }
}

}  // namespace

// C-contiguous [rows, width] buffers: signed integer token ids and turn ids of 4 or 8 bytes, an attention mask of
// 1 (bool or int8), 4 or 8 bytes read as nonzero, or none (attention_bytes 0: every position attends). Writes
// counts[rows] and lengths[rows]; returns the flags above, or -1 for sizes it does not take.
extern "C" int64_t PrmJaxSurveyRows(const void* tokens, int token_bytes, const void* turn_ids, int id_bytes,
                                    const void* attention, int attention_bytes, int64_t rows, int64_t width,
                                    int64_t* counts, int64_t* lengths) {
  switch (token_bytes) {
    case 4: return ByIds<int32_t>(tokens, turn_ids, id_bytes, attention, attention_bytes, rows, width, counts, lengths);
    case 8: return ByIds<int64_t>(tokens, turn_ids, id_bytes, attention, attention_bytes, rows, width, counts, lengths);
    default: return -1;
  }
}
