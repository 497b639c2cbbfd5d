// A built-in, dependency-free ChatEncoder for tests, benchmarks and smoke runs ("--tokenizer builtin:bytes"):
// UTF-8 bytes are token ids 0..255, plus four specials. Rendering is ChatML-like:
//   <|im_start|>ROLE\nCONTENT<|im_end|>\n     for every message, except that
//   a final assistant message is closed by <|endoftext|> (EOS) instead of "<|im_end|>\n" (as in Olmo's
//   templates).
// Trained tokens: each assistant message's content bytes plus its closer (<|im_end|> or EOS); headers, the
// "\n" after <|im_end|>, and every other role are untrained. A message's string field "function_calls" is
// rendered after its content as <function_calls>...</function_calls> (trained for assistants). Not a real
// tokenizer: it exists so the data pipeline can be tested without one.
#pragma once
#include "data/chat.h"

namespace olmosft {

class BytesChatEncoder : public ChatEncoder {
 public:
  static constexpr int32_t kImStart = 256, kImEnd = 257, kEos = 258, kPad = 259;
  EncodedConversation encode(const Conversation& conv) const override;
  // The messages as encode() renders non-final turns, then the generation prompt <|im_start|>assistant\n.
  std::vector<int32_t> encode_prompt(const Conversation& conv) const override;
  std::vector<int32_t> stop_ids() const override { return {kEos, kImEnd}; }
  std::string decode(const std::vector<int32_t>& ids) const override;
  int32_t eos_id() const override { return kEos; }
  int32_t pad_id() const override { return kPad; }
  int64_t vocab_size() const override { return 260; }
  std::string tokenizer_hash() const override;
  std::string template_hash() const override;
};

// "builtin:bytes" gives the BytesChatEncoder; anything else is a tokenizer directory for load_chat_encoder.
std::unique_ptr<ChatEncoder> open_chat_encoder(const std::string& spec);

}  // namespace olmosft
