// A small RAII wrapper over DuckDB's C API (src/data/duckdb_capi.h): an in-memory database, statements, and
// streamed results whose columns are all VARCHAR (callers cast in SQL), fetched chunk by chunk.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace olmosft::duckdb {

// Version string of the linked libduckdb (e.g. "v1.5.6").
std::string library_version();

// Column-major batch of string values; nullopt = SQL NULL.
using StringColumns = std::vector<std::vector<std::optional<std::string>>>;

class Stream;

class Database {
 public:
  Database();  // in-memory
  ~Database();
  Database(const Database&) = delete;
  Database& operator=(const Database&) = delete;

  // Runs a statement; on failure throws olmosft::Error "<what>: <DuckDB's message>".
  void exec(const std::string& sql, const std::string& what);
  // Runs a query whose result is small and whose columns are all VARCHAR; returns column names and values.
  StringColumns query(const std::string& sql, const std::string& what,
                      std::vector<std::string>* names = nullptr);
  // Runs a streaming query (every result column must be VARCHAR).
  std::unique_ptr<Stream> stream(const std::string& sql, const std::string& what);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

class Stream {
 public:
  ~Stream();
  const std::vector<std::string>& column_names() const { return names_; }
  // Appends the next chunk's values to cols (resized to the column count); returns the number of rows added
  // (0 at the end). Errors raised while scanning (e.g. a corrupt file) are thrown as olmosft::Error.
  size_t next(StringColumns& cols);

 private:
  friend class Database;
  Stream() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::vector<std::string> names_;
  std::string what_;
  bool done_ = false;
};

// Quotes s as a SQL string literal ('...' with embedded quotes doubled).
std::string sql_string(const std::string& s);
// Quotes s as a SQL identifier ("..." with embedded quotes doubled).
std::string sql_ident(const std::string& s);

}  // namespace olmosft::duckdb
