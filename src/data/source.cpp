#include "data/source.h"

#include <glob.h>

#include <algorithm>
#include <set>

#include "core/error.h"
#include "core/threads.h"
#include "io/hash.h"
#include "io/json.h"

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
  if (const size_t deep = io::json_depth_violation(*raw.messages_json); deep != std::string::npos) {
    *why = "messages: " + io::json_depth_message(deep);
    return Skip::kMalformed;
  }
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
