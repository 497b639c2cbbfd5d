// Reads the conversations of `olmosft data build` from the resolved input files.
//   Without --sql: Parquet through Arrow C++ (src/data/parquet_input.h), JSONL line by line
//   (src/data/jsonl_input.h); files in path order, Parquet files first.
//   With --sql: DuckDB's CLI (src/data/duckdb_cli.h) runs the selection over the view `input` and writes the
//   selected rows to a temporary Parquet file, which Arrow then reads.
// Each row becomes a RawConversation; its source is, per row, the --source-column value, else the first
// non-null of source_dataset and source, else the input file's base name.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/source.h"

namespace olmosft {

class ConversationReader {
 public:
  // Validates the inputs up front where their schema says enough: a Parquet file without a `messages`
  // column, or with one that is not a list, is an error naming the file; with --sql, DuckDB runs the query
  // here (its errors name --sql).
  ConversationReader(const std::vector<InputFile>& files, const SourceOptions& opts);
  ~ConversationReader();
  // Number of rows the scan will yield (Parquet footers; JSONL non-blank lines).
  int64_t count_rows();
  // Appends up to about max_rows rows; false at the end.
  bool next(std::vector<RawConversation>& out, size_t max_rows);
  // How each row's source is chosen (recorded in the manifest).
  const std::string& source_expression() const;
  // The libraries that read the rows, e.g. "Arrow 26.0.1" or "DuckDB v1.5.6 + Arrow 26.0.1".
  std::string readers() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace olmosft
