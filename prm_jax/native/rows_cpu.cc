// A trainer's token arrays checked on the host (called through ctypes on numpy buffers, whatever the JAX
// backend; see prm_jax/native/_ffi.py's host functions and prm_jax/runtime/_arrays.py).
//
// score_arrays must check every row before a model reads it: token ids in [0, 2^31 - 1], and AReaL's turn rule
// (a run of a row's turn tokens starts where the left neighbour is not a turn token or holds another id; the
// runs' ids, in order, are 0, 1, 2, ...), where a turn token has turn id >= 0 and attention. In numpy those
// checks are a dozen passes over the [B, T] int64 arrays (about half the row path's time beside a model that
// costs nothing, issue 56.6). Two ways here:
//
// - Survey (PrmJaxSurveyRows): one pass over each array, before the rows are copied (score_arrays with several
//   scorers, each chunking the rows its own way, or per_turn). Per row: the number of turns (-1 where the rule
//   breaks: the caller names the row and what is wrong) and its length (last attended position + 1). Returned
//   flags: 1, a token id out of range (the caller finds it); 2, a turn id >= 0 without attention; 4, an
//   attention value other than 0 and 1.
// - Fused (PrmJaxPlanRows, then PrmJaxChunkRows; one ModelScorer): each row's length first, from the mask read
//   back from the row's end (only its padding), which plans the chunks; then the checks made as the rows are
//   copied into the model's int32 chunks, so each array is read once, as a hand-written loop's copies read it.
//   PrmJaxPlaceScores writes the model's float32 scores back onto the turn tokens and says whether one is not
//   finite, in one pass.
//
// Most of a row is long stretches of one turn id and one attention value (a turn's tokens, a tool's output,
// the padding), so the rule is walked a block of 16 positions at a time: a block whose ids and attention
// words all equal its first position's (a comparison the compiler vectorizes) takes one step of the rule;
// any other block takes a step per position.

#include <climits>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace {

constexpr int64_t kBlock = 16;

// AReaL's turn rule, one position at a time, over a row's turn ids with -1 off the turn tokens: a run starts
// where the id differs from its left neighbour's, and each run's id must follow the last run's (0, 1, 2, ...).
// The survey steps it with the ids it reads, the copies with the ids they wrote.
struct TurnRule {
  int64_t prev = -1;  // the left neighbour's id (-1: not a turn token)
  int64_t last = -1;  // the last run's id
  bool broken = false;

  void Step(int64_t v) {
    if (v >= 0 && v != prev) {  // a new run
      broken |= v != last + 1;
      last = v;
    }
    prev = v;
  }
  int64_t Count() const { return broken ? -1 : last + 1; }  // the row's number of turns, -1 where it breaks
};

struct RowState {
  TurnRule rule;
  bool outside = false;
  uint64_t attention_bits = 0;  // every attention value read, OR-ed: above 1 where one is not 0 or 1
  int64_t length = 0;
};

// One position of the survey (`attention`: the mask's value read unsigned).
inline void Step(RowState& s, int64_t id, uint64_t attention, int64_t t) {
  const bool attends = attention != 0;
  s.attention_bits |= attention;
  s.outside |= id >= 0 && !attends;
  if (attends) s.length = t + 1;
  s.rule.Step(attends ? id : -1);
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
    counts[r] = s.rule.Count();
    lengths[r] = s.length;
    if (s.outside) flags |= 2;
    if (s.attention_bits > 1) flags |= 4;
  }
  return flags;
}

// The fused path. Plan: per row its length (the mask scanned back from the row's end: only its padding is read); a row of
// length 0 is never copied, so its tokens are checked there. Chunks: the rows copied into the model's calls'
// int32 buffers (token ids as given; the mask 1 where it attends; turn ids on the turn tokens, -1 elsewhere),
// their tokens checked and the turn rule walked over the copied turn ids (-1 off the turns: a run starts where
// the id differs from its left neighbour's).

template <int64_t N, typename T>
inline bool AnyNonzero(const T* p) {
  T any = 0;
  for (int64_t k = 0; k < N; ++k) any |= p[k];
  return any != 0;
}

template <typename Tok, typename Att, bool kHasAttention>
int64_t Plan(const void* tokens, const void* attention, int64_t rows, int64_t width, int64_t* lengths) {
  const auto* tok = static_cast<const Tok*>(tokens);
  const auto* atts = static_cast<const Att*>(attention);
  int64_t flags = 0, longest = 0, shortest = 0, scored = 0;  // (over the rows of length > 0)
  for (int64_t r = 0; r < rows; ++r) {
    int64_t length = width;
    if constexpr (kHasAttention) {  // (4 blocks of 16 at a time, then a block, then a position at a time: each
      // step waits on the last, so fewer, wider steps; 9.3 -> 7.3 us for 256 rows of 162 padding int64, 7.1 -> 3.1
      // of int8, measured 2026-12-07)
      const Att* att = atts + r * width;
      while (length >= 4 * kBlock && !AnyNonzero<4 * kBlock>(att + length - 4 * kBlock)) length -= 4 * kBlock;
      while (length >= kBlock && !AnyNonzero<kBlock>(att + length - kBlock)) length -= kBlock;
      while (length > 0 && att[length - 1] == 0) --length;
    }
    lengths[r] = length;
    if (length == 0 && !TokensInRange(tok + r * width, width)) flags |= 1;
    if (length > 0) {
      longest = length > longest ? length : longest;
      shortest = scored == 0 || length < shortest ? length : shortest;
      ++scored;
    }
  }
  lengths[rows] = longest, lengths[rows + 1] = shortest, lengths[rows + 2] = scored;
  return flags;
}

// The rule over one row's copied turn ids (-1 off the turns): its number of turns, -1 where it breaks.
inline int64_t Turns(const int32_t* turns, int64_t cut) {
  TurnRule rule;
  int64_t t = 0;
  for (; t + kBlock <= cut; t += kBlock) {
    rule.Step(turns[t]);
    if (SameAsFirst(turns + t)) continue;  // (the rest of the block repeats position t: no step changes the rule)
    for (int64_t k = t + 1; k < t + kBlock; ++k) rule.Step(turns[k]);
  }
  for (; t < cut; ++t) rule.Step(turns[t]);
  return rule.Count();
}

template <typename Tok, typename Id, typename Att, bool kHasAttention>
int64_t Chunks(const void* tokens, const void* turn_ids, const void* attention, int64_t width, const int64_t* members,
               int64_t chunks, const int64_t* chunk_rows, const int64_t* chunk_widths, int64_t size, int32_t* out_ids,
               int32_t* out_mask, int32_t* out_turns, int64_t* counts) {
  const auto* tok = static_cast<const Tok*>(tokens);
  const auto* ids = static_cast<const Id*>(turn_ids);
  const auto* atts = static_cast<const Att*>(attention);
  using UTok = std::make_unsigned_t<Tok>;
  UTok high = 0;
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t count = chunk_rows[c], padded = chunk_widths[c];
    const int64_t cut = padded < width ? padded : width;
    for (int64_t i = 0; i < count; ++i) {
      const int64_t r = members[i];
      const Tok* tk = tok + r * width;
      const Id* id = ids + r * width;
      const Att* att = kHasAttention ? atts + r * width : nullptr;
      int32_t* o_ids = out_ids + i * padded;
      int32_t* o_mask = out_mask + i * padded;
      int32_t* o_turns = out_turns + i * padded;
      for (int64_t t = 0; t < cut; ++t) {
        const bool attends = Mask<Att, kHasAttention>(att, t) != 0;
        const int64_t d = static_cast<int64_t>(id[t]);
        high |= static_cast<UTok>(tk[t]) >> 31;
        o_ids[t] = static_cast<int32_t>(tk[t]);
        o_mask[t] = attends;
        // (an id above int32's range never follows a run's index: clamped, it breaks the rule as it would)
        o_turns[t] = d >= 0 && attends ? static_cast<int32_t>(d < INT32_MAX ? d : INT32_MAX) : -1;
      }
      if (!TokensInRange(tk + cut, width - cut)) high = 1;  // (no attention past cut: the tokens alone)
      for (int64_t t = cut; t < padded; ++t) o_ids[t] = o_mask[t] = 0, o_turns[t] = -1;
      counts[i] = Turns(o_turns, cut);
    }
    const int64_t rest = (size - count) * padded;  // (the chunk's rows past its members)
    std::memset(out_ids + count * padded, 0, sizeof(int32_t) * rest);
    std::memset(out_mask + count * padded, 0, sizeof(int32_t) * rest);
    std::memset(out_turns + count * padded, 0xff, sizeof(int32_t) * rest);
    members += count, counts += count;
    out_ids += size * padded, out_mask += size * padded, out_turns += size * padded;
  }
  return high ? 1 : 0;
}

// A model call's float32 scores placed on its rows' turn tokens (0 elsewhere), and whether one placed is not
// finite (its exponent bits all set: the comparison vectorizes where std::isfinite does not).
inline bool Place(const float* scores, const int32_t* turns, const int64_t* rows, int64_t count, int64_t cut,
                  int64_t padded, float* out, int64_t width) {
  uint32_t non_finite = 0;
  for (int64_t i = 0; i < count; ++i) {
    const float* s = scores + i * padded;
    const int32_t* turn = turns + i * padded;
    float* o = out + rows[i] * width;
    for (int64_t t = 0; t < cut; ++t) {
      const float v = turn[t] >= 0 ? s[t] : 0.0f;
      uint32_t bits;
      std::memcpy(&bits, &v, sizeof bits);
      non_finite |= (bits & 0x7f800000u) == 0x7f800000u;
      o[t] = v;
    }
  }
  return non_finite != 0;
}

// Calls f(Tok{}, Id{}, Att{}, std::bool_constant<kHasAttention>{}) for the buffers' sizes (bytes: 4 or 8 for
// token and turn ids; 0, 1, 4 or 8 for the attention mask, 0 for none); -1 for sizes it does not take.
template <typename F>
int64_t Dispatch(int token_bytes, int id_bytes, int attention_bytes, F&& f) {
  auto by_attention = [&](auto tok, auto id) -> int64_t {
    using Tok = decltype(tok);
    using Id = decltype(id);
    switch (attention_bytes) {
      case 0: return f(Tok{}, Id{}, int8_t{}, std::false_type{});
      case 1: return f(Tok{}, Id{}, int8_t{}, std::true_type{});
      case 4: return f(Tok{}, Id{}, int32_t{}, std::true_type{});
      case 8: return f(Tok{}, Id{}, int64_t{}, std::true_type{});
      default: return -1;
    }
  };
  auto by_ids = [&](auto tok) -> int64_t {
    switch (id_bytes) {
      case 4: return by_attention(tok, int32_t{});
      case 8: return by_attention(tok, int64_t{});
      default: return -1;
    }
  };
  switch (token_bytes) {
    case 4: return by_ids(int32_t{});
    case 8: return by_ids(int64_t{});
    default: return -1;
  }
}

}  // namespace

// The entry points are compiled twice on x86-64 glibc, for the baseline (SSE2) and for AVX2, everything they call
// inlined into each (flatten), and the loader picks by the CPU (ifunc: the copies' int64 -> int32 narrowing is
// 1.6x faster with 32-byte vectors, measured 2026-12-07); elsewhere (Arm, macOS, musl) once.
#if defined(__x86_64__) && defined(__GLIBC__) && defined(__GNUC__)
#define PRM_JAX_CLONES __attribute__((flatten, target_clones("avx2", "default")))
#else
#define PRM_JAX_CLONES
#endif

// The host functions' interface version, checked by prm_jax/native/_ffi.py before it calls any of them (HOST_API
// there): a library built from older sources, whose functions take other arguments, is built again, not called.
// Raise it with any change of an entry point's arguments or of what it writes.
extern "C" int64_t PrmJaxHostApi() { return 2; }

// A call's template arguments from Dispatch's tags.
#define PRM_JAX_TYPES(tok, id, att, has)                                                     \
  using Tok = decltype(tok);                                                                 \
  using Id = decltype(id);                                                                   \
  using Att = decltype(att);                                                                 \
  constexpr bool kHasAttention = decltype(has)::value

// C-contiguous [rows, width] buffers: signed integer token ids and turn ids of 4 or 8 bytes, an attention mask of
// 1 (bool or int8), 4 or 8 bytes read as nonzero, or none (attention_bytes 0: every position attends). Writes
// counts[rows] and lengths[rows]; returns the flags above, or -1 for sizes it does not take.
extern "C" PRM_JAX_CLONES int64_t PrmJaxSurveyRows(const void* tokens, int token_bytes, const void* turn_ids, int id_bytes,
                                    const void* attention, int attention_bytes, int64_t rows, int64_t width,
                                    int64_t* counts, int64_t* lengths) {
  return Dispatch(token_bytes, id_bytes, attention_bytes, [&](auto tok, auto id, auto att, auto has) {
    PRM_JAX_TYPES(tok, id, att, has);
    return Survey<Tok, Id, Att, kHasAttention>(tokens, turn_ids, attention, rows, width, counts, lengths);
  });
}

// The same buffers: lengths[rows] (PlanRows above; the turn ids are not read), then in lengths[rows .. rows + 2]
// the longest and the shortest length above 0 and the number of rows of length above 0 (0, 0, 0 for none);
// returns 1 where a row of length 0 holds a token id out of range, else 0, or -1 for sizes it does not take.
extern "C" PRM_JAX_CLONES int64_t PrmJaxPlanRows(const void* tokens, int token_bytes, const void* attention,
                                                 int attention_bytes, int64_t rows, int64_t width, int64_t* lengths) {
  return Dispatch(token_bytes, 4, attention_bytes, [&](auto tok, auto, auto att, auto has) {
    using Tok = decltype(tok);
    using Att = decltype(att);
    return Plan<Tok, Att, decltype(has)::value>(tokens, attention, rows, width, lengths);
  });
}

// The same buffers: rows copied into chunks. index holds, one after another, width (the arrays' T), n, chunks and
// size, then the members[n] (the rows, in chunk order), chunk_rows[chunks] (each chunk's number of members, at
// most size), chunk_widths[chunks], and n slots for counts (each member's number of turns, -1 where the rule
// breaks); out holds three regions of size * sum(chunk_widths) int32, the copies of the token ids, the mask and
// the turn ids, each region chunk c's C-contiguous [size, chunk_widths[c]] blocks one after another (columns up
// to min(chunk_widths[c], width) copied, the rest and rows past the chunk's members 0, -1 in the turn ids).
// Returns 1 where a copied row holds a token id out of range, else 0, or -1 for sizes it does not take. (Two
// buffers and no scalars: through ctypes each address costs its caller about a microsecond, each argument a
// fraction of one.)
extern "C" PRM_JAX_CLONES int64_t PrmJaxChunkRows(const void* tokens, int token_bytes, const void* turn_ids,
                                                  int id_bytes, const void* attention, int attention_bytes,
                                                  int64_t* index, int32_t* out) {
  const int64_t width = index[0], n = index[1], chunks = index[2], size = index[3];
  const int64_t* members = index + 4;
  const int64_t* chunk_rows = members + n;
  const int64_t* chunk_widths = chunk_rows + chunks;
  int64_t* counts = index + 4 + n + 2 * chunks;
  int64_t region = 0;
  for (int64_t c = 0; c < chunks; ++c) region += size * chunk_widths[c];
  return Dispatch(token_bytes, id_bytes, attention_bytes, [&](auto tok, auto id, auto att, auto has) {
    PRM_JAX_TYPES(tok, id, att, has);
    return Chunks<Tok, Id, Att, kHasAttention>(tokens, turn_ids, attention, width, members, chunks, chunk_rows,
                                               chunk_widths, size, out, out + region, out + 2 * region, counts);
  });
}

// Model calls' scores placed onto the C-contiguous [B, width] float32 out, a batch's calls in one call (through
// ctypes each call costs its caller microseconds, issue 56.6). table holds `calls` rows of six int64: the
// addresses of a call's C-contiguous [size, padded] float32 scores, of its int32 turn ids (-1 off the turns) and
// of its int64 rows[count], then count, cut and padded: row i's first cut columns written onto row rows[i] of out,
// the scores on the turn tokens and 0 elsewhere (count <= size, cut <= min(padded, width)). Returns 1 where a
// score placed on a turn token is not finite, else 0.
extern "C" PRM_JAX_CLONES int64_t PrmJaxPlaceScores(const int64_t* table, int64_t calls, float* out, int64_t width) {
  bool non_finite = false;
  for (int64_t c = 0; c < calls; ++c) {
    const int64_t* call = table + 6 * c;
    non_finite |= Place(reinterpret_cast<const float*>(call[0]), reinterpret_cast<const int32_t*>(call[1]),
                        reinterpret_cast<const int64_t*>(call[2]), call[3], call[4], call[5], out, width);
  }
  return non_finite ? 1 : 0;
}
