#include "data/build_bytes_encoder.h"

#include "core/error.h"
#include "io/hash.h"

namespace olmosft {

EncodedConversation BytesChatEncoder::encode(const Conversation& conv) const {
  EncodedConversation out;
  bool any_assistant = false;
  auto put_text = [&](const std::string& s, uint8_t trained) {
    for (unsigned char c : s) {
      out.tokens.push_back(c);
      out.trained.push_back(trained);
    }
  };
  auto put = [&](int32_t id, uint8_t trained) {
    out.tokens.push_back(id);
    out.trained.push_back(trained);
  };
  for (size_t i = 0; i < conv.messages.size(); ++i) {
    const Message& m = conv.messages[i];
    bool asst = m.role == "assistant";
    any_assistant |= asst;
    uint8_t t = asst ? 1 : 0;
    put(kImStart, 0);
    put_text(m.role + "\n", 0);
    put_text(m.content, t);
    auto fc = m.extra.find("function_calls");
    if (fc != m.extra.end() && fc->is_string())
      put_text("<function_calls>" + fc->get<std::string>() + "</function_calls>", t);
    if (asst && i + 1 == conv.messages.size()) {
      put(kEos, 1);
    } else {
      put(kImEnd, t);
      put('\n', 0);
    }
  }
  if (!any_assistant) fail("conversation has no assistant turn");
  return out;
}

std::vector<int32_t> BytesChatEncoder::encode_prompt(const Conversation& conv) const {
  OLMO_CHECK(!conv.messages.empty(), "prompt has no messages");
  std::vector<int32_t> out;
  auto put_text = [&](const std::string& s) {
    for (unsigned char c : s) out.push_back(c);
  };
  for (const Message& m : conv.messages) {
    out.push_back(kImStart);
    put_text(m.role + "\n");
    put_text(m.content);
    auto fc = m.extra.find("function_calls");
    if (fc != m.extra.end() && fc->is_string())
      put_text("<function_calls>" + fc->get<std::string>() + "</function_calls>");
    out.push_back(kImEnd);
    out.push_back('\n');
  }
  out.push_back(kImStart);
  put_text("assistant\n");
  return out;
}

std::string BytesChatEncoder::decode(const std::vector<int32_t>& ids) const {
  std::string s;
  for (int32_t id : ids) {
    if (id >= 0 && id < 256) {
      s += static_cast<char>(id);
    } else if (id == kImStart) {
      s += "<|im_start|>";
    } else if (id == kImEnd) {
      s += "<|im_end|>";
    } else if (id == kEos) {
      s += "<|endoftext|>";
    } else if (id == kPad) {
      s += "<|pad|>";
    } else {
      s += "<|id:" + std::to_string(id) + "|>";
    }
  }
  return s;
}

std::string BytesChatEncoder::tokenizer_hash() const {
  return io::sha256_hex("olmosft builtin:bytes tokenizer v1");
}
std::string BytesChatEncoder::template_hash() const {
  return io::sha256_hex("olmosft builtin:bytes chatml template v1");
}

std::unique_ptr<ChatEncoder> open_chat_encoder(const std::string& spec) {
  if (spec == "builtin:bytes") return std::make_unique<BytesChatEncoder>();
  OLMO_CHECK(spec.rfind("builtin:", 0) != 0, "--tokenizer ", spec,
             ": unknown builtin (expected builtin:bytes)");
  return load_chat_encoder(spec);
}

}  // namespace olmosft
