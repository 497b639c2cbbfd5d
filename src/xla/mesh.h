// The device mesh of an SPMD program (recipe `mesh.*` with device: xla; docs/xla.md "The device mesh") and
// the one table that maps the logical axes of tensors onto its axes (MaxText's logical_axis_rules): the
// model's units emit math on logical shapes, and the decoder lays the program out over the mesh from here.
//
// Axes, outermost first: data (replicas: rows split, parameters replicated), fsdp (rows split, parameters,
// gradients and moments split: ZeRO-3 / FSDP inside the program), expert and context (each row's tokens
// split: context parallelism; expert is the MoE's expert axis, which outside the MoE carries the sequence as
// context does: the runbook's `fsdp 16 x expert 8`, "ep-as-cp"). Device d of the program has coordinates
//   d = ((data_i * fsdp + fsdp_i) * expert + expert_i) * context + context_i,
// so the devices sharing one row's pieces are consecutive, in the row's token order.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "xla/hlo_builder.h"

namespace olmosft::xla {

enum class MeshAxis { kData, kFsdp, kExpert, kContext };
inline constexpr MeshAxis kMeshAxes[] = {MeshAxis::kData, MeshAxis::kFsdp, MeshAxis::kExpert,
                                         MeshAxis::kContext};
const char* mesh_axis_name(MeshAxis a);  // "data", "fsdp", "expert", "context"
// The axis of that name, or nullopt; and every name, comma-separated, for messages.
std::optional<MeshAxis> mesh_axis_named(const std::string& name);
std::string mesh_axis_names();

struct Mesh {
  int64_t data = 1, fsdp = 1, expert = 1, context = 1;
  int64_t size(MeshAxis a) const { return const_cast<Mesh*>(this)->at(a); }
  int64_t& at(MeshAxis a);
  int64_t devices() const { return data * fsdp * expert * context; }
  int64_t batch_shards() const { return data * fsdp; }              // R: a micro-batch's rows split R ways
  int64_t seq_shards() const { return expert * context; }           // C: each row's tokens split C ways
  int64_t param_shards() const { return fsdp * expert * context; }  // parameters split over these
  // "data=1 fsdp=2 expert=1 context=4"; with SEP ',' one token of a greppable line.
  std::string text(char sep = ' ') const;
  auto operator<=>(const Mesh&) const = default;
};

// Logical tensor axes (what a dimension means), mapped onto mesh axes by axis_rules().
enum class Logical {
  kTokens,    // a flat token dimension [N] in the program's blocked order (below): every mesh axis
  kRowTiles,  // the rows of [B * C, T / C] row tiles (the mixers' layout): every mesh axis
  kParam,     // the dimension of a parameter (its gradient, its moments) that its shards split
  kRows,      // whole rows of a [B, T, ...] view (the delta rule's batch): data, fsdp
  kSeq,       // a whole row's tokens in that view: expert, context (a row's pieces)
  kHeads,     // the delta rule's heads while its loop runs over whole rows: expert, context
  kNone,      // not split (the rest of a parameter, heads, features, the vocabulary)
};
struct AxisRule {
  Logical logical;
  std::vector<MeshAxis> mesh;
};
// The rules table, one row per logical axis: tokens and row tiles over {data, fsdp, expert, context},
// parameters over {fsdp, expert, context} (replicated over data), the rest over nothing.
const std::vector<AxisRule>& axis_rules();

// The HloSharding text of a tensor of SHAPE whose dimensions mean AXES (one each), on MESH: each dimension
// split over its rule's mesh axes, the mesh axes no dimension uses replicating it. Refuses a dimension that
// its axes do not divide, naming WHAT.
std::string mesh_sharding(const Mesh& mesh, const std::vector<int64_t>& shape,
                          const std::vector<Logical>& axes, const std::string& what);

// The same for a tensor whose dimension DIM means LOGICAL and every other dimension kNone.
std::string dim_sharding(const Mesh& mesh, const std::vector<int64_t>& shape, size_t dim, Logical logical,
                         const std::string& what);

// A parameter's layout: its first dimension that the parameter shards divide (Logical::kParam there), or -1
// (replicated) when none does or the mesh has one parameter shard. A vocabulary that does not divide is
// never padded to divide: the embedding splits by its columns instead.
int param_split_dim(const Mesh& mesh, const std::vector<int64_t>& shape);
std::string param_sharding(const Mesh& mesh, const std::vector<int64_t>& shape);
// Which part of a parameter split along param_split_dim device D holds (parts = param_shards; the data
// replicas hold the same parts).
int64_t param_part(const Mesh& mesh, int64_t d);

// The program's blocked token order: a [B, T] micro-batch's tokens in the order of the device that holds
// them, each device's tile [B / R, T / C] (its rows, its piece of each) row-major. With C = 1 this is the
// batch's own row-major order. Device d's tile: rows from tile_row(d), tokens from tile_col(d).
int64_t tile_row0(const Mesh& mesh, int64_t d, int64_t B);
int64_t tile_col0(const Mesh& mesh, int64_t d, int64_t T);
// The devices sharing each row's pieces (consecutive, in token order): the collectives' groups.
HloBuilder::DeviceGroups sequence_groups(const Mesh& mesh);

}  // namespace olmosft::xla
