// Interleaved rANS entropy coder with static per-context frequency tables.
//
// Symbols are coded by kLanes interleaved 32-bit states (symbol i uses state i % kLanes) that
// share one stream of 16-bit words, so the decoder can work on many symbols at a time (and
// does, with two 16-lane AVX-512 vectors in flight when the CPU has it). Symbol i belongs to
// context (i / kCtxRun) % num_ctx: callers order their symbols so that each run of kCtxRun
// symbols shares its statistics (e.g. 16 consecutive channels of one token). Each context
// carries its own normalised frequency table, stored in front of the stream.
//
// Section layout written by Encode:
//   num_ctx tables: u8 prob_bits (0 = context unused), then if used: varint lo, varint count,
//                   count varints (frequencies of symbols lo..lo+count-1, summing to 2^prob_bits)
//   varint stream bytes, then the stream: `lanes` u32 initial states, then u16 words.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "codec/internal/byte_io.h"

namespace strata::codec::rans {

inline constexpr int kLanes = 32;      // interleaved states of the original (coder 1) streams
inline constexpr int kMaxLanes = 128;  // coder 4 streams: 128 states, eight 16-lane vectors
inline constexpr int kCtxRun = 16;     // symbols per context run
inline constexpr uint32_t kMaxAlphabet = 4096;
inline constexpr uint32_t kMaxContexts = 256;

struct CoderStats {
  double entropy_bits = 0;   // sum over contexts of the empirical (order-0) entropy
  uint64_t stream_bits = 0;  // coded stream, states included
  uint64_t table_bits = 0;   // serialized frequency tables
  uint64_t symbols = 0;
  void Add(const CoderStats& o) {
    entropy_bits += o.entropy_bits;
    stream_bits += o.stream_bits;
    table_bits += o.table_bits;
    symbols += o.symbols;
  }
};

// Reusable buffers; one per thread of use.
struct Scratch {
  std::vector<uint32_t> counts;
  std::vector<uint8_t> enc_syms;  // EncSym records
  std::vector<uint32_t> enc_ent;  // SIMD encoder tables: freq | start << 16
  std::vector<float> enc_rcp;     // and 1 / freq
  std::vector<uint16_t> words;
  std::vector<uint32_t> dec_entry;  // per context 2^prob_bits (freq << 16 | bias)
  std::vector<uint16_t> dec_sym;
  std::vector<uint8_t> dec_pack8;  // SIMD decoder: symbol index (symbol - lo) per slot
  std::vector<uint32_t> dec_ftab;  // SIMD decoder: frequency per symbol, per context
};

// One 128-state stream shared by the sections of a blob (quant coder 6), so that its final
// states (512 bytes) are paid once per blob instead of once per section: a small model's
// 49k-value sections could only afford 32 states each, whose two 16-lane chains left the
// decoder waiting on its gathers. Each section keeps its own tables (written by Encode into the
// section); its symbols continue the states the previous section left. The encoder takes the
// sections first to last (each backwards, as Encode always does), so the decoder, which reads the
// stream from its end state, takes them last to first.
//
// Stream payload (FinishShared): 128 u32 states, then u16 words to the end of the payload.
struct SharedEncoder {
  SharedEncoder() { Reset(); }
  void Reset();
  // Room for chunk k (the next section's words, written from its end); reused from call to
  // call and never zero-filled, so only the words written touch memory.
  uint16_t* Chunk(size_t k, size_t size);

  uint32_t x[kMaxLanes];
  std::vector<std::unique_ptr<uint16_t[]>> chunks;
  std::vector<size_t> capacity, begin, end;  // chunk k's words: [begin[k], end[k])
  size_t used = 0;                           // chunks of the stream so far
};
// Appends the stream (final states, then every section's words in the decoder's order) to `out`
// and resets the encoder.
void FinishShared(SharedEncoder* enc, std::vector<uint8_t>* out, CoderStats* stats);

// Points into the blob, which must outlive it.
struct SharedDecoder {
  uint32_t x[kMaxLanes];
  const uint16_t* wp = nullptr;
  const uint16_t* wend = nullptr;
};
// Reads a FinishShared payload. DataLoss if it is malformed.
absl::Status StartShared(std::span<const uint8_t> payload, SharedDecoder* dec);
// After the last section: DataLoss unless every state is back at its start and every word was
// read (a corrupt stream cannot pass).
absl::Status FinishShared(const SharedDecoder& dec);

// Symbols must be < alphabet (<= kMaxAlphabet). Appends the tables and the stream to `out`.
// `lanes` (32, 64 or 128) is the number of interleaved states: symbol i uses state i % lanes. 128
// (coder 4) gives the AVX-512 decoder eight independent 16-lane chains (64: four, 32: two).
// `counts`, when set (num_ctx * alphabet, contexts as Histogram's), replaces the histogram pass:
// the exact histogram, or any estimate (e.g. of a sample) that is nonzero for every symbol that
// occurs in its context; the tables are normalised from it. stats' entropy_bits is always that of
// the symbols (counted again when `counts` is given and stats are asked for).
// `shared`: append only the tables to `out` and code the symbols into that stream (128 states,
// `lanes` ignored); stats then count this section's words, FinishShared the states.
template <typename Sym>
void Encode(const Sym* syms, size_t n, uint32_t alphabet, uint32_t num_ctx, Scratch* scratch,
            std::vector<uint8_t>* out, CoderStats* stats, int lanes = kLanes,
            const uint32_t* counts = nullptr, SharedEncoder* shared = nullptr);

// counts[ctx * alphabet + sym] += occurrences, with Encode's contexts (symbol i in context
// (i / kCtxRun) % num_ctx). Symbols must be < alphabet.
template <typename Sym>
void Histogram(const Sym* syms, size_t n, uint32_t alphabet, uint32_t num_ctx, uint32_t* counts);

// Reads what Encode wrote; writes n symbols, each < alphabet, or returns DataLoss. With
// `shared`, `in` holds only the tables and the symbols come from that stream (128 states).
template <typename Sym>
absl::Status Decode(internal::ByteReader& in, size_t n, uint32_t alphabet, uint32_t num_ctx,
                    Scratch* scratch, Sym* out, int lanes = kLanes,
                    SharedDecoder* shared = nullptr);

// Empirical order-0 entropy in bits of the symbols, with the same contexts as Encode.
template <typename Sym>
double EmpiricalEntropyBits(const Sym* syms, size_t n, uint32_t alphabet, uint32_t num_ctx);

// True when Decode uses the AVX-512 path on this CPU; Avx2DecodeAvailable when its 8-lane AVX2
// loop can run here (the path where AVX-512 is not there, or ForceAvx2ForTesting).
bool SimdDecodeAvailable();
bool Avx2DecodeAvailable();

// Tests: run the scalar encoder and decoder even where AVX-512 is available (not thread-safe).
void ForceScalarForTesting(bool on);
// Tests: run the AVX2 loops (encoder, decoder, histogram) where AVX-512 is available too (not
// thread-safe); no effect without AVX2.
void ForceAvx2ForTesting(bool on);

}  // namespace strata::codec::rans
