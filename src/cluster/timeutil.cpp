#include "cluster/timeutil.h"

#include <chrono>
#include <cstdio>
#include <ctime>

namespace olmosft::cluster {

int64_t parse_rfc3339_ns(const std::string& s) {
  int Y, M, D, h, m, sec;
  int used = 0;
  if (std::sscanf(s.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d%n", &Y, &M, &D, &h, &m, &sec, &used) != 6 || used != 19)
    return -1;
  if (M < 1 || M > 12 || D < 1 || D > 31 || h > 23 || m > 59 || sec > 60) return -1;
  size_t i = 19;
  int64_t frac = 0;
  if (i < s.size() && s[i] == '.') {
    ++i;
    int nd = 0;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') {
      if (nd < 9) frac = frac * 10 + (s[i] - '0'), ++nd;
      ++i;
    }
    if (nd == 0) return -1;
    for (; nd < 9; ++nd) frac *= 10;
  }
  int64_t off = 0;
  if (i < s.size() && (s[i] == 'Z' || s[i] == 'z')) {
    ++i;
  } else if (i + 6 <= s.size() && (s[i] == '+' || s[i] == '-')) {
    int oh, om;
    if (std::sscanf(s.c_str() + i + 1, "%2d:%2d", &oh, &om) != 2) return -1;
    off = (oh * 3600 + om * 60) * (s[i] == '+' ? 1 : -1);
    i += 6;
  } else {
    return -1;
  }
  if (i != s.size()) return -1;
  std::tm t{};
  t.tm_year = Y - 1900, t.tm_mon = M - 1, t.tm_mday = D, t.tm_hour = h, t.tm_min = m, t.tm_sec = sec;
  int64_t secs = static_cast<int64_t>(timegm(&t)) - off;
  return secs * 1000000000LL + frac;
}

std::string format_rfc3339(int64_t ns, bool nanos) {
  std::time_t secs =
      static_cast<std::time_t>(ns >= 0 ? ns / 1000000000LL : (ns - 999999999LL) / 1000000000LL);
  int64_t frac = ns - static_cast<int64_t>(secs) * 1000000000LL;
  std::tm t{};
  gmtime_r(&secs, &t);
  char buf[64];
  if (nanos)
    std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%09lldZ", t.tm_year + 1900, t.tm_mon + 1,
                  t.tm_mday, t.tm_hour, t.tm_min, t.tm_sec, static_cast<long long>(frac));
  else
    std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02dZ", t.tm_year + 1900, t.tm_mon + 1,
                  t.tm_mday, t.tm_hour, t.tm_min, t.tm_sec);
  return buf;
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace olmosft::cluster
