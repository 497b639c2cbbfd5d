#include "data/labels.h"

#include <algorithm>

#include "core/error.h"

namespace olmosft {

std::vector<uint8_t> derive_trained_mask(
    const SpanInputs& in, const std::function<std::string(const std::vector<int32_t>&)>& decode) {
  const auto& full = in.full_tokens;
  std::vector<uint8_t> mask(full.size(), 0);
  auto starts_with = [](const std::string& s, const std::string& p) {
    return s.compare(0, p.size(), p) == 0;
  };
  bool prefix_stable = true;
  for (auto& t : in.turns) {
    if (!starts_with(in.full_text, t.through)) prefix_stable = false;
    if (t.index > 0 && !starts_with(in.full_text, t.header)) prefix_stable = false;
  }
  for (auto& t : in.turns) {
    size_t start = 0;
    if (t.index > 0) {
      if (prefix_stable) {
        size_t n = std::min(full.size(), t.header_tokens.size());
        while (start < n && full[start] == t.header_tokens[start]) ++start;
      } else {
        start = t.header_tokens.size();
      }
    }
    size_t end = std::min(t.through_tokens.size(), full.size());
    if (start >= end) continue;
    if (!prefix_stable) {
      std::string span = decode(std::vector<int32_t>(full.begin() + static_cast<ptrdiff_t>(start),
                                                     full.begin() + static_cast<ptrdiff_t>(end)));
      size_t ws = span.find_first_not_of(" \t\n\r\f\v");
      std::string stripped = ws == std::string::npos ? "" : span.substr(ws);
      bool ok = span.find(t.content) != std::string::npos && starts_with(stripped, t.content);
      for (auto& later : t.later)
        if (!later.empty() && span.find(later) != std::string::npos) ok = false;
      if (!ok)
        fail("message ", t.index, " (assistant): its token span [", start, ", ", end,
             ") does not hold exactly its content (span derivation failed; row is skipped)");
    }
    std::fill(mask.begin() + static_cast<ptrdiff_t>(start), mask.begin() + static_cast<ptrdiff_t>(end), 1);
  }
  return mask;
}

}  // namespace olmosft
