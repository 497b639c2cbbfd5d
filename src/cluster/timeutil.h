// RFC 3339 timestamps as Kubernetes writes them (log timestamps: RFC3339Nano, trailing zeros trimmed).
#pragma once
#include <cstdint>
#include <string>

namespace olmosft::cluster {

// Nanoseconds since the Unix epoch; -1 if the text is not "YYYY-MM-DDTHH:MM:SS[.frac](Z|+hh:mm|-hh:mm)".
int64_t parse_rfc3339_ns(const std::string& s);
// "YYYY-MM-DDTHH:MM:SSZ" (whole seconds, what sinceTime takes) or with 9-digit nanoseconds.
std::string format_rfc3339(int64_t ns, bool nanos = false);
int64_t now_ns();

}  // namespace olmosft::cluster
