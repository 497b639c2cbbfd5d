// libFuzzer entry point for the HF tokenizer.json loader (src/data/tokenizer.cpp): the input is the file's
// text. When it loads, a short fixed text (ASCII, digits, UTF-8, invalid UTF-8, an added token's marker) is
// encoded with and without special tokens and decoded again. Any input must either load or throw
// olmosft::Error; a crash, a sanitizer report, another exception type or a hang (-timeout) is a bug.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "data/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  static const std::string kProbe =
      "Hello world 9078563412 <|endoftext|>  tabs\tand\nnewlines \xc3\xbcn\xc3\xaf \xff\xfe end";
  try {
    olmosft::Tokenizer t = olmosft::Tokenizer::from_hf_json(text, "fuzz/tokenizer.json");
    for (bool special : {false, true}) {
      std::vector<int32_t> ids = t.encode(kProbe, special);
      for (int32_t id : ids)
        if (id < 0 || id >= t.vocab_size()) std::abort();  // every id must be inside the vocabulary
      (void)t.decode(ids, special);
    }
  } catch (const olmosft::Error&) {
  }
  return 0;
}
