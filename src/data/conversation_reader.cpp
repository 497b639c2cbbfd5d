#include "data/conversation_reader.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/duckdb_cli.h"
#include "data/jsonl_input.h"
#include "data/parquet_input.h"
#include "io/json.h"

namespace olmosft {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {
std::string base_name(const std::string& path) { return fs::path(path).filename().string(); }

std::string as_text(const json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

const json* field(const json& row, const std::string& name) {
  auto it = row.find(name);
  return it == row.end() || it->is_null() ? nullptr : &*it;
}

// Columns each row needs, for reading only those from Parquet.
std::vector<std::string> wanted_columns(const SourceOptions& o) {
  std::vector<std::string> w = {"messages", "id", "source_dataset", "source"};
  if (!o.source_column.empty()) w.push_back(o.source_column);
  for (const auto& c : o.extra_columns) w.push_back(c);
  return w;
}

std::string column_list(const std::vector<std::pair<std::string, std::string>>& cols) {
  std::string s;
  for (const auto& [n, t] : cols) s += (s.empty() ? "" : ", ") + n + " " + t;
  return s;
}
}  // namespace

struct ConversationReader::Impl {
  std::vector<InputFile> files;
  SourceOptions opts;
  std::string source_expr;
  // --sql: the selection DuckDB wrote (m, s, i, x columns), in a private directory.
  std::string sql_dir, sql_result;
  // Scan state.
  size_t file = 0;
  std::unique_ptr<ParquetInput> pq;
  std::unique_ptr<JsonlInput> jl;
  bool file_had_messages = false;
  int64_t file_rows = 0;  // JSON lines read from the current file
  bool source_column_seen = false;
  int64_t rows_read = 0;
  int64_t parquet_rows = 0;  // from the footers read by check_parquet_schemas (no --sql)

  ~Impl() { remove_sql_result(); }
  void remove_sql_result() {
    if (sql_dir.empty()) return;
    std::error_code ec;
    fs::remove_all(sql_dir, ec);
    sql_dir.clear();
  }

  void check_parquet_schemas();
  void run_sql();
  RawConversation from_row(const json& row, const std::string& file_base, int64_t index, bool* seen) const;
  bool open_next_file();
  bool next_parquet(std::vector<RawConversation>& out, size_t max_rows);
  bool next_jsonl(std::vector<RawConversation>& out, size_t max_rows);
  void end_of_file();
};

void ConversationReader::Impl::check_parquet_schemas() {
  std::vector<std::pair<std::string, std::string>> all;
  bool any_jsonl = false, source_found = opts.source_column.empty();
  for (const auto& f : files) {
    if (f.kind != "parquet") {
      any_jsonl = true;
      continue;
    }
    ParquetInput p(f.path);
    OLMO_CHECK(p.has("messages"), "input ", f.path,
               ": no 'messages' column; the file has columns: ", column_list(p.columns()));
    if (!p.is_list("messages")) {
      std::string type;
      for (const auto& [n, t] : p.columns()) {
        if (n == "messages") type = t;
      }
      fail("input ", f.path, ": column 'messages' has type ", type,
           "; expected a list of {role, content} structs (e.g. list<struct<role: string, content: string>>)");
    }
    source_found |= p.has(opts.source_column);
    parquet_rows += p.num_rows();
    for (const auto& c : p.columns()) all.push_back(c);
  }
  OLMO_CHECK(source_found || any_jsonl, "--source-column ", opts.source_column,
             ": no such column; the inputs have columns: ", column_list(all));
}

namespace {

// After DuckDB failed on a --sql selection: the first JSONL line that is not valid JSON, reported as the
// reader without --sql reports it (file and 1-based line, no internal SQL), when there is one; DuckDB's own
// message otherwise (e.g. an error in the user's SELECT). Only runs on the error path.
// Parses one JSONL line into row; returns "" or why the line is not JSON (nested too deep, or the parser's
// message), the text both the reader and the --sql diagnosis print after "input F, line N: ".
std::string parse_jsonl_line(const std::string& line, json& row) {
  const size_t deep = io::json_depth_violation(line);
  if (deep != std::string::npos) return io::json_depth_message(deep);
  try {
    row = json::parse(line);
  } catch (const std::exception& e) {
    return std::string("not valid JSON/UTF-8: ") + e.what();
  }
  return "";
}

void diagnose_jsonl_inputs(const std::vector<InputFile>& files) {
  for (const auto& f : files) {
    if (f.kind == "parquet") continue;
    JsonlInput in(f.path);
    std::vector<std::string> lines;
    std::vector<int64_t> numbers;
    while (in.next(4096, lines, numbers)) {
      for (size_t k = 0; k < lines.size(); ++k) {
        json row;
        const std::string why = parse_jsonl_line(lines[k], row);
        OLMO_CHECK(why.empty(), "input ", f.path, ", line ", numbers[k], ": ", why);
      }
    }
  }
}

}  // namespace

void ConversationReader::Impl::run_sql() {
  auto run_duckdb = [&](const std::string& q, const std::string& what, int threads) {
    try {
      return duckdb::run_sql(q, what, threads);
    } catch (const Error&) {
      diagnose_jsonl_inputs(files);
      throw;
    }
  };
  using duckdb::sql_ident;
  using duckdb::sql_string;
  std::vector<std::string> parts;
  std::string desc;
  for (const char* kind : {"parquet", "jsonl"}) {
    std::string list;
    for (const auto& f : files) {
      if (f.kind != kind) continue;
      list += (list.empty() ? "" : ", ") + sql_string(f.path);
      desc += (desc.empty() ? "" : ", ") + f.path;
    }
    if (list.empty()) continue;
    parts.push_back(std::string(kind) == "parquet"
                        ? "SELECT * FROM read_parquet([" + list + "], filename = true, union_by_name = true)"
                        : "SELECT * FROM read_json([" + list +
                              "], format = 'newline_delimited', filename = true, union_by_name = true)");
  }
  std::string input_sql =
      parts.size() == 2 ? "(" + parts[0] + ") UNION ALL BY NAME (" + parts[1] + ")" : parts[0];
  const std::string views =
      "CREATE VIEW input AS " + input_sql + "; CREATE VIEW selected AS " + opts.sql + "; ";
  std::vector<std::pair<std::string, std::string>> cols;
  for (const auto& line : run_duckdb(views + "SELECT column_name, column_type FROM (DESCRIBE selected);",
                                     "--sql (over the inputs " + desc + ")", opts.threads)) {
    json j = json::parse(line);
    cols.emplace_back(j.at("column_name").get<std::string>(), j.at("column_type").get<std::string>());
  }
  auto type_of = [&](const std::string& name) -> const std::string* {
    for (const auto& c : cols) {
      if (c.first == name) return &c.second;
    }
    return nullptr;
  };
  const std::string* mt = type_of("messages");
  OLMO_CHECK(mt, "--sql: the selection has no 'messages' column; it has columns: ", column_list(cols));
  bool ok_type = (mt->size() > 2 && mt->substr(mt->size() - 2) == "[]") || *mt == "JSON";
  OLMO_CHECK(ok_type, "--sql: column 'messages' has type ", *mt,
             "; expected a list of {role, content} structs (e.g. STRUCT(role VARCHAR, content VARCHAR)[])");
  std::string s;
  if (!opts.source_column.empty()) {
    OLMO_CHECK(type_of(opts.source_column), "--source-column ", opts.source_column,
               ": no such column; the selection has columns: ", column_list(cols));
    s = "CAST(" + sql_ident(opts.source_column) + " AS VARCHAR), ";
  } else {
    for (const char* c : {"source_dataset", "source"}) {
      if (type_of(c)) s += "CAST(" + sql_ident(c) + " AS VARCHAR), ";
    }
    if (type_of("filename")) s += "regexp_replace(CAST(filename AS VARCHAR), '^.*/', ''), ";
  }
  std::string packs;
  for (const auto& c : opts.extra_columns) {
    if (type_of(c)) packs += (packs.empty() ? "" : ", ") + sql_ident(c) + " := " + sql_ident(c);
  }
  const std::string x =
      packs.empty() ? "NULL::VARCHAR" : "CAST(to_json(struct_pack(" + packs + ")) AS VARCHAR)";
  const std::string i = type_of("id") ? "CAST(id AS VARCHAR)" : "NULL::VARCHAR";
  std::string dir = (fs::path(opts.work_dir.empty() ? fs::temp_directory_path().string() : opts.work_dir) /
                     ".sql-selection-XXXXXX")
                        .string();
  OLMO_CHECK(::mkdtemp(dir.data()) != nullptr, "--sql: cannot create a temporary directory ", dir, ": ",
             std::strerror(errno));
  sql_dir = dir;
  sql_result = dir + "/selected.parquet";
  run_duckdb(views + "COPY (SELECT CAST(to_json(messages) AS VARCHAR) AS m, COALESCE(" + s + "'') AS s, " +
                 i + " AS i, " + x + " AS x FROM selected) TO " + sql_string(sql_result) +
                 " (FORMAT parquet, COMPRESSION zstd);",
             "--sql (over the inputs " + desc + ")", opts.threads);
}

RawConversation ConversationReader::Impl::from_row(const json& row, const std::string& file_base,
                                                   int64_t index, bool* seen) const {
  RawConversation rc;
  if (const json* m = field(row, "messages")) rc.messages_json = m->dump();
  if (const json* id = field(row, "id")) {
    rc.id = as_text(*id);
  } else {
    rc.id = "#" + std::to_string(index);
  }
  if (!opts.source_column.empty()) {
    *seen = row.contains(opts.source_column);
    const json* v = field(row, opts.source_column);
    rc.source = v ? as_text(*v) : "";
  } else if (const json* v = field(row, "source_dataset")) {
    rc.source = as_text(*v);
  } else if (const json* v2 = field(row, "source")) {
    rc.source = as_text(*v2);
  } else {
    rc.source = file_base;
  }
  json x = json::object();
  for (const auto& c : opts.extra_columns) {
    if (const json* v = field(row, c)) x[c] = *v;
  }
  if (!x.empty()) rc.extra_json = x.dump();
  return rc;
}

bool ConversationReader::Impl::open_next_file() {
  pq.reset();
  jl.reset();
  if (!sql_result.empty()) {
    if (file > 0) return false;
    pq = std::make_unique<ParquetInput>(sql_result);
  } else {
    if (file >= files.size()) return false;
    if (files[file].kind == "parquet") {
      pq = std::make_unique<ParquetInput>(files[file].path);
    } else {
      jl = std::make_unique<JsonlInput>(files[file].path);
    }
  }
  file_had_messages = false;
  file_rows = 0;
  return true;
}

void ConversationReader::Impl::end_of_file() {
  if (jl && file_rows == 0) fail("input ", files[file].path, ": the file has no JSON lines (empty)");
  if (jl && !file_had_messages) fail("input ", files[file].path, ": no row has a 'messages' key");
  pq.reset();
  jl.reset();
  ++file;
}

bool ConversationReader::Impl::next_parquet(std::vector<RawConversation>& out, size_t max_rows) {
  const bool sql = !sql_result.empty();
  std::vector<json> rows;
  const std::vector<std::string> names =
      sql ? std::vector<std::string>{"m", "s", "i", "x"} : wanted_columns(opts);
  if (!pq->next(names, static_cast<int64_t>(max_rows), rows)) return false;
  const std::string base = sql ? "" : base_name(files[file].path);
  const int64_t n = static_cast<int64_t>(rows.size()), first = static_cast<int64_t>(out.size());
  out.resize(out.size() + rows.size());
  std::vector<char> seen(rows.size(), 0);
  std::vector<std::string> errors(rows.size());
#pragma omp parallel for schedule(dynamic, 64)
  for (int64_t r = 0; r < n; ++r) {
    RawConversation& rc = out[static_cast<size_t>(first + r)];
    const json& row = rows[static_cast<size_t>(r)];
    if (!sql) {
      bool s = false;
      try {
        rc = from_row(row, base, rows_read + r, &s);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
      seen[static_cast<size_t>(r)] = s;
      continue;
    }
    if (const json* m = field(row, "m")) rc.messages_json = m->get<std::string>();
    const json* id = field(row, "i");
    rc.id = id ? id->get<std::string>() : "#" + std::to_string(rows_read + r);
    if (const json* s = field(row, "s")) rc.source = s->get<std::string>();
    if (const json* x = field(row, "x")) rc.extra_json = x->get<std::string>();
  }
  for (size_t k = 0; k < rows.size(); ++k) {
    OLMO_CHECK(errors[k].empty(), "input ", files[file].path, ", row ", rows_read + static_cast<int64_t>(k),
               ": ", errors[k]);
    source_column_seen |= seen[k] != 0;
  }
  rows_read += n;
  return true;
}

bool ConversationReader::Impl::next_jsonl(std::vector<RawConversation>& out, size_t max_rows) {
  std::vector<std::string> lines;
  std::vector<int64_t> numbers;
  if (!jl->next(max_rows, lines, numbers)) return false;
  const std::string& path = files[file].path;
  const std::string base = base_name(path);
  const int64_t n = static_cast<int64_t>(lines.size()), first = static_cast<int64_t>(out.size());
  out.resize(out.size() + lines.size());
  std::vector<std::string> errors(lines.size());
  std::vector<char> seen(lines.size(), 0), has_messages(lines.size(), 0);
#pragma omp parallel for schedule(dynamic, 64)
  for (int64_t r = 0; r < n; ++r) {
    const size_t k = static_cast<size_t>(r);
    json row;
    errors[k] = parse_jsonl_line(lines[k], row);
    if (!errors[k].empty()) continue;
    if (!row.is_object()) {
      errors[k] = std::string("expected a JSON object, got a JSON ") + row.type_name();
      continue;
    }
    has_messages[k] = row.contains("messages");
    bool s = false;
    try {
      out[static_cast<size_t>(first + r)] = from_row(row, base, rows_read + r, &s);
    } catch (const std::exception& e) {
      errors[k] = e.what();
    }
    seen[k] = s;
  }
  for (size_t k = 0; k < lines.size(); ++k) {
    OLMO_CHECK(errors[k].empty(), "input ", path, ", line ", numbers[k], ": ", errors[k]);
    source_column_seen |= seen[k] != 0;
    file_had_messages |= has_messages[k] != 0;
  }
  rows_read += n;
  file_rows += n;
  return true;
}

ConversationReader::ConversationReader(const std::vector<InputFile>& files, const SourceOptions& opts)
    : impl_(std::make_unique<Impl>()) {
  OLMO_CHECK(!files.empty(), "no input files");
  impl_->files = files;
  std::stable_sort(impl_->files.begin(), impl_->files.end(), [](const InputFile& a, const InputFile& b) {
    return a.kind == "parquet" && b.kind != "parquet";
  });
  impl_->opts = opts;
  if (!opts.sql.empty()) {
    impl_->run_sql();
  } else {
    impl_->check_parquet_schemas();
  }
  impl_->source_expr = !opts.source_column.empty()
                           ? "the column " + opts.source_column
                           : "per row: source_dataset, else source, else the file's name";
}

ConversationReader::~ConversationReader() = default;

int64_t ConversationReader::count_rows() {
  if (!impl_->sql_result.empty()) return ParquetInput(impl_->sql_result).num_rows();
  int64_t n = impl_->parquet_rows;
  for (const auto& f : impl_->files) {
    if (f.kind != "parquet") n += JsonlInput::count_lines(f.path);
  }
  return n;
}

bool ConversationReader::next(std::vector<RawConversation>& out, size_t max_rows) {
  Impl& m = *impl_;
  const size_t start = out.size();
  while (out.size() - start < max_rows) {
    if (!m.pq && !m.jl && !m.open_next_file()) break;
    const size_t want = max_rows - (out.size() - start);
    bool got = m.pq ? m.next_parquet(out, want) : m.next_jsonl(out, want);
    if (!got) m.end_of_file();
  }
  if (out.size() > start) return true;
  m.remove_sql_result();
  OLMO_CHECK(
      m.opts.source_column.empty() || m.source_column_seen || m.rows_read == 0 || !m.sql_result.empty(),
      "--source-column ", m.opts.source_column, ": no input row has this column");
  return false;
}

const std::string& ConversationReader::source_expression() const { return impl_->source_expr; }

std::string ConversationReader::readers() const {
  std::string arrow = "Arrow " + arrow_version();
  return impl_->sql_result.empty() ? arrow : "DuckDB " + duckdb::cli_version() + " + " + arrow;
}

}  // namespace olmosft
