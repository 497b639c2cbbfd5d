// Byte counts as people read them in log and error lines.
#pragma once
#include <iomanip>
#include <sstream>
#include <string>

namespace olmosft {

inline constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// Bytes as GiB: "12.62"; 4 decimals below 0.1 GiB ("0.0023").
inline std::string gib(double bytes) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(bytes < 0.1 * kGiB ? 4 : 2) << bytes / kGiB;
  return os.str();
}

}  // namespace olmosft
