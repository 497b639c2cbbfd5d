// Loss labels from template spans (sft_pipeline.md 1.4, the MaxText "prefix" rule = open-instruct's
// token-count rule): for each assistant message i,
//   start = 0 if i == 0; else, if every header/through render is a literal prefix of the full render
//           ("prefix-stable"), the first index where tok(full) and tok(render(conv[:i], gen=True)) differ;
//           otherwise len(tok(render(conv[:i], gen=True)));
//   end   = min(len(tok(render(conv[:i+1]))), len(tok(full))).
// Non-prefix-stable spans are verified (decoded span contains the content, starts with it after lstrip,
// contains no later message's content). Labels never come from token-id equality.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace olmosft {

struct SpanInputs {
  std::vector<int32_t> full_tokens;
  std::string full_text;
  struct Turn {
    size_t index;                 // message index
    std::string header, through;  // render(conv[:i], gen=True) ("" for i == 0), render(conv[:i+1])
    std::vector<int32_t> header_tokens, through_tokens;
    std::string content;             // the assistant message's content
    std::vector<std::string> later;  // contents of the messages after it
  };
  std::vector<Turn> turns;
};

// Returns the per-token trained mask; throws olmosft::Error naming the message when a span fails
// verification. decode maps ids to text for the verification.
std::vector<uint8_t> derive_trained_mask(
    const SpanInputs& in, const std::function<std::string(const std::vector<int32_t>&)>& decode);

}  // namespace olmosft
