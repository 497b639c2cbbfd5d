// Parsing JSON that comes from outside (datasets, CLI inputs, model and tokenizer files) with a nesting
// limit. nlohmann::json parses any depth, but dumping, copying and our own recursive walkers (the chat
// template's tojson, the message reader) recurse once per level, so a row nested a million deep crashes
// the process with a stack overflow. Every outside JSON text goes through parse_json, which scans the
// nesting first (one pass, no recursion) and refuses a text deeper than the limit with an error naming it.
#pragma once
#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace olmosft::io {

// Deeper than any real chat row, tool call or HF config (they nest well under 20).
inline constexpr int kMaxJsonDepth = 256;

// The byte offset of the first '[' or '{' that opens level max_depth + 1 (strings and escapes skipped),
// or std::string_view::npos when the text nests at most max_depth deep. Does not validate the JSON.
size_t json_depth_violation(std::string_view text, int max_depth = kMaxJsonDepth);

// json_depth_violation, then nlohmann::json::parse. Throws olmosft::Error "<what>: ..." for too deep a
// nesting or invalid JSON (with nlohmann's position), so callers need no try/catch of their own.
nlohmann::json parse_json(std::string_view text, const std::string& what, int max_depth = kMaxJsonDepth);

// A value for an error message: its JSON text, cut to max_chars with "... (N bytes)" appended when longer,
// so that a 1 MB string in an input does not make a 1 MB error line.
std::string json_excerpt(const nlohmann::json& value, size_t max_chars = 80);

// The message for a nesting violation at `offset` (shared with callers that report per row).
std::string json_depth_message(size_t offset, int max_depth = kMaxJsonDepth);

}  // namespace olmosft::io
