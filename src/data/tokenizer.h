// Byte-level BPE tokenizer (GPT-2 / cl100k family): loads an HF tokenizer.json (BPE model, byte-level
// pre-tokenizer with a regex Split, added tokens, ByteLevel decoder).
// The pre-tokenizer regex runs on PCRE2 (UTF + UCP, JIT). Anything outside that family (WordPiece, Unigram,
// byte_fallback, normalizers, ...) is rejected with an olmosft::Error instead of producing wrong ids.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace olmosft {

// The cl100k_base pre-tokenizer regex (the form used in HF tokenizer.json conversions).
extern const char* const kCl100kPattern;
// The GPT-2 byte-level regex (HF ByteLevel pre-tokenizer with use_regex=true).
extern const char* const kGpt2Pattern;

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = true;
  bool lstrip = false;  // HF: swallow whitespace to the left of the match into the token
  bool rstrip = false;  // HF: swallow whitespace to the right
};

// Replaces every maximal invalid UTF-8 subsequence by U+FFFD (the WHATWG / Python errors="replace" rule).
// Returns the input unchanged when it is valid.
std::string sanitize_utf8(std::string_view s);
bool is_valid_utf8(std::string_view s);

struct BpeMerge {
  int32_t left, right, merged;  // token ids
};

class Regex;  // PCRE2 wrapper (tokenizer.cpp)
struct HfJsonLoader;

class Tokenizer {
 public:
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  // HF tokenizer.json. Throws olmosft::Error naming the file and the unsupported component.
  static Tokenizer from_hf_json_file(const std::string& path);
  static Tokenizer from_hf_json(const std::string& json_text, const std::string& origin);

  // Encodes text. Added tokens marked special are matched only when allow_special is true (otherwise
  // their text is tokenized as ordinary text); non-special added tokens are always matched (as HF does).
  // Invalid UTF-8 is replaced by U+FFFD first (see sanitize_utf8); strict_utf8 throws instead.
  std::vector<int32_t> encode(std::string_view text, bool allow_special = false,
                              bool strict_utf8 = false) const;
  // Raw bytes of the tokens, concatenated (may be invalid UTF-8 if a character is split across ids).
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const;

  int64_t vocab_size() const { return static_cast<int64_t>(id_bytes_.size()); }  // max id + 1
  // Id of a token given by its raw bytes (added tokens by content); -1 if none.
  int32_t token_to_id(std::string_view bytes) const;
  // Raw bytes of a token id (throws on an id outside the vocabulary).
  const std::string& id_to_bytes(int32_t id) const;
  bool is_special(int32_t id) const;
  const std::vector<AddedToken>& added_tokens() const { return added_; }
  const std::string& pattern() const { return pattern_; }  // empty = no pre-tokenizer split
  // A one-line description of the pipeline for `check tokenizer`.
  const std::string& describe() const { return description_; }
  // The merges in rank order.
  std::vector<BpeMerge> merges() const;
  // BPE of raw bytes alone (no pre-tokenizer, no added tokens, no cache) with the merges of rank < max_rank.
  std::vector<int32_t> bpe_bytes(std::string_view bytes, uint32_t max_rank = UINT32_MAX) const;

 private:
  friend struct HfJsonLoader;  // tokenizer.cpp: fills the tables from a tokenizer.json
  Tokenizer();
  void finish_setup();
  void bpe_piece(std::string_view piece, std::vector<int32_t>& out) const;
  void bpe_merge(std::string_view piece, uint32_t max_rank, std::vector<int32_t>& out) const;
  void encode_ordinary(std::string_view text, std::vector<int32_t>& out) const;

  std::vector<std::string> id_bytes_;                  // id -> raw bytes ("" for holes)
  std::unordered_map<std::string, int32_t> bytes_id_;  // raw bytes -> id (model vocab only)
  std::unordered_map<uint64_t, uint64_t> merges_;      // (left<<32|right) -> (rank<<32|merged)
  int32_t byte_id_[256];
  bool whole_piece_lookup_ = false;  // HF ignore_merges: a piece already in the vocab is one token
  std::vector<AddedToken> added_;
  std::vector<uint8_t> special_flag_;  // per id
  std::string pattern_;
  std::unique_ptr<Regex> regex_;
  bool split_keep_gaps_ = false;  // HF Split behavior Isolated (non-matching gaps are pieces too)
  std::string description_;
  uint64_t instance_id_ = 0;  // keys the per-thread piece cache
};

}  // namespace olmosft
