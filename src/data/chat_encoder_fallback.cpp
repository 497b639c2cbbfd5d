// Link-time fallback until the tokenizer branch provides load_chat_encoder (the lead deletes this file at
// merge).
#include "core/error.h"
#include "data/chat.h"

namespace olmosft {

__attribute__((weak)) std::unique_ptr<ChatEncoder> load_chat_encoder(const std::string& tokenizer_dir) {
  throw Error("no tokenizer implementation linked (cannot load " + tokenizer_dir +
              "); use --tokenizer builtin:bytes for the test encoder");
}

}  // namespace olmosft
