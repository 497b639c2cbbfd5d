#include "data/duckdb_reader.h"

#include <cstring>

#include "core/error.h"
#include "data/duckdb_capi.h"

namespace olmosft::duckdb {

std::string library_version() { return duckdb_library_version(); }

std::string sql_string(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') out += '\'';
    out += c;
  }
  return out + "'";
}

std::string sql_ident(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

struct Database::Impl {
  duckdb_database db = nullptr;
  duckdb_connection con = nullptr;
};

Database::Database() : impl_(std::make_unique<Impl>()) {
  if (duckdb_open(nullptr, &impl_->db) != DuckDBSuccess) fail("DuckDB: cannot open an in-memory database");
  if (duckdb_connect(impl_->db, &impl_->con) != DuckDBSuccess) {
    duckdb_close(&impl_->db);
    fail("DuckDB: cannot connect to the in-memory database");
  }
}

Database::~Database() {
  if (impl_->con) duckdb_disconnect(&impl_->con);
  if (impl_->db) duckdb_close(&impl_->db);
}

namespace {
struct Result {
  duckdb_result r{};
  bool live = false;
  ~Result() {
    if (live) duckdb_destroy_result(&r);
  }
};

std::optional<std::string> read_string(duckdb_vector vec, idx_t row) {
  uint64_t* validity = duckdb_vector_get_validity(vec);
  if (validity && !((validity[row / 64] >> (row % 64)) & 1)) return std::nullopt;
  auto* s = static_cast<duckdb_string_t*>(duckdb_vector_get_data(vec)) + row;
  uint32_t n = s->value.inlined.length;
  const char* p = n <= 12 ? s->value.inlined.inlined : s->value.pointer.ptr;
  return std::string(p, n);
}

size_t append_chunk(duckdb_data_chunk chunk, size_t ncols, StringColumns& cols) {
  idx_t n = duckdb_data_chunk_get_size(chunk);
  cols.resize(ncols);
  for (size_t c = 0; c < ncols; ++c) {
    duckdb_vector vec = duckdb_data_chunk_get_vector(chunk, c);
    for (idx_t r = 0; r < n; ++r) cols[c].push_back(read_string(vec, r));
  }
  return n;
}

void check_varchar(duckdb_result* r, const std::string& what, std::vector<std::string>& names) {
  idx_t nc = duckdb_column_count(r);
  names.clear();
  for (idx_t c = 0; c < nc; ++c) {
    names.push_back(duckdb_column_name(r, c));
    OLMO_CHECK(duckdb_column_type(r, c) == DUCKDB_TYPE_VARCHAR, what, ": internal: result column '",
               names.back(), "' is not VARCHAR (type id ", duckdb_column_type(r, c), ")");
  }
}
}  // namespace

void Database::exec(const std::string& sql, const std::string& what) {
  Result res;
  duckdb_state st = duckdb_query(impl_->con, sql.c_str(), &res.r);
  res.live = true;
  if (st != DuckDBSuccess) {
    const char* e = duckdb_result_error(&res.r);
    fail(what, ": ", e ? e : "unknown DuckDB error");
  }
}

StringColumns Database::query(const std::string& sql, const std::string& what,
                              std::vector<std::string>* names) {
  auto s = stream(sql, what);
  if (names) *names = s->column_names();
  StringColumns cols(s->column_names().size());
  while (s->next(cols) > 0) {
  }
  return cols;
}

struct Stream::Impl {
  duckdb_prepared_statement stmt = nullptr;
  Result res;
  ~Impl() {
    if (stmt) duckdb_destroy_prepare(&stmt);
  }
};

Stream::~Stream() = default;

std::unique_ptr<Stream> Database::stream(const std::string& sql, const std::string& what) {
  std::unique_ptr<Stream> s(new Stream());
  s->impl_ = std::make_unique<Stream::Impl>();
  s->what_ = what;
  if (duckdb_prepare(impl_->con, sql.c_str(), &s->impl_->stmt) != DuckDBSuccess) {
    const char* e = duckdb_prepare_error(s->impl_->stmt);
    fail(what, ": ", e ? e : "unknown DuckDB error");
  }
  duckdb_state st = duckdb_execute_prepared_streaming(s->impl_->stmt, &s->impl_->res.r);
  s->impl_->res.live = true;
  if (st != DuckDBSuccess) {
    const char* e = duckdb_result_error(&s->impl_->res.r);
    fail(what, ": ", e ? e : "unknown DuckDB error");
  }
  check_varchar(&s->impl_->res.r, what, s->names_);
  return s;
}

size_t Stream::next(StringColumns& cols) {
  if (done_) return 0;  // fetching past the end of a streaming result is an error in DuckDB
  for (;;) {            // an empty chunk is not the end; a null chunk is (or an error)
    duckdb_data_chunk chunk = duckdb_fetch_chunk(impl_->res.r);
    if (!chunk) {
      done_ = true;
      const char* e = duckdb_result_error(&impl_->res.r);
      if (e && *e) fail(what_, ": ", e);
      return 0;
    }
    size_t n = append_chunk(chunk, names_.size(), cols);
    duckdb_destroy_data_chunk(&chunk);
    if (n > 0) return n;
  }
}

}  // namespace olmosft::duckdb
