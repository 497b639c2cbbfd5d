#include "model/xla_layout.h"

namespace olmosft::model {

std::string layout(const xla::Mesh& m, const xla::TensorType& t, Split s) {
  if (s == Split::kParam) return xla::param_sharding(m, t.dims);
  if (s == Split::kReplicated) return xla::sharding_replicated();
  return xla::dim_sharding(m, t.dims, 0,
                           s == Split::kTokens ? xla::Logical::kTokens : xla::Logical::kRowTiles,
                           "step value " + t.mlir());
}

PassLayout mesh_layout(xla::HloBuilder& b, const xla::Mesh& mesh) {
  const auto same = [](const xla::Value& x) { return x; };
  if (mesh.devices() <= 1) return {same, same, same, same};
  PassLayout l;
  l.tokens = [&b, mesh](const xla::Value& x) {
    return b.constrain(x, layout(mesh, x.type(), Split::kTokens));
  };
  l.gather = mesh.param_shards() > 1
                 ? std::function<xla::Value(const xla::Value&)>(
                       [&b](const xla::Value& x) { return b.constrain(x, xla::sharding_replicated()); })
                 : same;
  l.inputs = [&b, mesh](const xla::Value& x) {  // [G, P, N, d]: the tokens split
    return b.constrain(
        x, xla::dim_sharding(mesh, x.type().dims, 2, xla::Logical::kTokens, "saved layer inputs"));
  };
  l.stacked = [&b, mesh](const xla::Value& x) {  // [G, ...]: each group's tensor split as the parameter
    const std::vector<int64_t> inner(x.type().dims.begin() + 1, x.type().dims.end());
    const int k = xla::param_split_dim(mesh, inner);
    return b.constrain(x, k < 0 ? xla::sharding_replicated()
                                : xla::dim_sharding(mesh, x.type().dims, size_t(k) + 1, xla::Logical::kParam,
                                                    "stacked parameter"));
  };
  return l;
}

}  // namespace olmosft::model
