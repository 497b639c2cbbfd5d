// io::parse_json: the nesting limit every outside JSON text goes through (a row nested a million deep used
// to crash `data build` with a stack overflow), and its error messages.
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "io/json.h"

using namespace olmosft;

namespace {
std::string nested(int depth, const std::string& open = "[", const std::string& close = "]") {
  std::string s;
  for (int i = 0; i < depth; ++i) s += open;
  for (int i = 0; i < depth; ++i) s += close;
  return s;
}

std::string error_of(const std::string& text, const std::string& what) {
  try {
    io::parse_json(text, what);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(IoJson, DepthAtTheLimitParsesAndOneMoreIsRefused) {
  EXPECT_EQ(io::json_depth_violation(nested(io::kMaxJsonDepth)), std::string::npos);
  EXPECT_TRUE(io::parse_json(nested(io::kMaxJsonDepth), "x").is_array());
  const std::string deep = nested(io::kMaxJsonDepth + 1);
  EXPECT_EQ(io::json_depth_violation(deep), static_cast<size_t>(io::kMaxJsonDepth));
  const std::string e = error_of(deep, "rows.jsonl line 7");
  EXPECT_NE(e.find("rows.jsonl line 7: JSON nests deeper than 256 levels"), std::string::npos) << e;
}

TEST(IoJson, BracketsInsideStringsAndEscapesDoNotCount) {
  const std::string s = "{\"a\": \"[[[[{{{{\\\"]]]]\", \"b\": [1, {\"c\": \"\\\\\"}]}";
  EXPECT_EQ(io::json_depth_violation(s, 3), std::string::npos);
  EXPECT_EQ(io::json_depth_violation(s, 2), s.find("{\"c\""));
  EXPECT_EQ(io::parse_json(s, "x")["b"][1]["c"], "\\");
}

TEST(IoJson, AMillionDeepIsRefusedWithoutRecursion) {
  const std::string deep = nested(1000000, "{\"k\":", "}");
  EXPECT_EQ(io::json_depth_violation(deep), 5u * io::kMaxJsonDepth);
  EXPECT_NE(error_of(deep, "big.json").find("big.json: JSON nests deeper"), std::string::npos);
}

TEST(IoJson, InvalidJsonNamesTheSource) {
  const std::string e = error_of("{\"a\": [1, 2", "cfg.json");
  EXPECT_EQ(e.rfind("cfg.json: not valid JSON: ", 0), 0u) << e;
}

// Found by tests/e2e/hostile_inputs.sh: nlohmann's parse error quotes the offending token whole, so a number
// of a million digits (a forward --tokens file) made a 1 MB error line; the message is cut.
TEST(IoJson, AHugeInvalidTokenGivesAShortError) {
  const std::string e = error_of("[[1, 2, " + std::string(1000000, '9') + "]]", "tokens.json");
  EXPECT_EQ(e.rfind("tokens.json: not valid JSON: ", 0), 0u) << e.substr(0, 200);
  EXPECT_LT(e.size(), 400u);
  EXPECT_NE(e.find(" bytes)"), std::string::npos) << e;
}

TEST(IoJson, ExcerptCutsLongValuesAtCharacterBoundaries) {
  EXPECT_EQ(io::json_excerpt(nlohmann::json(12)), "12");
  const std::string big(1 << 20, 'x');
  const std::string e = io::json_excerpt(nlohmann::json(big));
  EXPECT_EQ(e, "\"" + std::string(79, 'x') + "... (1048578 bytes)");
  std::string accents;
  for (int i = 0; i < 100; ++i) accents += "\xc3\xa9";  // é: two bytes each
  const std::string a = io::json_excerpt(nlohmann::json(accents), 10);
  EXPECT_EQ(a.substr(0, 9), "\"\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9");  // the quote and 4 whole characters
  EXPECT_EQ(a.substr(9, 4), "... ");
}
