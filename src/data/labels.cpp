#include "data/labels.h"

#include <algorithm>

#include "core/error.h"

namespace olmosft {

namespace {
size_t lcp(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t n = std::min(a.size(), b.size()), k = 0;
  while (k < n && a[k] == b[k]) ++k;
  return k;
}
}  // namespace

std::vector<uint8_t> derive_trained_mask(const std::vector<int32_t>& full, const std::vector<SpanTurn>& turns,
                                         const std::function<bool(int32_t)>& is_special) {
  std::vector<uint8_t> mask(full.size(), 0);
  for (const SpanTurn& t : turns) {
    size_t start = t.index == 0 ? 0 : lcp(t.header_tokens, full);
    const auto& th = t.through_tokens;
    size_t end = lcp(th, full);
    if (end < th.size()) {
      bool closer_swap =
          end + 1 == th.size() && end < full.size() && is_special(th[end]) && is_special(full[end]);
      if (!closer_swap)
        fail("message ", t.index, " (assistant): render(messages[:", t.index + 1,
             "]) diverges from the full render at token ", end, " of ", th.size(),
             " (not just in the turn closer); span cannot be derived");
      ++end;
    }
    if (end <= start)
      fail("message ", t.index, " (assistant): empty token span [", start, ", ", end,
           ") (its generation prompt is not a prefix of the full render); span cannot be derived");
    if (!is_special(full[end - 1]))
      fail("message ", t.index, " (assistant): its span does not end in a special closing token (id ",
           full[end - 1], "); span cannot be derived");
    std::fill(mask.begin() + static_cast<ptrdiff_t>(start), mask.begin() + static_cast<ptrdiff_t>(end), 1);
  }
  return mask;
}

}  // namespace olmosft
