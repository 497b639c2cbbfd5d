// Internal to model/olmo_core*.cpp: typed reads of an OLMo-core config.json object whose errors name the file
// and the dotted key.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"

namespace olmosft::model::olmo_core {

using nlohmann::json;

// Reads a key of an OLMo-core config object with a type check; `path` is the dotted key for errors.
struct Cfg {
  const std::string& ctx;
  const json& get(const json& j, const std::string& path, const char* key) const {
    OLMO_CHECK(j.is_object() && j.contains(key), ctx, ": missing ", path, ".", key);
    return j.at(key);
  }
  const json* opt(const json& j, const char* key) const {
    return j.is_object() && j.contains(key) && !j.at(key).is_null() ? &j.at(key) : nullptr;
  }
  int64_t integer(const json& j, const std::string& path, const char* key) const {
    const json& v = get(j, path, key);
    OLMO_CHECK(v.is_number_integer() && v.get<int64_t>() > 0, ctx, ": ", path, ".", key,
               " must be a positive integer, got ", v.dump());
    return v.get<int64_t>();
  }
  double number(const json& j, const std::string& path, const char* key) const {
    const json& v = get(j, path, key);
    OLMO_CHECK(v.is_number(), ctx, ": ", path, ".", key, " must be a number, got ", v.dump());
    return v.get<double>();
  }
  bool boolean(const json& j, const std::string& path, const char* key, bool dflt) const {
    const json* v = opt(j, key);
    OLMO_CHECK(!v || v->is_boolean(), ctx, ": ", path, ".", key, " must be true or false, got ", v->dump());
    return v ? v->get<bool>() : dflt;
  }
  void must_be(const json& j, const std::string& path, const char* key, const json& want,
               const char* why) const {
    const json* v = opt(j, key);
    json got = v ? *v : json();
    OLMO_CHECK(got == want || (want.is_boolean() && !want.get<bool>() && got.is_null()), ctx, ": ", path, ".",
               key, " is ", got.dump(), ", only ", want.dump(), " is supported (", why, ")");
  }
  void must_be_null(const json& j, const std::string& path, const char* key, const char* why) const {
    const json* v = opt(j, key);
    OLMO_CHECK(!v || (v->is_boolean() && !v->get<bool>()), ctx, ": ", path, ".", key, " is ",
               v ? v->dump() : "", ", which this import does not support (", why, ")");
  }
};

// The HF olmo3moe config.json of an OLMo-core OLMoDDPModelConfig (name "moe_fused_v2": the Olmo 3.5 hybrid),
// following OLMo-core's own HF export (nn/hf/config.py _get_olmo3moe_kda_emo_config).
// model/olmo_core_hybrid.cpp.
json hybrid_hf_config(const Cfg& c, const json& m);

}  // namespace olmosft::model::olmo_core
