// Parquet input through Apache Arrow C++ (libparquet + libarrow from the pinned pyarrow wheel; see
// cmake/data.cmake): a file's schema, its row count, and its rows batch by batch, the requested top-level
// columns converted to JSON values (lists -> arrays, structs and maps -> objects, strings checked to be
// UTF-8). Arrow types stay inside parquet_input.cpp.
#pragma once
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace olmosft {

class ParquetInput {
 public:
  // Opens the file and reads its footer; errors (missing, truncated, not Parquet) name the file.
  explicit ParquetInput(const std::string& path);
  ~ParquetInput();
  ParquetInput(const ParquetInput&) = delete;
  ParquetInput& operator=(const ParquetInput&) = delete;

  // Top-level columns: (name, Arrow type as text, e.g. "list<element: struct<role: string, ...>>").
  const std::vector<std::pair<std::string, std::string>>& columns() const { return columns_; }
  bool has(const std::string& name) const;
  // True when the named column is a list type (list, large_list, list_view, fixed_size_list).
  bool is_list(const std::string& name) const;
  int64_t num_rows() const { return num_rows_; }

  // Reads the next batch of about batch_rows rows: rows[r] is a JSON object holding, for each name in `names`
  // that the file has, its value (null for SQL NULL). Returns false at the end. Invalid UTF-8 or an
  // unreadable page throws olmosft::Error naming the file, the row and the column.
  bool next(const std::vector<std::string>& names, int64_t batch_rows, std::vector<nlohmann::json>& rows);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string path_;
  std::vector<std::pair<std::string, std::string>> columns_;
  int64_t num_rows_ = 0, rows_read_ = 0;
};

// "26.0.1": the linked Arrow C++.
std::string arrow_version();

}  // namespace olmosft
