// Environment lookup as a value, so code that reads the environment (kube_client's in-cluster and
// kubeconfig resolution) can be tested with a fixed map.
#pragma once
#include <functional>
#include <map>
#include <optional>
#include <string>

namespace olmosft::cluster {

using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;

// Reads the process environment (getenv).
EnvLookup process_env();
// A fixed map (tests).
EnvLookup map_env(std::map<std::string, std::string> m);

}  // namespace olmosft::cluster
