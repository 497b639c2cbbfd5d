// Loss labels from template spans, never from token-id equality. The rule ("token-LCP rule", docs/tok.md):
// for each assistant message i, with H = tok(render(conv[:i], add_generation_prompt=True)) (empty for i ==
// 0), T = tok(render(conv[:i+1])) and F = tok(full render):
//   start = LCP(H, F)   (the generation prompt stays untrained; a token straddling its end is trained,
//                        exactly MaxText's prefix-stable branch, docs/reference/sft_pipeline.md 1.4)
//   end   = LCP(T, F), plus one when T and F differ only in that next token and both are special tokens
//           (the turn closer: EOS when the turn is rendered last, <|im_end|> inside the full render).
// Trained = [start, end) per assistant turn: content, function calls and the closer (<|im_end|> mid-
// conversation, EOS at the end). A turn whose renders do not line up (end < start, the renders diverge
// before the closer, the span does not end in a special token) is a span-derivation failure: the whole row
// is rejected with an olmosft::Error (the data build counts and skips it, as open-instruct drops such rows).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace olmosft {

struct SpanTurn {
  size_t index = 0;                     // message index of the assistant turn
  std::vector<int32_t> header_tokens;   // tok(render(conv[:i], gen=True)); empty for i == 0
  std::vector<int32_t> through_tokens;  // tok(render(conv[:i+1], gen=False))
};

// Returns the per-token trained mask over full_tokens. is_special tells whether an id is a special token.
std::vector<uint8_t> derive_trained_mask(const std::vector<int32_t>& full_tokens,
                                         const std::vector<SpanTurn>& turns,
                                         const std::function<bool(int32_t)>& is_special);

}  // namespace olmosft
