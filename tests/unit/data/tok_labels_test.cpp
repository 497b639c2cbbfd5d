// ChatEncoder on a `tokenizer dolma2` dir (the real dolma2 tokenizer.json + the Olmo 3 think template): token
// ids and trained masks equal the independent reference (tests/reference/tok_labels.py: Python jinja2 renders
// tokenized by HF tokenizers on the same file, same span rule), the final EOS is a trained target although
// bos == eos, and rows whose spans cannot be derived are rejected.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "../scratch_dir.h"
#include "core/error.h"
#include "core/threads.h"
#include "data/chat.h"
#include "data/template_olmo.h"
#include "data/tokenizer.h"
#include "data/tokenizer_dolma2.h"
#include "data/tokenizer_util.h"
#include "io/atomic_file.h"
#include "io/hash.h"

using namespace olmosft;
using nlohmann::json;

namespace {
const std::string kGolden = std::string(OLMOSFT_GOLDEN_DIR) + "/tok/";
const std::string kDolma2 = std::string(OLMOSFT_SOURCE_DIR) + "/deps/dolma2/allenai_dolma2.json";

// Builds the dolma2 dir (think template) and a copy using the instruct-style template, once per process, in a
// directory of its own (ctest runs every TEST as a separate process, possibly in parallel), removed at exit.
const std::string& dolma2_dir(bool instruct) {
  static const testutil::ScratchDir scratch("tok_labels_dolma2");
  static const std::string base = [] {
    std::string d = scratch / "think";
    write_dolma2_tokenizer_dir(kDolma2, d);
    std::string d2 = scratch / "instruct";
    std::filesystem::create_directories(d2);
    for (const char* f : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"})
      std::filesystem::copy_file(d + "/" + f, d2 + "/" + f,
                                 std::filesystem::copy_options::overwrite_existing);
    std::filesystem::copy_file(kGolden + "templates/olmo3_instruct.jinja", d2 + "/chat_template.jinja",
                               std::filesystem::copy_options::overwrite_existing);
    return d;
  }();
  static const std::string inst = scratch / "instruct";
  return instruct ? inst : base;
}

Conversation to_conv(const json& msgs, const json& extra) {
  Conversation c;
  for (auto& m : msgs) {
    Message msg{m["role"].get<std::string>(),
                m["content"].is_string() ? m["content"].get<std::string>() : ""};
    for (auto& [k, v] : m.items())
      if (k != "role" && !(k == "content" && v.is_string())) msg.extra[k] = v;
    c.messages.push_back(std::move(msg));
  }
  if (extra.is_object()) c.extra = extra;
  return c;
}
}  // namespace

TEST(TokLabels, MasksMatchTheReference) {
  json t = json::parse(io::read_file(kGolden + "templates.json"));
  json l = json::parse(io::read_file(kGolden + "labels.json"));
  auto think = load_chat_encoder(dolma2_dir(false));
  auto instruct = load_chat_encoder(dolma2_dir(true));
  size_t compared = 0, rejected = 0;
  for (auto& row : l["rows"]) {
    std::string tname = row["template"], cname = row["conversation"];
    const ChatEncoder& enc = tname == "olmo3_think" ? *think : *instruct;
    Conversation conv = to_conv(t["conversations"][cname], t["extra"].value(cname, json::object()));
    std::string what = tname + " x " + cname;
    if (row.contains("error")) {
      EXPECT_THROW(enc.encode(conv), Error) << what << " should be rejected: " << row["error"];
      ++rejected;
      continue;
    }
    EncodedConversation e = enc.encode(conv);
    EXPECT_EQ(e.tokens, row["tokens"].get<std::vector<int32_t>>()) << what;
    EXPECT_EQ(e.trained, row["trained"].get<std::vector<uint8_t>>()) << what;
    ++compared;
  }
  EXPECT_EQ(compared, 19u);
  EXPECT_EQ(rejected, 5u);
}

TEST(TokLabels, FinalEosIsTrainedEvenThoughBosEqualsEos) {
  auto enc = load_chat_encoder(dolma2_dir(false));
  nlohmann::json cfg = json::parse(io::read_file(dolma2_dir(false) + "/tokenizer_config.json"));
  ASSERT_EQ(cfg["bos_token"], cfg["eos_token"]);  // the trap configuration
  Conversation c;
  c.messages = {{"user", "Name a colour."},
                {"assistant", "<think>Pick one.</think>Blue."},
                {"user", "Another?"},
                {"assistant", "Red."}};
  EncodedConversation e = enc->encode(c);
  ASSERT_EQ(e.tokens.size(), e.trained.size());
  EXPECT_EQ(e.tokens.back(), 100257);
  EXPECT_EQ(e.trained.back(), 1) << "the final EOS must be a training target";
  EXPECT_EQ(enc->eos_id(), 100257);
  EXPECT_EQ(enc->pad_id(), 100277);
  EXPECT_EQ(enc->vocab_size(), 100278);
  // Mid-conversation closer trained, the "\n" after it and every <|im_start|> untrained.
  size_t im_end_trained = 0;
  for (size_t k = 0; k < e.tokens.size(); ++k) {
    if (e.tokens[k] == 100265 && e.trained[k]) {
      ++im_end_trained;
      EXPECT_EQ(e.trained[k + 1], 0);
    }
    if (e.tokens[k] == 100264) {
      EXPECT_EQ(e.trained[k], 0);
    }
  }
  EXPECT_EQ(im_end_trained, 1u);
  // The trained text is exactly the assistant content plus closers (modulo the straddling '<think' token).
  std::string trained_text;
  for (size_t k = 0; k < e.tokens.size(); ++k) {
    if (e.trained[k]) trained_text += enc->decode({e.tokens[k]});
  }
  EXPECT_EQ(trained_text, ">Pick one.</think>Blue.<|im_end|>Red.<|endoftext|>");
}

TEST(TokLabels, EncodeIsThreadSafe) {
  auto enc = load_chat_encoder(dolma2_dir(false));
  json t = json::parse(io::read_file(kGolden + "templates.json"));
  std::vector<Conversation> convs;
  for (const char* c : {"single_turn", "multi_turn", "tools", "unicode_and_specials"})
    convs.push_back(to_conv(t["conversations"][c], t["extra"].value(c, json::object())));
  std::vector<EncodedConversation> serial;
  for (auto& c : convs) serial.push_back(enc->encode(c));
  set_threads(2);
  std::vector<int> ok(64, 0);
  parallel_for(64, [&](int64_t b, int64_t e) {
    for (int64_t k = b; k < e; ++k) {
      EncodedConversation x = enc->encode(convs[k % convs.size()]);
      ok[k] = x.tokens == serial[k % convs.size()].tokens && x.trained == serial[k % convs.size()].trained;
    }
  });
  EXPECT_EQ(std::count(ok.begin(), ok.end(), 1), 64);
}

TEST(TokLabels, RowsWithoutDerivableSpansAreRejected) {
  auto enc = load_chat_encoder(dolma2_dir(false));
  Conversation none;
  none.messages = {{"user", "hi"}};
  EXPECT_THROW(enc->encode(none), Error);
  Conversation late;
  late.messages = {{"user", "hi"}, {"system", "late"}, {"assistant", "yo"}};
  EXPECT_THROW(enc->encode(late), Error);
}

TEST(TokLabels, EmbeddedTemplateAndDirContents) {
  EXPECT_EQ(std::string(kOlmo3ThinkTemplate), io::read_file(kGolden + "templates/olmo3_think.jinja"));
  json cfg = json::parse(io::read_file(dolma2_dir(false) + "/tokenizer_config.json"));
  EXPECT_EQ(cfg["chat_template"], std::string(kOlmo3ThinkTemplate));
  EXPECT_EQ(cfg["pad_token"], "<|pad|>");
  Tokenizer tk = Tokenizer::from_hf_json_file(dolma2_dir(false) + "/tokenizer.json");
  EXPECT_EQ(tk.vocab_size(), 100278);
  for (const auto& a : dolma2_added_tokens()) {
    EXPECT_EQ(tk.encode(a.content, true), std::vector<int32_t>{a.id}) << a.content;
    EXPECT_EQ(tk.is_special(a.id), a.special) << a.content;
  }
  EXPECT_EQ(dolma2_added_tokens().size(), 22u);
  // tokenizer.json is the upstream file byte for byte; the config's added_tokens_decoder carries its flags.
  EXPECT_EQ(io::sha256_hex(io::read_file(dolma2_dir(false) + "/tokenizer.json")), kDolma2Sha256);
  EXPECT_EQ(cfg["added_tokens_decoder"]["100256"]["special"], false);
  EXPECT_EQ(cfg["added_tokens_decoder"]["100265"]["special"], true);
  EXPECT_EQ(cfg["eos_token"], "<|endoftext|>");
  EXPECT_EQ(tk.encode("9078563412"), (std::vector<int32_t>{23505, 25505, 16546, 17}));
  auto a = load_chat_encoder(dolma2_dir(false)), b = load_chat_encoder(dolma2_dir(true));
  EXPECT_EQ(a->tokenizer_hash().size(), 64u);
  EXPECT_EQ(a->tokenizer_hash(), b->tokenizer_hash());
  EXPECT_NE(a->template_hash(), b->template_hash());
}

TEST(TokLabels, Dolma2VerbRejectsAWrongFileAndWritesNothing) {
  const testutil::ScratchDir scratch("tok_labels_verb");
  std::string out = scratch / "never";
  std::string bad = scratch / "not_dolma2.json";
  io::write_file_atomic(bad, "{\"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}}");
  for (const std::string& in : {bad, scratch / "no_such_file.json"}) {
    try {
      write_dolma2_tokenizer_dir(in, out);
      ADD_FAILURE() << "accepted " << in;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(in), std::string::npos)
          << "error must name the file: " << e.what();
    }
    EXPECT_FALSE(std::filesystem::exists(out));
  }
}
