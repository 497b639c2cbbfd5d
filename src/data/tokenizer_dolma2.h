// `olmosft tokenizer make-dolma2`: builds an HF-format dolma2 tokenizer directory from cl100k_base.tiktoken.
#pragma once
#include <string>
#include <utility>
#include <vector>

namespace olmosft {

// sha256 of OpenAI's cl100k_base.tiktoken (tiktoken's expected_hash; formats.md 3.1).
extern const char* const kCl100kSha256;

// The 22 dolma2 added tokens at ids 100256..100277 (formats.md 3.3): <|extra_id_0|>, <|endoftext|>, fim
// prefix/middle/suffix, |||PHONE_NUMBER|||, |||EMAIL_ADDRESS|||, |||IP_ADDRESS|||, <|im_start|>, <|im_end|>,
// <|extra_id_1..10|>, <|endofprompt|>, <|pad|>.
std::vector<std::pair<std::string, int>> dolma2_added_tokens();

// Writes tokenizer.json (cl100k ranks as HF BPE + merges, cl100k Split regex + ByteLevel, the 22 added
// tokens), tokenizer_config.json (bos = eos = <|endoftext|>, pad = <|pad|>, chat_template) and
// special_tokens_map.json into out_dir (created if needed; files written atomically). Verifies the tiktoken
// sha256 unless verify_sha is false. chat_template empty = the Olmo 3 Think template.
void make_dolma2_tokenizer(const std::string& tiktoken_path, const std::string& out_dir,
                           const std::string& chat_template = "", bool verify_sha = true);

}  // namespace olmosft
