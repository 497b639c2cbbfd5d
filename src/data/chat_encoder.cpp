// load_chat_encoder (chat.h): HF tokenizer dir -> tokenizer + chat template + span-derived loss mask.
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/chat.h"
#include "data/labels.h"
#include "data/template.h"
#include "data/tokenizer.h"
#include "data/tokenizer_util.h"
#include "io/atomic_file.h"
#include "io/hash.h"
#include "io/json.h"

namespace olmosft {

namespace {

std::string token_string(const nlohmann::json& cfg, const char* key, const std::string& file) {
  if (!cfg.contains(key) || cfg[key].is_null()) return "";
  const auto& v = cfg[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string())
    return v["content"].get<std::string>();
  fail(file, ": ", key, " must be a string or {\"content\": ...}");
}

class HfChatEncoder : public ChatEncoder {
 public:
  explicit HfChatEncoder(const std::string& dir)
      : tok_(Tokenizer::from_hf_json_file(dir + "/tokenizer.json")), tmpl_(nullptr) {
    std::string cfg_path = dir + "/tokenizer_config.json";
    std::string tj = io::read_file(dir + "/tokenizer.json");
    std::string cj = io::read_file(cfg_path);
    const nlohmann::json cfg = io::parse_json(cj, cfg_path);
    eos_token_ = token_string(cfg, "eos_token", cfg_path);
    bos_token_ = token_string(cfg, "bos_token", cfg_path);
    pad_token_ = token_string(cfg, "pad_token", cfg_path);
    if (eos_token_.empty()) fail(cfg_path, ": no eos_token");
    eos_id_ = tok_.token_to_id(eos_token_);
    if (eos_id_ < 0) fail(cfg_path, ": eos_token '", eos_token_, "' is not in the vocabulary");
    pad_id_ = pad_token_.empty() ? eos_id_ : tok_.token_to_id(pad_token_);
    if (pad_id_ < 0) fail(cfg_path, ": pad_token '", pad_token_, "' is not in the vocabulary");
    std::string jinja_path = dir + "/chat_template.jinja", origin;
    if (std::filesystem::exists(jinja_path)) {
      template_ = io::read_file(jinja_path);
      origin = jinja_path;
    } else if (cfg.contains("chat_template") && cfg["chat_template"].is_string()) {
      template_ = cfg["chat_template"].get<std::string>();
      origin = cfg_path + " chat_template";
    } else if (cfg.contains("chat_template") && cfg["chat_template"].is_array()) {
      for (auto& t : cfg["chat_template"])
        if (t.value("name", "") == "default") template_ = t.value("template", "");
      origin = cfg_path + " chat_template[default]";
    }
    if (template_.empty())
      fail(dir, ": no chat template (chat_template.jinja or tokenizer_config.json chat_template)");
    tmpl_ = std::make_unique<tmpl::Template>(template_, origin);
    tokenizer_hash_ = io::sha256_hex(io::sha256_hex(tj) + io::sha256_hex(cj));
    template_hash_ = io::sha256_hex(template_);
  }

  nlohmann::ordered_json vars(const Conversation& conv, size_t n, bool gen) const {
    nlohmann::ordered_json msgs = nlohmann::ordered_json::array();
    for (size_t k = 0; k < n; ++k) {
      const Message& m = conv.messages[k];
      nlohmann::ordered_json j = {{"role", m.role}, {"content", m.content}};
      for (auto& [key, v] : m.extra.items())
        if (key != "role") j[key] = v;  // e.g. functions, function_calls; "content": null overrides
      msgs.push_back(std::move(j));
    }
    nlohmann::ordered_json v = {{"messages", msgs},
                                {"add_generation_prompt", gen},
                                {"eos_token", eos_token_},
                                {"bos_token", bos_token_},
                                {"pad_token", pad_token_}};
    for (auto& [key, x] : conv.extra.items()) v[key] = x;
    return v;
  }

  EncodedConversation encode(const Conversation& conv) const override {
    for (size_t i = 0; i < conv.messages.size(); ++i) {
      if (conv.messages[i].role == "system" && i != 0)
        fail("message ", i,
             ": a system message after the first position is rejected (docs/reference/sft_pipeline.md 1.4)");
    }
    EncodedConversation out;
    out.tokens = tok_.encode(tmpl_->render(vars(conv, conv.messages.size(), false)).text, true);
    std::vector<SpanTurn> turns;
    for (size_t i = 0; i < conv.messages.size(); ++i) {
      if (conv.messages[i].role != "assistant") continue;
      SpanTurn t;
      t.index = i;
      if (i > 0) t.header_tokens = tok_.encode(tmpl_->render(vars(conv, i, true)).text, true);
      t.through_tokens = tok_.encode(tmpl_->render(vars(conv, i + 1, false)).text, true);
      turns.push_back(std::move(t));
    }
    if (turns.empty()) fail("conversation has no assistant turn (nothing to train)");
    out.trained = derive_trained_mask(out.tokens, turns, [&](int32_t id) { return tok_.is_special(id); });
    return out;
  }
  std::vector<int32_t> encode_prompt(const Conversation& conv) const override {
    OLMO_CHECK(!conv.messages.empty(), "prompt has no messages");
    for (size_t i = 1; i < conv.messages.size(); ++i) {
      if (conv.messages[i].role == "system")
        fail("message ", i,
             ": a system message after the first position is rejected (docs/reference/sft_pipeline.md 1.4)");
    }
    return tok_.encode(tmpl_->render(vars(conv, conv.messages.size(), true)).text, true);
  }
  std::vector<int32_t> stop_ids() const override {
    std::vector<int32_t> ids = {eos_id_};
    int32_t im_end = tok_.token_to_id("<|im_end|>");
    if (im_end >= 0 && im_end != eos_id_ && tok_.is_special(im_end)) ids.push_back(im_end);
    return ids;
  }
  std::string decode(const std::vector<int32_t>& ids) const override { return tok_.decode(ids); }
  int32_t eos_id() const override { return eos_id_; }
  int32_t pad_id() const override { return pad_id_; }
  int64_t vocab_size() const override { return tok_.vocab_size(); }
  std::string tokenizer_hash() const override { return tokenizer_hash_; }
  std::string template_hash() const override { return template_hash_; }

 private:
  Tokenizer tok_;
  std::unique_ptr<tmpl::Template> tmpl_;
  std::string template_, eos_token_, bos_token_, pad_token_, tokenizer_hash_, template_hash_;
  int32_t eos_id_ = -1, pad_id_ = -1;
};

}  // namespace

std::vector<int32_t> ChatEncoder::encode_prompt(const Conversation&) const {
  fail("this tokenizer cannot render generation prompts");
}

std::unique_ptr<ChatEncoder> load_chat_encoder(const std::string& tokenizer_dir) {
  return std::make_unique<HfChatEncoder>(tokenizer_dir);
}

}  // namespace olmosft
