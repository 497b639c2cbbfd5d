// The contract between the tokenizer/chat-template code (src/data/tokenizer*, src/data/template*,
// src/data/labels*) and the data build (src/data/build*): a conversation in, token ids and an explicit
// per-token "trained" mask out. Labels come from template spans, never from token-id equality.
#pragma once
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace olmosft {

struct Message {
  std::string role;     // system, user, assistant, tool, environment, ...
  std::string content;  // may be empty
  nlohmann::json extra =
      nlohmann::json::object();  // other fields of the message (functions, tool_calls, ...)
};

struct Conversation {
  std::vector<Message> messages;
  nlohmann::json extra = nlohmann::json::object();  // conversation-level fields (tools, functions, ...)
};

struct EncodedConversation {
  std::vector<int32_t> tokens;
  std::vector<uint8_t> trained;  // 1 = this token is a training target (the model learns to emit it)
};

// Renders a conversation with the model's chat template, tokenizes it and derives the loss mask.
class ChatEncoder {
 public:
  virtual ~ChatEncoder() = default;
  // Throws olmosft::Error naming the problem when the conversation cannot be encoded (no assistant turn,
  // spans that cannot be derived, ...); the data build counts and skips such rows by its policy.
  virtual EncodedConversation encode(const Conversation& conv) const = 0;
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  // The conversation rendered as a prompt for the next assistant turn (the chat template with
  // add_generation_prompt=true) and tokenized, for generation. The default throws (not supported).
  virtual std::vector<int32_t> encode_prompt(const Conversation& conv) const;
  // Ids that end an assistant turn when generating: EOS and, when the vocabulary has it as a special token,
  // <|im_end|>. The default is {eos_id()}.
  virtual std::vector<int32_t> stop_ids() const { return {eos_id()}; }
  virtual int32_t eos_id() const = 0;
  virtual int32_t pad_id() const = 0;
  virtual int64_t vocab_size() const = 0;
  // Content hash of the tokenizer files and chat template (recorded in dataset manifests).
  virtual std::string tokenizer_hash() const = 0;
  virtual std::string template_hash() const = 0;
};

// Loads tokenizer.json + tokenizer_config.json (or chat_template.jinja) from an HF tokenizer directory.
std::unique_ptr<ChatEncoder> load_chat_encoder(const std::string& tokenizer_dir);

}  // namespace olmosft
