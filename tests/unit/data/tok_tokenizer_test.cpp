// Tokenizer against the upstream tokenizer: the golden corpus (tests/reference/tok_corpus.py: Hugging Face
// `tokenizers` 0.23.3, the Rust library, on the real dolma2 tokenizer.json) must match with zero mismatches,
// with special tokens matched and not; and the dolma2 file validation catches every kind of altered file.
#include <gtest/gtest.h>

#include <functional>
#include <nlohmann/json.hpp>

#include "../scratch_dir.h"
#include "core/error.h"
#include "data/tokenizer.h"
#include "data/tokenizer_dolma2.h"
#include "data/tokenizer_util.h"
#include "io/atomic_file.h"
#include "io/hash.h"

using namespace olmosft;
using nlohmann::json;

namespace {
const std::string kDolma2 = std::string(OLMOSFT_SOURCE_DIR) + "/deps/dolma2/allenai_dolma2.json";

const Tokenizer& dolma2() {
  static Tokenizer t = Tokenizer::from_hf_json_file(kDolma2);  // throws naming the file if it is missing
  return t;
}

struct Row {
  std::string text;  // raw bytes
  bool hex = false;
  std::vector<int32_t> ids;          // special tokens as text
  std::vector<int32_t> ids_special;  // special tokens matched
};

std::string unhex(const std::string& h) {
  std::string out;
  for (size_t i = 0; i + 1 < h.size(); i += 2)
    out += static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16));
  return out;
}

struct Corpus {
  json meta;
  std::vector<Row> rows;
};

const Corpus& corpus() {
  static Corpus c = [] {
    Corpus v;
    std::string all = tok::read_zstd_file(std::string(OLMOSFT_GOLDEN_DIR) + "/tok/dolma2_corpus.jsonl.zst");
    size_t pos = 0;
    while (pos < all.size()) {
      size_t e = all.find('\n', pos);
      if (e == std::string::npos) e = all.size();
      if (e > pos) {
        json j = json::parse(all.substr(pos, e - pos));
        if (j.contains("meta")) {
          v.meta = j["meta"];
        } else {
          Row r;
          r.hex = j.contains("hex");
          r.text = r.hex ? unhex(j["hex"].get<std::string>()) : j["text"].get<std::string>();
          r.ids = j["ids"].get<std::vector<int32_t>>();
          r.ids_special = j.contains("ids_special") ? j["ids_special"].get<std::vector<int32_t>>() : r.ids;
          v.rows.push_back(std::move(r));
        }
      }
      pos = e + 1;
    }
    return v;
  }();
  return c;
}

std::string mutate_file(const std::string& name, const std::function<void(json&)>& f) {
  static const json base = json::parse(io::read_file(kDolma2));
  json j = base;
  f(j);
  static const testutil::ScratchDir scratch("tok_tokenizer");  // removed at exit
  std::string path = scratch / (name + ".json");
  io::write_file_atomic(path, j.dump());
  return path;
}

void expect_invalid(const std::string& path, const std::string& needle) {
  try {
    validate_dolma2_tokenizer_json(path);
    ADD_FAILURE() << "accepted " << path << " (" << needle << ")";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos)
        << "error must name the file: " << e.what();
  }
}
}  // namespace

TEST(TokTokenizer, CorpusMatchesHfTokenizersExactly) {
  const Corpus& c = corpus();
  ASSERT_EQ(c.meta.value("sha256", ""), kDolma2Sha256) << "the golden was made from another tokenizer file";
  ASSERT_EQ(c.meta.value("rows", 0), static_cast<int>(c.rows.size()));
  ASSERT_GE(c.rows.size(), 5000u);
  const Tokenizer& t = dolma2();
  size_t mismatches = 0, mismatches_special = 0, roundtrip_fail = 0, invalid = 0, specials = 0, tokens = 0;
  for (size_t i = 0; i < c.rows.size(); ++i) {
    const Row& r = c.rows[i];
    auto ids = t.encode(r.text, /*allow_special=*/false);
    auto ids_special = t.encode(r.text, /*allow_special=*/true);
    tokens += ids.size();
    if (ids != r.ids && ++mismatches <= 5)
      ADD_FAILURE() << "row " << i << " (specials as text) mismatch: " << json(sanitize_utf8(r.text)).dump();
    if (ids_special != r.ids_special && ++mismatches_special <= 5)
      ADD_FAILURE() << "row " << i << " (specials matched) mismatch: " << json(sanitize_utf8(r.text)).dump();
    std::string expect = r.hex ? sanitize_utf8(r.text) : r.text;
    if (t.decode(ids) != expect && ++roundtrip_fail <= 5)
      ADD_FAILURE() << "row " << i << " decode(encode(x)) != x";
    invalid += r.hex && !is_valid_utf8(r.text);
    specials += r.ids_special != r.ids;
  }
  EXPECT_EQ(mismatches, 0u);
  EXPECT_EQ(mismatches_special, 0u);
  EXPECT_EQ(roundtrip_fail, 0u);
  EXPECT_GT(invalid, 100u);   // the corpus really exercises the invalid-UTF-8 policy
  EXPECT_GT(specials, 100u);  // ... and special tokens
  std::printf(
      "dolma2 vs HF tokenizers %s: %zu rows, %zu tokens, mismatches %zu (specials as text) and %zu "
      "(specials matched)\n",
      c.meta.value("tokenizers", "?").c_str(), c.rows.size(), tokens, mismatches, mismatches_special);
}

TEST(TokTokenizer, TheFileIsThePinnedOneAndValidates) {
  EXPECT_EQ(io::sha256_hex(io::read_file(kDolma2)), kDolma2Sha256);
  Dolma2Source src = validate_dolma2_tokenizer_json(kDolma2);
  EXPECT_TRUE(src.pinned);
  // Same content, other bytes (keys re-ordered by nlohmann::json): not pinned, but accepted on structure.
  Dolma2Source other = validate_dolma2_tokenizer_json(mutate_file("reordered", [](json&) {}));
  EXPECT_FALSE(other.pinned);
  EXPECT_NE(other.sha256, kDolma2Sha256);
}

TEST(TokTokenizer, DigitProbeNeedsTheCl100kPreTokenizer) {
  EXPECT_EQ(dolma2().encode("9078563412"), (std::vector<int32_t>{23505, 25505, 16546, 17}));
  EXPECT_EQ(dolma2().encode("Hello World"), (std::vector<int32_t>{9906, 4435}));
  // The same vocabulary with GPT-2's regex (digits in one piece): what a tokenizer that lost its
  // pre-tokenizer gives.
  json j = json::parse(io::read_file(kDolma2));
  j["pre_tokenizer"] = {
      {"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  Tokenizer gpt2 = Tokenizer::from_hf_json(j.dump(), "gpt2-style");
  EXPECT_EQ(gpt2.encode("9078563412"), (std::vector<int32_t>{1954, 2495, 3487, 1958, 717}));
}

TEST(TokTokenizer, SpecialTokensOnlyWhenAllowedNonSpecialAlways) {
  const auto& t = dolma2();
  EXPECT_EQ(t.encode("<|endoftext|>hi", true), (std::vector<int32_t>{100257, 6151}));
  auto plain = t.encode("<|endoftext|>hi", false);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 100257), 0);
  EXPECT_EQ(t.decode(plain), "<|endoftext|>hi");
  EXPECT_EQ(t.decode({100257, 6151}, /*skip_special=*/true), "hi");
  // Non-special added tokens are matched in any text (HF's rule for special: false).
  EXPECT_EQ(t.encode("<|extra_id_0|>x", false), (std::vector<int32_t>{100256, 87}));
  EXPECT_EQ(t.encode("|||IP_ADDRESS|||", false), (std::vector<int32_t>{100263}));
  EXPECT_FALSE(t.is_special(100256));
  EXPECT_TRUE(t.is_special(100257));
  EXPECT_EQ(t.token_to_id("<|endofprompt|>"), 100276);
  size_t special = 0;
  for (const auto& a : dolma2_added_tokens()) {
    EXPECT_EQ(t.is_special(a.id), a.special) << a.content;
    special += a.special;
  }
  EXPECT_EQ(dolma2_added_tokens().size(), 22u);
  EXPECT_EQ(special, 8u);
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
  EXPECT_EQ(dolma2().encode("a\xFF"
                            "b"),
            dolma2().encode("a\xEF\xBF\xBD"
                            "b"));
  EXPECT_THROW(dolma2().encode("a\xFF", false, /*strict_utf8=*/true), Error);
}

TEST(TokTokenizer, AlteredDolma2FilesAreRejectedNamingTheKey) {
  // The old `make-dolma2` table: every added token special.
  expect_invalid(mutate_file("all_special",
                             [](json& j) {
                               for (auto& a : j["added_tokens"]) a["special"] = true;
                             }),
                 "added_tokens[0]");
  expect_invalid(mutate_file("no_pad", [](json& j) { j["added_tokens"].erase(21); }), "added_tokens");
  expect_invalid(
      mutate_file("regex",
                  [](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = kGpt2Pattern; }),
      "pre_tokenizer");
  // Two ranks swapped: still a consistent BPE, but not cl100k_base.
  expect_invalid(mutate_file("swapped_ranks",
                             [](json& j) {
                               j["model"]["vocab"]["a"] = 65;
                               j["model"]["vocab"]["b"] = 64;
                             }),
                 "model.vocab");
  expect_invalid(mutate_file("merge_order",
                             [](json& j) { std::swap(j["model"]["merges"][5], j["model"]["merges"][6]); }),
                 "model.merges[5]");
  // A merge that builds the right token from another split (both parts exist with lower ids).
  size_t changed = 0;
  std::string path = mutate_file("merge_split", [&](json& j) {
    const json& vocab = j["model"]["vocab"];
    auto& merges = j["model"]["merges"];
    for (size_t k = 1000; k < merges.size() && !changed; ++k) {
      std::string m = merges[k], whole = m.substr(0, m.find(' ')) + m.substr(m.find(' ') + 1);
      int id = vocab[whole];
      for (size_t q = 1; q < whole.size() && !changed; ++q) {
        std::string l = whole.substr(0, q), r = whole.substr(q);
        if ((static_cast<unsigned char>(whole[q]) & 0xC0) == 0x80 || l + " " + r == m) continue;
        if (vocab.contains(l) && vocab.contains(r) && vocab[l] < id && vocab[r] < id) {
          merges[k] = l + " " + r;
          changed = k;
        }
      }
    }
  });
  ASSERT_GT(changed, 0u);
  expect_invalid(path, "model.merges[" + std::to_string(changed) + "]");
  expect_invalid(mutate_file("extra_vocab", [](json& j) { j["model"]["vocab"]["zzqqzzqq"] = 100278; }),
                 "model.vocab");
  expect_invalid(mutate_file("normalizer",
                             [](json& j) {
                               j["normalizer"] = {{"type", "NFC"}};
                             }),
                 "normalizer");
  std::string missing = testing::TempDir() + "/no_such_dolma2.json";
  EXPECT_THROW(validate_dolma2_tokenizer_json(missing), Error);
}

TEST(TokTokenizer, UnsupportedTokenizersAreRejected) {
  auto expect_rejected = [](const std::function<void(json&)>& f, const std::string& needle) {
    static const json base = json::parse(io::read_file(kDolma2));
    json j = base;
    f(j);
    try {
      Tokenizer::from_hf_json(j.dump(), "test.json");
      ADD_FAILURE() << "accepted a tokenizer that should be rejected (" << needle << ")";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("test.json"), std::string::npos) << e.what();
    }
  };
  expect_rejected([](json& j) { j["model"]["type"] = "WordPiece"; }, "WordPiece");
  expect_rejected([](json& j) { j["model"]["type"] = "Unigram"; }, "Unigram");
  expect_rejected([](json& j) { j["model"]["byte_fallback"] = true; }, "byte_fallback");
  expect_rejected([](json& j) { j["normalizer"] = {{"type", "NFC"}}; }, "normalizer");
  expect_rejected([](json& j) { j["pre_tokenizer"] = {{"type", "Whitespace"}}; }, "Whitespace");
  expect_rejected([](json& j) { j["pre_tokenizer"] = nullptr; }, "pre_tokenizer");
  expect_rejected([](json& j) { j["decoder"] = {{"type", "WordPiece"}}; }, "decoder");
  expect_rejected([](json& j) { j["model"]["merges"][5] = "zzzq qqqz"; }, "missing from the vocab");
  expect_rejected([](json& j) { j["added_tokens"][0]["single_word"] = true; }, "single_word");
  try {
    Tokenizer::from_hf_json("{not json", "test.json");
    ADD_FAILURE() << "accepted invalid JSON";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not valid JSON"), std::string::npos) << e.what();
  }
}

// Found by tests/fuzz/fuzz_tokenizer (docs/fuzz.md): a key of the wrong JSON type threw nlohmann's type_error
// (not an olmosft::Error), a float id was cast with undefined behaviour, and an id far beyond the vocabulary
// made the id table allocate gigabytes of holes. Each is now an error naming the file and the key.
TEST(TokTokenizer, WrongJsonTypesAreErrorsNamingTheKey) {
  // dolma2's first 300 tokens, its merges among them and 4 added tokens (the fuzz seed; loads in
  // milliseconds)
  static const json base = json::parse(
      io::read_file(std::string(OLMOSFT_SOURCE_DIR) + "/tests/fuzz/corpus_tokenizer/dolma2-cl100k-300.json"));
  EXPECT_EQ(Tokenizer::from_hf_json(base.dump(), "test.json").encode("Hello 123").size(), 9u);
  auto expect_error = [](const std::function<void(json&)>& f, const std::string& needle) {
    json j = base;
    f(j);
    try {
      Tokenizer::from_hf_json(j.dump(), "test.json");
      ADD_FAILURE() << "accepted a tokenizer that should be rejected (" << needle << ")";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error([](json& j) { j["model"]["byte_fallback"] = json::object(); },
               "test.json: model.byte_fallback: expected true or false, got {}");
  expect_error([](json& j) { j["model"]["type"] = 5; }, "test.json: model.type: expected a string, got 5");
  expect_error([](json& j) { j["model"] = json::array(); }, "test.json: model: expected an object");
  expect_error([](json& j) { j["pre_tokenizer"]["pretokenizers"][1]["use_regex"] = "no"; },
               "pre_tokenizer.use_regex: expected true or false, got \"no\"");
  expect_error([](json& j) { j["pre_tokenizer"]["pretokenizers"] = 3; },
               "pre_tokenizer.pretokenizers: expected a list, got 3");
  expect_error([](json& j) { j["pre_tokenizer"]["pretokenizers"][0] = 3; }, "expected an object, got 3");
  expect_error([](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = 1; },
               "pre_tokenizer.pattern.Regex: expected a string, got 1");
  expect_error([](json& j) { j["decoder"] = "ByteLevel"; }, "test.json: decoder: expected an object");
  expect_error([](json& j) { j["added_tokens"][0]["special"] = 1; },
               "added_tokens[].special: expected true or false, got 1");
  expect_error([](json& j) { j["added_tokens"][0]["id"] = 1e300; },
               "added_tokens[0].id: expected an integer in [0, 2^31), got 1e+300");
  expect_error(
      [](json& j) {
        j["added_tokens"].push_back({{"id", 50000000}, {"content", "<|far|>"}, {"special", true}});
      },
      "token id 50000000 is far beyond the 305 tokens");
}

// Long single-word runs (tests/reference/tok_long_runs.py, HF tokenizers on the same file): each is one
// pre-tokenizer piece of up to 256 KiB, so the BPE merge loop runs at length. The old merge scanned every
// pair per merge (quadratic: minutes for 256 KiB); this also catches a faster loop that merges in another
// order, since the ids must equal HF's exactly.
TEST(TokTokenizer, LongRunsMatchHfTokenizers) {
  const json g = json::parse(io::read_file(std::string(OLMOSFT_GOLDEN_DIR) + "/tok/long_runs.json"));
  ASSERT_EQ(g["meta"].value("sha256", ""), kDolma2Sha256);
  ASSERT_GE(g["cases"].size(), 5u);
  const Tokenizer& t = dolma2();
  for (const auto& c : g["cases"]) {
    std::string text;
    const std::string unit = c["unit"].get<std::string>();
    for (int64_t r = 0; r < c["reps"].get<int64_t>(); ++r) text += unit;
    const std::vector<int32_t> ids = t.encode(text, /*allow_special=*/false);
    SCOPED_TRACE("unit '" + unit + "' x " + std::to_string(c["reps"].get<int64_t>()));
    ASSERT_EQ(static_cast<int64_t>(ids.size()), c["count"].get<int64_t>());
    const std::vector<int32_t> head = c["head"].get<std::vector<int32_t>>();
    EXPECT_TRUE(std::equal(head.begin(), head.end(), ids.begin()));
    std::string le;  // ids as little-endian int32, as the generator hashes them
    for (int32_t id : ids)
      for (int b = 0; b < 4; ++b) le += static_cast<char>((static_cast<uint32_t>(id) >> (8 * b)) & 0xFF);
    EXPECT_EQ(io::sha256_hex(le), c["sha256"].get<std::string>());
    EXPECT_EQ(t.decode(ids), text);
  }
}
