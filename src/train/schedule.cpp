#include "train/schedule.h"

#include <algorithm>

#include "core/error.h"

namespace olmosft {

double Schedule::at(int64_t s) const {
  OLMO_CHECK(s >= 1, "schedule: steps are 1-indexed, got ", s);
  if (warmup_steps > 0 && s <= warmup_steps)
    return lr * static_cast<double>(s) / static_cast<double>(warmup_steps);
  if (kind == "constant") return lr;
  if (s >= horizon) return lr * final_frac;
  double frac = static_cast<double>(s - warmup_steps) /
                static_cast<double>(std::max<int64_t>(1, horizon - warmup_steps));
  return lr * (final_frac + (1.0 - final_frac) * (1.0 - frac));
}

}  // namespace olmosft
