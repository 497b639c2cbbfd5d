#include "data/source.h"

#include <glob.h>

#include <algorithm>
#include <set>

#include "core/error.h"
#include "core/threads.h"
#include "data/duckdb_reader.h"
#include "io/hash.h"

namespace olmosft {

namespace {
bool ends_with(const std::string& s, const std::string& suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}

std::string classify(const std::string& path) {
  std::string p = path;
  for (const char* c : {".gz", ".zst"}) {
    if (ends_with(p, c)) p = p.substr(0, p.size() - std::string(c).size());
  }
  if (ends_with(path, ".parquet")) return "parquet";
  for (const char* e : {".jsonl", ".ndjson", ".json"}) {
    if (ends_with(p, e)) return "jsonl";
  }
  fail("input ", path,
       ": unknown file type (expected .parquet, or .jsonl/.ndjson/.json, optionally .gz/.zst)");
}
}  // namespace

std::vector<InputFile> resolve_inputs(const std::vector<std::string>& globs) {
  OLMO_CHECK(!globs.empty(), "no --input given");
  std::set<std::string> paths;
  for (const auto& g : globs) {
    glob_t gl{};
    int rc = ::glob(g.c_str(), GLOB_ERR, nullptr, &gl);
    if (rc == GLOB_NOMATCH) {
      globfree(&gl);
      fail("--input ", g, ": no file matches");
    }
    if (rc != 0) {
      globfree(&gl);
      fail("--input ", g, ": cannot expand the pattern (read error)");
    }
    for (size_t i = 0; i < gl.gl_pathc; ++i) paths.insert(gl.gl_pathv[i]);
    globfree(&gl);
  }
  std::vector<InputFile> out;
  for (const auto& p : paths) out.push_back({p, classify(p), 0, ""});
  return out;
}

void hash_inputs(std::vector<InputFile>& files) {
  std::vector<std::string> errors(files.size());
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t i = 0; i < static_cast<int64_t>(files.size()); ++i) {
    try {
      files[i].sha256 = io::sha256_file(files[i].path, &files[i].size);
    } catch (const std::exception& e) {
      errors[i] = e.what();
    }
  }
  for (const auto& e : errors) OLMO_CHECK(e.empty(), "input: ", e);
}

const char* skip_name(Skip s) {
  switch (s) {
    case Skip::kNone:
      return "none";
    case Skip::kNullMessages:
      return "null_messages";
    case Skip::kEmptyMessages:
      return "empty_messages";
    case Skip::kMalformed:
      return "malformed_messages";
    case Skip::kNoAssistant:
      return "no_assistant_turn";
    case Skip::kEncodeError:
      return "encode_error";
    case Skip::kNoTrainedTokens:
      return "no_trained_tokens";
    case Skip::kTooLong:
      return "too_long";
    case Skip::kCount:
      break;
  }
  return "?";
}

ConversationReader::ConversationReader(const std::vector<InputFile>& files, const SourceOptions& opts)
    : db_(std::make_unique<duckdb::Database>()) {
  using duckdb::sql_ident;
  using duckdb::sql_string;
  OLMO_CHECK(!files.empty(), "no input files");
  db_->exec("SET threads = " + std::to_string(std::max(1, num_threads())), "DuckDB: SET threads");
  db_->exec("SET preserve_insertion_order = true", "DuckDB: SET preserve_insertion_order");
  std::vector<std::string> parts;
  for (const char* kind : {"parquet", "jsonl"}) {
    std::string list;
    for (const auto& f : files) {
      if (f.kind != kind) continue;
      list += (list.empty() ? "" : ", ") + sql_string(f.path);
      inputs_desc_ += (inputs_desc_.empty() ? "" : ", ") + f.path;
    }
    if (list.empty()) continue;
    if (std::string(kind) == "parquet") {
      parts.push_back("SELECT * FROM read_parquet([" + list + "], filename = true, union_by_name = true)");
    } else {
      parts.push_back("SELECT * FROM read_json([" + list +
                      "], format = 'newline_delimited', filename = true, union_by_name = true)");
    }
  }
  std::string input_sql = parts[0];
  if (parts.size() == 2) input_sql = "(" + parts[0] + ") UNION ALL BY NAME (" + parts[1] + ")";
  db_->exec("CREATE VIEW input AS " + input_sql, "reading inputs (" + inputs_desc_ + ")");
  std::string sel = opts.sql.empty() ? "SELECT * FROM input" : opts.sql;
  db_->exec("CREATE VIEW selected AS " + sel,
            opts.sql.empty() ? "reading inputs (" + inputs_desc_ + ")" : "--sql");

  std::vector<std::string> dn;
  auto desc = db_->query("SELECT column_name, column_type FROM (DESCRIBE selected)",
                         "reading the schema of the inputs (" + inputs_desc_ + ")", &dn);
  std::vector<std::pair<std::string, std::string>> cols;
  for (size_t i = 0; i < desc[0].size(); ++i)
    cols.emplace_back(desc[0][i].value_or(""), desc[1][i].value_or(""));
  auto type_of = [&](const std::string& name) -> std::optional<std::string> {
    for (const auto& [n, t] : cols) {
      if (n == name) return t;
    }
    return std::nullopt;
  };
  std::string col_list;
  for (const auto& [n, t] : cols) col_list += (col_list.empty() ? "" : ", ") + n + " " + t;
  auto mt = type_of("messages");
  OLMO_CHECK(mt, "inputs (", inputs_desc_, "): no 'messages' column; the selection has columns: ", col_list);
  // Accept list<struct<...>> (Parquet, typed JSONL), JSON[] / JSON (heterogeneous JSONL: validated per row).
  bool ok_type = (mt->size() > 2 && mt->substr(mt->size() - 2) == "[]") || *mt == "JSON";
  OLMO_CHECK(ok_type, "inputs (", inputs_desc_, "): column 'messages' has type ", *mt,
             "; expected a list of {role, content} structs (e.g. STRUCT(role VARCHAR, content VARCHAR)[])");

  if (!opts.source_column.empty()) {
    OLMO_CHECK(type_of(opts.source_column), "--source-column ", opts.source_column,
               ": no such column; the selection has columns: ", col_list);
    source_expr_ = "CAST(" + sql_ident(opts.source_column) + " AS VARCHAR)";
  } else if (type_of("source_dataset")) {
    source_expr_ = "CAST(source_dataset AS VARCHAR)";
  } else if (type_of("source")) {
    source_expr_ = "CAST(source AS VARCHAR)";
  } else if (type_of("filename")) {
    source_expr_ = "regexp_replace(CAST(filename AS VARCHAR), '^.*/', '')";
  } else {
    source_expr_ = "'all'";
  }
  std::string id_expr = type_of("id") ? "CAST(id AS VARCHAR)" : "NULL::VARCHAR";
  std::string extra_expr = "NULL::VARCHAR";
  std::string packs;
  for (const auto& c : opts.extra_columns) {
    if (!type_of(c)) continue;
    packs += (packs.empty() ? "" : ", ") + sql_ident(c) + " := " + sql_ident(c);
  }
  if (!packs.empty()) extra_expr = "CAST(to_json(struct_pack(" + packs + ")) AS VARCHAR)";
  select_sql_ = "SELECT CAST(to_json(messages) AS VARCHAR) AS m, COALESCE(" + source_expr_ + ", '') AS s, " +
                id_expr + " AS i, " + extra_expr + " AS x FROM selected";
}

ConversationReader::~ConversationReader() = default;

int64_t ConversationReader::count_rows() {
  auto r = db_->query("SELECT CAST(count(*) AS VARCHAR) FROM selected",
                      "counting input rows (" + inputs_desc_ + ")");
  return std::stoll(r[0].at(0).value_or("0"));
}

bool ConversationReader::next(std::vector<RawConversation>& out, size_t max_rows) {
  if (!stream_) stream_ = db_->stream(select_sql_, "reading inputs (" + inputs_desc_ + ")");
  size_t added = 0;
  while (added < max_rows) {
    duckdb::StringColumns cols;
    size_t n = stream_->next(cols);
    if (n == 0) return added > 0;
    for (size_t r = 0; r < n; ++r) {
      RawConversation rc;
      rc.messages_json = std::move(cols[0][r]);
      rc.source = cols[1][r].value_or("");
      rc.id = cols[2][r] ? *cols[2][r] : "#" + std::to_string(rows_read_);
      rc.extra_json = cols[3][r].value_or("");
      out.push_back(std::move(rc));
      ++rows_read_;
    }
    added += n;
  }
  return true;
}

namespace {
nlohmann::json drop_nulls(const nlohmann::json& obj) {
  nlohmann::json out = nlohmann::json::object();
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    if (!it.value().is_null()) out[it.key()] = it.value();
  }
  return out;
}
}  // namespace

Skip parse_conversation(const RawConversation& raw, Conversation& conv, std::string* why) {
  conv = Conversation{};
  if (!raw.messages_json) {
    *why = "messages is null";
    return Skip::kNullMessages;
  }
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(*raw.messages_json);
  } catch (const std::exception& e) {
    *why = std::string("messages is not valid JSON/UTF-8: ") + e.what();
    return Skip::kMalformed;
  }
  if (j.is_null()) {
    *why = "messages is null";
    return Skip::kNullMessages;
  }
  if (!j.is_array()) {
    *why = std::string("messages is a JSON ") + j.type_name() + ", expected a list of {role, content}";
    return Skip::kMalformed;
  }
  if (j.empty()) {
    *why = "messages is an empty list";
    return Skip::kEmptyMessages;
  }
  bool any_assistant = false;
  for (size_t k = 0; k < j.size(); ++k) {
    const auto& m = j[k];
    if (!m.is_object()) {
      *why = "message " + std::to_string(k) + " is a JSON " + m.type_name() + ", expected an object";
      return Skip::kMalformed;
    }
    auto role = m.find("role");
    if (role == m.end() || !role->is_string() || role->get_ref<const std::string&>().empty()) {
      *why = "message " + std::to_string(k) + " has no string 'role'";
      return Skip::kMalformed;
    }
    auto content = m.find("content");
    if (content != m.end() && !content->is_string() && !content->is_null()) {
      *why = "message " + std::to_string(k) + " has a 'content' of type " + content->type_name() +
             ", expected a string or null";
      return Skip::kMalformed;
    }
    Message msg;
    msg.role = role->get<std::string>();
    if (content != m.end() && content->is_string()) msg.content = content->get<std::string>();
    msg.extra = drop_nulls(m);
    msg.extra.erase("role");
    msg.extra.erase("content");
    any_assistant |= msg.role == "assistant";
    conv.messages.push_back(std::move(msg));
  }
  if (!raw.extra_json.empty()) {
    try {
      auto x = nlohmann::json::parse(raw.extra_json);
      if (x.is_object()) conv.extra = drop_nulls(x);
    } catch (const std::exception& e) {
      *why = std::string("conversation-level columns are not valid JSON/UTF-8: ") + e.what();
      return Skip::kMalformed;
    }
  }
  if (!any_assistant) {
    *why = "no assistant turn";
    return Skip::kNoAssistant;
  }
  return Skip::kNone;
}

std::string canonical_json(const Conversation& conv) {
  nlohmann::json msgs = nlohmann::json::array();
  for (const auto& m : conv.messages) {
    nlohmann::json o = m.extra;
    o["role"] = m.role;
    o["content"] = m.content;
    msgs.push_back(std::move(o));
  }
  nlohmann::json j = {{"messages", std::move(msgs)}, {"extra", conv.extra}};
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::strict);
}

}  // namespace olmosft
