#include "xla/mesh.h"

#include <algorithm>

#include "core/error.h"

namespace olmosft::xla {

const char* mesh_axis_name(MeshAxis a) {
  switch (a) {
    case MeshAxis::kData:
      return "data";
    case MeshAxis::kFsdp:
      return "fsdp";
    case MeshAxis::kExpert:
      return "expert";
    case MeshAxis::kContext:
      return "context";
  }
  fail("mesh: unknown axis");
}

std::optional<MeshAxis> mesh_axis_named(const std::string& name) {
  for (MeshAxis a : kMeshAxes)
    if (name == mesh_axis_name(a)) return a;
  return std::nullopt;
}

std::string mesh_axis_names() {
  std::string s;
  for (MeshAxis a : kMeshAxes) s += (s.empty() ? "" : ", ") + std::string(mesh_axis_name(a));
  return s;
}

int64_t& Mesh::at(MeshAxis a) {
  switch (a) {
    case MeshAxis::kData:
      return data;
    case MeshAxis::kFsdp:
      return fsdp;
    case MeshAxis::kExpert:
      return expert;
    case MeshAxis::kContext:
      return context;
  }
  fail("mesh: unknown axis");
}

std::string Mesh::text(char sep) const {
  std::string s;
  for (MeshAxis a : kMeshAxes)
    s += (s.empty() ? "" : std::string(1, sep)) + mesh_axis_name(a) + "=" + std::to_string(size(a));
  return s;
}

const std::vector<AxisRule>& axis_rules() {
  static const std::vector<AxisRule> rules{
      {Logical::kTokens, {MeshAxis::kData, MeshAxis::kFsdp, MeshAxis::kExpert, MeshAxis::kContext}},
      {Logical::kRowTiles, {MeshAxis::kData, MeshAxis::kFsdp, MeshAxis::kExpert, MeshAxis::kContext}},
      {Logical::kParam, {MeshAxis::kFsdp, MeshAxis::kExpert, MeshAxis::kContext}},
      {Logical::kRows, {MeshAxis::kData, MeshAxis::kFsdp}},
      {Logical::kSeq, {MeshAxis::kExpert, MeshAxis::kContext}},
      {Logical::kHeads, {MeshAxis::kExpert, MeshAxis::kContext}},
      {Logical::kNone, {}},
  };
  return rules;
}

namespace {

const std::vector<MeshAxis>& rule(Logical l) {
  for (const AxisRule& r : axis_rules())
    if (r.logical == l) return r.mesh;
  fail("mesh: no rule for a logical axis");
}

// Device D's coordinate along each mesh axis (kMeshAxes order).
std::vector<int64_t> coords(const Mesh& m, int64_t d) {
  std::vector<int64_t> c(4);
  for (int i = 3; i >= 0; --i) {
    const int64_t n = m.size(kMeshAxes[i]);
    c[size_t(i)] = d % n;
    d /= n;
  }
  return c;
}

}  // namespace

std::string mesh_sharding(const Mesh& mesh, const std::vector<int64_t>& shape,
                          const std::vector<Logical>& axes, const std::string& what) {
  OLMO_CHECK(shape.size() == axes.size(), "mesh: ", what, ": ", axes.size(), " logical axes for a rank-",
             shape.size(), " tensor");
  std::vector<bool> used(4, false);
  std::vector<std::vector<MeshAxis>> per_dim(shape.size());
  std::vector<int64_t> tiles(shape.size(), 1);
  for (size_t k = 0; k < shape.size(); ++k)
    for (MeshAxis a : rule(axes[k])) {
      const size_t ai = size_t(a);
      OLMO_CHECK(!used[ai], "mesh: ", what, ": mesh axis ", mesh_axis_name(a), " splits two dimensions");
      used[ai] = true;
      per_dim[k].push_back(a);
      tiles[k] *= mesh.size(a);
    }
  for (size_t k = 0; k < shape.size(); ++k)
    OLMO_CHECK(shape[k] % tiles[k] == 0, "mesh: ", what, ": dimension ", k, " (", shape[k],
               ") does not split evenly over ", tiles[k], " devices (mesh ", mesh.text(), ")");
  int64_t tiled = 1;
  for (int64_t t : tiles) tiled *= t;
  if (tiled == 1) return sharding_replicated();
  const int64_t D = mesh.devices(), rep = D / tiled;
  // tile-assignment array [tiles..., rep]: the device at each tile coordinate (then replica)
  std::vector<int64_t> array(static_cast<size_t>(D));
  for (int64_t d = 0; d < D; ++d) {
    const std::vector<int64_t> c = coords(mesh, d);
    int64_t flat = 0;
    for (size_t k = 0; k < shape.size(); ++k) {
      int64_t t = 0;
      for (MeshAxis a : per_dim[k]) t = t * mesh.size(a) + c[size_t(a)];
      flat = flat * tiles[k] + t;
    }
    int64_t r = 0;
    for (MeshAxis a : kMeshAxes)
      if (!used[size_t(a)]) r = r * mesh.size(a) + c[size_t(a)];
    array[size_t(flat * rep + r)] = d;
  }
  std::string dims, ids;
  for (int64_t t : tiles) dims += (dims.empty() ? "" : ",") + std::to_string(t);
  if (rep > 1) dims += "," + std::to_string(rep);
  for (size_t i = 0; i < array.size(); ++i) ids += (i ? "," : "") + std::to_string(array[i]);
  return "{devices=[" + dims + "]" + ids + (rep > 1 ? " last_tile_dim_replicate}" : "}");
}

std::string dim_sharding(const Mesh& mesh, const std::vector<int64_t>& shape, size_t dim, Logical logical,
                         const std::string& what) {
  std::vector<Logical> axes(shape.size(), Logical::kNone);
  axes.at(dim) = logical;
  return mesh_sharding(mesh, shape, axes, what);
}

int param_split_dim(const Mesh& mesh, const std::vector<int64_t>& shape) {
  const int64_t n = mesh.param_shards();
  if (n <= 1) return -1;
  for (size_t k = 0; k < shape.size(); ++k)
    if (shape[k] % n == 0) return static_cast<int>(k);
  return -1;
}

std::string param_sharding(const Mesh& mesh, const std::vector<int64_t>& shape) {
  std::vector<Logical> axes(shape.size(), Logical::kNone);
  if (const int k = param_split_dim(mesh, shape); k >= 0) axes[size_t(k)] = Logical::kParam;
  return mesh_sharding(mesh, shape, axes, "parameter");
}

int64_t param_part(const Mesh& mesh, int64_t d) { return d % mesh.param_shards(); }

int64_t tile_row0(const Mesh& mesh, int64_t d, int64_t B) {
  return d / mesh.seq_shards() * (B / mesh.batch_shards());
}
int64_t tile_col0(const Mesh& mesh, int64_t d, int64_t T) {
  return d % mesh.seq_shards() * (T / mesh.seq_shards());
}

HloBuilder::DeviceGroups sequence_groups(const Mesh& mesh) {
  const int64_t C = mesh.seq_shards();
  HloBuilder::DeviceGroups g(size_t(mesh.batch_shards()));
  for (int64_t d = 0; d < mesh.devices(); ++d) g[size_t(d / C)].push_back(d);
  return g;
}

}  // namespace olmosft::xla
