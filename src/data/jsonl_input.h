// JSONL input: one JSON object per line, optionally gzip- or zstd-compressed (.gz/.zst; decompressed by Arrow
// C++'s codecs), read line by line. Each line is parsed by nlohmann::json, so rows of different shapes
// (a `messages` that is a string in one row and a list in another) are validated row by row, not rejected
// by a schema inferred from a sample.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace olmosft {

class JsonlInput {
 public:
  explicit JsonlInput(const std::string& path);
  ~JsonlInput();
  JsonlInput(const JsonlInput&) = delete;
  JsonlInput& operator=(const JsonlInput&) = delete;

  // Appends up to max_lines non-blank lines to `lines` and their 1-based line numbers to `numbers`; returns
  // false when nothing was left.
  bool next(size_t max_lines, std::vector<std::string>& lines, std::vector<int64_t>& numbers);
  // Number of non-blank lines (reads the whole file once; does not disturb next()).
  static int64_t count_lines(const std::string& path);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace olmosft
