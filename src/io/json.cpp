#include "io/json.h"

#include "core/error.h"

namespace olmosft::io {

size_t json_depth_violation(std::string_view text, int max_depth) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped character cannot end the string
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    switch (c) {
      case '"':
        in_string = true;
        break;
      case '[':
      case '{':
        if (++depth > max_depth) return i;
        break;
      case ']':
      case '}':
        if (depth > 0) --depth;
        break;
      default:
        break;
    }
  }
  return std::string_view::npos;
}

std::string json_depth_message(size_t offset, int max_depth) {
  return "JSON nests deeper than " + std::to_string(max_depth) + " levels (level " +
         std::to_string(max_depth + 1) + " opens at byte " + std::to_string(offset) + ")";
}

std::string json_excerpt(const nlohmann::json& value, size_t max_chars) {
  std::string s = value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (s.size() <= max_chars) return s;
  const size_t total = s.size();
  size_t cut = max_chars;
  while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;  // whole UTF-8 characters
  s.resize(cut);
  return s + "... (" + std::to_string(total) + " bytes)";
}

nlohmann::json parse_json(std::string_view text, const std::string& what, int max_depth) {
  const size_t bad = json_depth_violation(text, max_depth);
  OLMO_CHECK(bad == std::string_view::npos, what, ": ", json_depth_message(bad, max_depth));
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    // nlohmann quotes the offending token whole: a 1 MB number made a 1 MB error line.
    std::string msg = e.what();
    if (msg.size() > 300) msg = msg.substr(0, 300) + "... (" + std::to_string(msg.size()) + " bytes)";
    throw Error(what + ": not valid JSON: " + msg);
  }
}

}  // namespace olmosft::io
