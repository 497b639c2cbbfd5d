// One exception type for every user-facing failure: the message names the input (file, row, key,
// flag) and what was expected. The CLI prints it and exits non-zero.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace olmosft {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

namespace detail {
inline void append(std::ostringstream&) {}
template <typename T, typename... R>
void append(std::ostringstream& os, const T& v, const R&... rest) {
  os << v;
  append(os, rest...);
}
}  // namespace detail

// Builds a message from pieces: fail("file ", path, ": expected ", n, " bytes").
template <typename... A>
[[noreturn]] void fail(const A&... parts) {
  std::ostringstream os;
  detail::append(os, parts...);
  throw Error(os.str());
}

}  // namespace olmosft

// Checks an invariant or an input; on failure throws olmosft::Error with the given message parts.
#define OLMO_CHECK(cond, ...)                  \
  do {                                         \
    if (!(cond)) ::olmosft::fail(__VA_ARGS__); \
  } while (0)
