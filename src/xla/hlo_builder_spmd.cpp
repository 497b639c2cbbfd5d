// SPMD ops of the StableHLO emitter (hlo_builder.h "SPMD inside the program"): sharding constraints, manual
// regions (GSPMD's @SPMDFullToShardShape / @SPMDShardToFullShape, as JAX's shard_map lowers them) and the
// collectives their bodies use, plus optimization_barrier.
#include <algorithm>
#include <cctype>

#include "core/error.h"
#include "xla/hlo_builder.h"
#include "xla/mlir_text.h"

namespace olmosft::xla {

namespace {

// dense<[[0, 1], [2, 3]]> : tensor<2x2xi64>; every group the same size, each id once.
std::string groups_attr(const HloBuilder::DeviceGroups& groups, const char* op) {
  OLMO_CHECK(!groups.empty() && !groups[0].empty(), "hlo_builder: ", op, " without device groups");
  std::vector<int64_t> seen;
  std::string s = "dense<[";
  for (size_t g = 0; g < groups.size(); ++g) {
    OLMO_CHECK(groups[g].size() == groups[0].size(), "hlo_builder: ", op, ": device group ", g, " has ",
               groups[g].size(), " devices, group 0 has ", groups[0].size());
    s += (g ? ", [" : "[");
    for (size_t i = 0; i < groups[g].size(); ++i) {
      const int64_t d = groups[g][i];
      OLMO_CHECK(d >= 0 && std::find(seen.begin(), seen.end(), d) == seen.end(), "hlo_builder: ", op,
                 ": device ", d, " is negative or in two groups");
      seen.push_back(d);
      s += (i ? ", " : "") + std::to_string(d);
    }
    s += "]";
  }
  return s + "]> : tensor<" + std::to_string(groups.size()) + "x" + std::to_string(groups[0].size()) +
         "xi64>";
}

// A sum region over scalars of X's element type.
HloBuilder::RegionFn sum_body() {
  return [](HloBuilder& b, const std::vector<Value>& a) { return std::vector<Value>{b.add(a[0], a[1])}; };
}

}  // namespace

Value HloBuilder::constrain(const Value& x, const std::string& sharding) {
  CustomCallOptions o;
  o.sharding = sharding;
  return custom_call("Sharding", {x}, {x.type()}, o)[0];
}

Value HloBuilder::full_to_shard(const Value& x, const std::string& sharding, const TensorType& local) {
  OLMO_CHECK(local.type == x.type().type && local.rank() == x.type().rank(),
             "hlo_builder: full_to_shard: local type ", local.mlir(), " does not match ", x.type().mlir());
  for (int64_t i = 0; i < local.rank(); ++i)
    OLMO_CHECK(local.dims[size_t(i)] >= 1 && x.type().dims[size_t(i)] % local.dims[size_t(i)] == 0,
               "hlo_builder: full_to_shard: local ", local.mlir(), " does not tile ", x.type().mlir());
  CustomCallOptions o;
  o.sharding = "{manual}";
  return custom_call("SPMDFullToShardShape", {constrain(x, sharding)}, {local}, o)[0];
}

Value HloBuilder::shard_to_full(const Value& x, const std::string& sharding, const TensorType& full) {
  OLMO_CHECK(full.type == x.type().type && full.rank() == x.type().rank(),
             "hlo_builder: shard_to_full: ", x.type().mlir(), " is no tile of ", full.mlir());
  CustomCallOptions manual;
  manual.sharding = "{manual}";
  const Value m = custom_call("Sharding", {x}, {x.type()}, manual)[0];
  CustomCallOptions o;
  o.sharding = sharding;
  return custom_call("SPMDShardToFullShape", {m}, {full}, o)[0];
}

Value HloBuilder::all_gather(const Value& x, int64_t dim, const DeviceGroups& groups) {
  mlir::check_dims({dim}, x.type(), "all_gather", "gathered");
  TensorType out = x.type();
  out.dims[size_t(dim)] *= static_cast<int64_t>(groups.at(0).size());
  const std::string attrs =
      "all_gather_dim = " + std::to_string(dim) +
      " : i64, channel_handle = " + "#stablehlo.channel_handle<handle = " + std::to_string(next_channel_++) +
      ", type = 1>, replica_groups = " + groups_attr(groups, "all_gather") + ", use_global_device_ids";
  return emit1("stablehlo.all_gather", {x}, attrs, out);
}

Value HloBuilder::reduce_scatter(const Value& x, int64_t dim, const DeviceGroups& groups) {
  mlir::check_dims({dim}, x.type(), "reduce_scatter", "scattered");
  const int64_t n = static_cast<int64_t>(groups.at(0).size());
  TensorType out = x.type();
  OLMO_CHECK(out.dims[size_t(dim)] % n == 0, "hlo_builder: reduce_scatter: dimension ", dim, " of ",
             x.type().mlir(), " does not split into ", n, " parts");
  out.dims[size_t(dim)] /= n;
  const TensorType scalar{x.type().type, {}};
  const std::string body = region({scalar, scalar}, sum_body(), {scalar}, "reduce_scatter");
  const std::string attrs =
      "channel_handle = #stablehlo.channel_handle<handle = " + std::to_string(next_channel_++) +
      ", type = 1>, replica_groups = " + groups_attr(groups, "reduce_scatter") +
      ", scatter_dimension = " + std::to_string(dim) + " : i64, use_global_device_ids";
  return emit("stablehlo.reduce_scatter", {x}, attrs, {out}, " (" + body + ")")[0];
}

Value HloBuilder::all_reduce_sum(const Value& x, const DeviceGroups& groups) {
  const TensorType scalar{x.type().type, {}};
  const std::string body = region({scalar, scalar}, sum_body(), {scalar}, "all_reduce");
  const std::string attrs =
      "channel_handle = #stablehlo.channel_handle<handle = " + std::to_string(next_channel_++) +
      ", type = 1>, replica_groups = " + groups_attr(groups, "all_reduce") + ", use_global_device_ids";
  return emit("stablehlo.all_reduce", {x}, attrs, {x.type()}, " (" + body + ")")[0];
}

std::vector<Value> HloBuilder::call(const std::string& name, const std::vector<Value>& args,
                                    const RegionFn& body) {
  OLMO_CHECK(!name.empty() && std::all_of(name.begin(), name.end(),
                                          [](char c) { return std::isalnum((unsigned char)c) || c == '_'; }),
             "hlo_builder: call: function name `", name, "` must be letters, digits and _");
  for (const Value& v : args) use(v, "call");
  const std::string fname = name + "_" + std::to_string(functions_.size());
  std::vector<Region> outer = std::move(regions_);
  regions_.clear();
  regions_.push_back(Region{next_region_id(), ""});
  std::vector<Value> fargs;
  std::string header;
  for (const Value& a : args) {
    fargs.push_back(Value(fresh(), a.type(), regions_.back().id));
    header += (header.empty() ? "" : ", ") + fargs.back().name() + ": " + a.type().mlir();
  }
  std::vector<Value> yields;
  try {
    yields = body(*this, fargs);
    OLMO_CHECK(!yields.empty(), "hlo_builder: call ", name, " returns nothing");
    for (const Value& v : yields) use(v, "call");
  } catch (...) {
    regions_ = std::move(outer);
    throw;
  }
  std::vector<TensorType> types;
  std::string names;
  for (const Value& v : yields) {
    types.push_back(v.type());
    names += (names.empty() ? "" : ", ") + v.name();
  }
  functions_.push_back("  func.func private @" + fname + "(" + header + ") -> (" + mlir::types_list(types) +
                       ") {\n" + regions_[0].text + "    \"func.return\"(" + names + ") : (" +
                       mlir::types_list(types) + ") -> ()\n  }\n");
  regions_ = std::move(outer);
  return emit("func.call", args, "callee = @" + fname, types);
}

std::vector<Value> HloBuilder::optimization_barrier(const std::vector<Value>& xs) {
  OLMO_CHECK(!xs.empty(), "hlo_builder: optimization_barrier of nothing");
  std::vector<TensorType> types;
  for (const Value& v : xs) types.push_back(v.type());
  return emit("stablehlo.optimization_barrier", xs, "", types);
}

}  // namespace olmosft::xla
