// The recipe's `cluster:` keys, the k8s launcher's section: one table, the only list of them, with the rows
// of the trainer's table (train/recipe.h RecipeKeyDoc: name, type, default, doc) and each key's reader and
// validation. The trainer passes the section through as text (TrainConfig::cluster); read_cluster reads it
// through this table: a key that is not a row, or a map where a row wants one value, is refused naming it and
// the keys allowed there; each value is typed and checked by its row, and the errors name the row's key.
// `olmosft recipe keys` lists these rows after the trainer's; docs/k8s.md has them as a table.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "cluster/recipe.h"
#include "train/recipe.h"

namespace olmosft::cluster {

// What the rows read into: the spec's fields, and the keys that combine into the spec after every row is read
// (the slice is cluster.slice, or cluster.accelerator x cluster.nodes; cluster.host_network and
// cluster.exclusive_topology default from it).
struct ClusterValues {
  ClusterSpec spec;
  std::optional<SliceSpec> slice;                 // cluster.slice
  const GpuType* accelerator = nullptr;           // cluster.accelerator
  std::optional<int> nodes;                       // cluster.nodes
  std::optional<bool> host_network;               // cluster.host_network
  std::optional<std::string> exclusive_topology;  // cluster.exclusive_topology ("" when given as null: none)
};

// What reading a key does when the recipe leaves it out (or gives null).
enum class Absent {
  Default,     // reads default_value (through the same checks)
  Required,    // refused: "missing (required)"
  Optional,    // not read; default_value says in parentheses what happens instead
  NullIsNone,  // as Optional when left out; an explicit null is read as "" (none)
};

// One `cluster.*` key: its RecipeKeyDoc (on_resume Operational: the launcher's keys never change a run's
// numbers), what its absence means, and its reader (throws olmosft::Error starting with `where`, which names
// the recipe and the key).
struct ClusterKey : RecipeKeyDoc {
  Absent absent = Absent::Default;
  std::function<void(ClusterValues&, const std::string& value, const std::string& where)> read;
};

const std::vector<ClusterKey>& cluster_keys();
const ClusterKey* find_cluster_key(const std::string& name);  // full name ("cluster.queue"); nullptr if none

// Reads the `cluster:` section (`raw`: TrainConfig::cluster, keys below `cluster.` as text) through the
// table. Throws olmosft::Error naming `origin` and the key.
ClusterSpec read_cluster(const std::string& origin, const std::map<std::string, std::string>& raw);

// A decimal integer with an optional sign and nothing else ("12", "-3"); false for anything else or overflow.
bool parse_integer(const std::string& s, int64_t& v);

}  // namespace olmosft::cluster
