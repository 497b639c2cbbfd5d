#include "cluster/env.h"

#include <cstdlib>

namespace olmosft::cluster {

EnvLookup process_env() {
  return [](const std::string& k) -> std::optional<std::string> {
    const char* v = std::getenv(k.c_str());
    if (!v) return std::nullopt;
    return std::string(v);
  };
}

EnvLookup map_env(std::map<std::string, std::string> m) {
  return [m = std::move(m)](const std::string& k) -> std::optional<std::string> {
    auto it = m.find(k);
    if (it == m.end()) return std::nullopt;
    return it->second;
  };
}

}  // namespace olmosft::cluster
