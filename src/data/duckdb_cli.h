// DuckDB through its official command-line binary (the `duckdb-cli` PyPI wheel, installed into deps/venv by
// scripts/install-deps.sh): `olmosft data build --sql` runs the user's selection in DuckDB, which writes the
// selected rows to a Parquet file that the Arrow reader (src/data/parquet_input.h) then reads. A subprocess
// instead of DuckDB's C library because PyPI ships no libduckdb.so + duckdb.h (see docs/data.md).
#pragma once
#include <string>
#include <vector>

namespace olmosft::duckdb {

// The binary used: $OLMOSFT_DUCKDB if set, else the one CMake found in deps/venv at build time, else
// `duckdb` on PATH. Throws olmosft::Error saying how to install it when none is executable.
std::string cli_path();
// "v1.5.6" etc. (runs `duckdb -version` once).
std::string cli_version();

// Runs `sql` (one or more statements) in a fresh in-memory DuckDB with `threads` threads and returns what it
// printed, one JSON object per result row (-jsonlines). On failure throws olmosft::Error "<what>: <DuckDB's
// message>".
std::vector<std::string> run_sql(const std::string& sql, const std::string& what, int threads);

// Quotes s as a SQL string literal ('...' with embedded quotes doubled).
std::string sql_string(const std::string& s);
// Quotes s as a SQL identifier ("..." with embedded quotes doubled).
std::string sql_ident(const std::string& s);

}  // namespace olmosft::duckdb
