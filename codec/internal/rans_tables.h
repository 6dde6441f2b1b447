// rANS frequency tables: read from and written to a section (format in codec/rans.h), and
// expanded into the forms the encoder (rans_encode.cc) and the decoder (rans_decode.cc) run on.
// Built once per section, so none of this is on a per-symbol path.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "codec/internal/byte_io.h"
#include "codec/rans.h"

namespace strata::codec::rans {

inline constexpr uint32_t kL = 1u << 16;  // states live in [kL, 2^32); words are 16 bits
inline constexpr int kMinProbBits = 11;
inline constexpr int kMaxProbBits = 15;

// The scalar encoder's view of one symbol of one context.
struct EncSym {
  uint64_t rcp;  // floor((2^64 - 1) / freq): quotient estimate, corrected by one step
  uint32_t freq;
  uint32_t start;
  uint32_t x_max;  // renormalise (emit a word) while x >= x_max
  uint32_t shift;  // prob_bits of the context
};

// What the encoder's tables say per context, beyond the EncSym records.
struct EncodeTables {
  const EncSym* syms;                // num_ctx * alphabet records, in the scratch
  uint32_t prob_bits[kMaxContexts];  // 0: context unused
  uint32_t lo[kMaxContexts];         // symbols used: lo..hi (lo = alphabet, hi = 0 when none)
  uint32_t hi[kMaxContexts];
  double entropy_bits;  // of `counts`, the order-0 entropy summed over the contexts (if asked)
};

// Normalises `counts` (num_ctx * alphabet, as Histogram's), appends the serialised tables to
// `w` and fills the EncSym records (in scratch->enc_syms) and `t`; t->entropy_bits only
// `with_entropy` (else 0: a logarithm per symbol and context, for statistics alone).
void BuildEncodeTables(const uint32_t* counts, uint32_t alphabet, uint32_t num_ctx,
                       Scratch* scratch, internal::ByteWriter& w, EncodeTables* t,
                       bool with_entropy);

// 1 / freq less 2^-22 of itself, rounded down to a float: for every x < freq * 2^21,
// trunc(float(x) * it) (float arithmetic, round to nearest) is x / freq or one less.
float QuotientReciprocal(uint32_t freq);

// The AVX-512 encoder's tables: per context `stride` entries from symbol *lo (freq | start << 16
// in scratch->enc_ent, QuotientReciprocal(freq) in scratch->enc_rcp); stride is 16, 32 or 64
// when every context's symbols fit in that span, else the alphabet (and *lo 0). Returns the
// stride.
size_t BuildSimdEncodeTables(const EncodeTables& t, uint32_t alphabet, uint32_t num_ctx,
                             Scratch* scratch, uint32_t* lo);

// The serialised tables of a section, checked, with what sizing the decoder's tables needs.
struct TableLayout {
  const uint8_t* begin;  // the serialised tables (valid: later reads need no checks)
  size_t len;
  uint32_t prob_bits[kMaxContexts];  // 0: context unused
  size_t offsets[kMaxContexts];      // of each context's 2^prob_bits slots in the decode tables
  size_t total_entries;
  uint32_t sym_lo, sym_hi;  // symbols over all contexts (sym_lo = alphabet when none)
  uint32_t span() const { return sym_hi >= sym_lo ? sym_hi - sym_lo + 1 : 0; }
};

// Reads and checks the tables of num_ctx contexts from `in`. DataLoss if they are malformed.
absl::Status ReadTableLayout(internal::ByteReader& in, uint32_t alphabet, uint32_t num_ctx,
                             TableLayout* layout);

// Packed decode tables (the AVX-512 byte-gather decoder, and the scalar finish after it): per
// slot the symbol's index (symbol - sym_lo, one byte) in scratch->dec_pack8, per index
// freq | start << 16 in scratch->dec_ftab (`tab` entries per context). pack[c] points at
// context c's slots.
void BuildPackedDecodeTables(const TableLayout& layout, uint32_t num_ctx, uint32_t tab,
                             Scratch* scratch, const uint8_t** pack);

// Per-slot decode tables: freq << 16 | bias in scratch->dec_entry and the symbol in
// scratch->dec_sym; ent[c] and sym[c] point at context c's slots.
void BuildEntryDecodeTables(const TableLayout& layout, uint32_t num_ctx, Scratch* scratch,
                            const uint32_t** ent, const uint16_t** sym);

}  // namespace strata::codec::rans
