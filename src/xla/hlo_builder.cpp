#include "xla/hlo_builder.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "core/error.h"
#include "xla/mlir_text.h"

namespace olmosft::xla {

namespace {

std::atomic<int> g_next_region{1};

const char* direction_name(Compare c) {
  switch (c) {
    case Compare::kEq:
      return "EQ";
    case Compare::kNe:
      return "NE";
    case Compare::kLt:
      return "LT";
    case Compare::kLe:
      return "LE";
    case Compare::kGt:
      return "GT";
    case Compare::kGe:
      return "GE";
  }
  fail("hlo_builder: unknown comparison direction");
}

}  // namespace

HloBuilder::HloBuilder(std::string module_name) : module_name_(std::move(module_name)) {
  OLMO_CHECK(
      !module_name_.empty() && std::all_of(module_name_.begin(), module_name_.end(),
                                           [](char c) { return std::isalnum((unsigned char)c) || c == '_'; }),
      "hlo_builder: module name `", module_name_, "` must be letters, digits and _");
  regions_.push_back(Region{g_next_region++, ""});
}

int HloBuilder::next_region_id() { return g_next_region++; }

std::string HloBuilder::fresh() { return "%v" + std::to_string(next_value_++); }

void HloBuilder::use(const Value& v, const char* op) const {
  const bool open =
      std::any_of(regions_.begin(), regions_.end(), [&](const Region& r) { return r.id == v.region_; });
  OLMO_CHECK(open, "hlo_builder: ", op, ": operand ", v.name_, " (", v.type_.mlir(),
             ") is not visible here: it belongs to another builder or to a region that is closed");
}

Value HloBuilder::argument(const TensorType& type, std::optional<int> alias_output) {
  OLMO_CHECK(regions_.size() == 1 && !returned_,
             "hlo_builder: arguments are added at the top level, before returns()");
  (void)type.elements();  // checks the dimensions
  args_.emplace_back(type, alias_output);
  return Value("%arg" + std::to_string(args_.size() - 1), type, regions_[0].id);
}

void HloBuilder::returns(const std::vector<Value>& results) {
  OLMO_CHECK(regions_.size() == 1, "hlo_builder: returns() inside a region");
  OLMO_CHECK(!returned_, "hlo_builder: returns() called twice");
  OLMO_CHECK(!results.empty(), "hlo_builder: the function returns nothing");
  for (const Value& v : results) use(v, "returns");
  for (size_t i = 0; i < args_.size(); ++i) {
    const auto& [t, alias] = args_[i];
    if (!alias) continue;
    OLMO_CHECK(*alias >= 0 && size_t(*alias) < results.size(), "hlo_builder: argument ", i,
               " aliases result ", *alias, " but the function has ", results.size(), " results");
    OLMO_CHECK(results[size_t(*alias)].type_ == t, "hlo_builder: argument ", i, " (", t.mlir(),
               ") aliases result ", *alias, " of another type (", results[size_t(*alias)].type_.mlir(), ")");
  }
  results_ = results;
  returned_ = true;
}

void HloBuilder::partitions(int64_t n) {
  OLMO_CHECK(n >= 1, "hlo_builder: partitions must be >= 1, got ", n);
  partitions_ = n;
}

void HloBuilder::shard_argument(const Value& argument, const std::string& sharding) {
  const std::string& name = argument.name_;
  OLMO_CHECK(name.rfind("%arg", 0) == 0 && argument.region_ == regions_[0].id,
             "hlo_builder: shard_argument of ", name, ", which is not a function argument");
  arg_sharding_[std::stoul(name.substr(4))] = sharding;
}

void HloBuilder::shard_result(size_t index, const std::string& sharding) {
  result_sharding_[index] = sharding;
}

std::string sharding_replicated() { return "{replicated}"; }

std::string sharding_tiled(const std::vector<int64_t>& tiles) {
  int64_t n = 1;
  std::string dims, devices;
  for (int64_t t : tiles) {
    OLMO_CHECK(t >= 1, "hlo_builder: sharding_tiled: a dimension split into ", t, " parts");
    dims += (dims.empty() ? "" : ",") + std::to_string(t);
    n *= t;
  }
  for (int64_t d = 0; d < n; ++d) devices += (d ? "," : "") + std::to_string(d);
  return "{devices=[" + dims + "]" + devices + "}";
}

std::string HloBuilder::module() const {
  OLMO_CHECK(returned_, "hlo_builder: module() before returns()");
  for (const auto& [i, sh] : result_sharding_)
    OLMO_CHECK(i < results_.size(), "hlo_builder: shard_result ", i, " of ", results_.size(), " results");
  auto attrs = [](std::vector<std::string> a) {
    std::string out;
    for (const std::string& x : a)
      if (!x.empty()) out += (out.empty() ? "" : ", ") + x;
    return out.empty() ? out : " {" + out + "}";
  };
  auto sharding = [](const std::map<size_t, std::string>& m, size_t i) {
    auto it = m.find(i);
    return it == m.end() ? std::string() : "mhlo.sharding = \"" + it->second + "\"";
  };
  std::string s = "module @" + module_name_;
  if (partitions_ > 1)
    s += " attributes {mhlo.num_partitions = " + std::to_string(partitions_) +
         " : i32, mhlo.num_replicas = 1 : i32}";
  s += " {\n  func.func public @main(";
  for (size_t i = 0; i < args_.size(); ++i) {
    s += (i ? ", " : "") + std::string("%arg") + std::to_string(i) + ": " + args_[i].first.mlir();
    s += attrs({args_[i].second ? "tf.aliasing_output = " + std::to_string(*args_[i].second) + " : i32" : "",
                sharding(arg_sharding_, i)});
  }
  std::vector<TensorType> rt;
  std::string names, results;
  for (size_t i = 0; i < results_.size(); ++i) {
    const Value& v = results_[i];
    rt.push_back(v.type_);
    names += (names.empty() ? "" : ", ") + v.name_;
    results += (i ? ", " : "") + v.type_.mlir() + attrs({sharding(result_sharding_, i)});
  }
  s += ") -> (" + results + ") {\n" + regions_[0].text;
  s += "    \"func.return\"(" + names + ") : (" + mlir::types_list(rt) + ") -> ()\n  }\n";
  for (const std::string& f : functions_) s += f;
  return s + "}\n";
}

std::vector<Value> HloBuilder::emit(const std::string& op, const std::vector<Value>& operands,
                                    const std::string& attrs, const std::vector<TensorType>& results,
                                    const std::string& regions, const std::string& loc) {
  OLMO_CHECK(!returned_, "hlo_builder: ", op, " after returns()");
  std::vector<TensorType> in;
  std::string names;
  for (const Value& v : operands) {
    use(v, op.c_str());
    in.push_back(v.type_);
    names += (names.empty() ? "" : ", ") + v.name_;
  }
  const std::string base = fresh();
  Region& r = regions_.back();
  r.text += std::string(2 * regions_.size() + 2, ' ') + base;
  if (results.size() > 1) r.text += ":" + std::to_string(results.size());
  r.text += " = \"" + op + "\"(" + names + ")" + regions + (attrs.empty() ? "" : " {" + attrs + "}");
  r.text += " : (" + mlir::types_list(in) + ") -> " +
            (results.size() == 1 ? results[0].mlir() : "(" + mlir::types_list(results) + ")");
  if (!loc.empty()) {
    OLMO_CHECK(loc.find_first_of("\"\\\n") == std::string::npos, "hlo_builder: location name ", loc,
               " has a quote, backslash or newline");
    r.text += " loc(\"" + loc + "\")";
  }
  r.text += "\n";
  std::vector<Value> out;
  for (size_t i = 0; i < results.size(); ++i)
    out.push_back(Value(results.size() == 1 ? base : base + "#" + std::to_string(i), results[i], r.id));
  return out;
}

std::string HloBuilder::region(const std::vector<TensorType>& arg_types, const RegionFn& fn,
                               const std::vector<TensorType>& yield_types, const std::string& what) {
  regions_.push_back(Region{g_next_region++, ""});
  std::vector<Value> args;
  std::string header;
  for (const TensorType& t : arg_types) {
    args.push_back(Value(fresh(), t, regions_.back().id));
    header += (header.empty() ? "" : ", ") + args.back().name_ + ": " + t.mlir();
  }
  std::vector<Value> yields;
  try {
    yields = fn(*this, args);
    OLMO_CHECK(yields.size() == yield_types.size(), "hlo_builder: ", what, " returns ", yields.size(),
               " values, expected ", yield_types.size());
    for (size_t i = 0; i < yields.size(); ++i) {
      use(yields[i], what.c_str());
      OLMO_CHECK(yields[i].type_ == yield_types[i], "hlo_builder: ", what, " value ", i, " is ",
                 yields[i].type_.mlir(), ", expected ", yield_types[i].mlir());
    }
  } catch (...) {
    regions_.pop_back();
    throw;
  }
  const std::string indent(2 * regions_.size() + 2, ' ');
  std::string names;
  for (const Value& v : yields) names += (names.empty() ? "" : ", ") + v.name_;
  std::string text = "{\n" + std::string(2 * regions_.size(), ' ') + "^bb0(" + header + "):\n" +
                     regions_.back().text + indent + "\"stablehlo.return\"(" + names + ") : (" +
                     mlir::types_list(yield_types) + ") -> ()\n" + std::string(2 * regions_.size(), ' ') +
                     "}";
  regions_.pop_back();
  return text;
}

Value HloBuilder::constant(const TensorType& type, double value) {
  const std::string attr =
      "value = dense<" + mlir::literal(type.type, value, "constant") + "> : " + type.mlir();
  (void)type.elements();
  return emit1("stablehlo.constant", {}, attr, type);
}

Value HloBuilder::dense_constant(const TensorType& type, const std::vector<double>& values) {
  OLMO_CHECK(int64_t(values.size()) == type.elements(), "hlo_builder: dense_constant: ", values.size(),
             " values for ", type.mlir(), " (", type.elements(), " elements)");
  if (values.size() == 1) return constant(type, values[0]);
  // Written flat (MLIR wants nested lists for a higher rank) and reshaped.
  const TensorType flat{type.type, {type.elements()}};
  std::string list;
  for (size_t i = 0; i < values.size(); ++i)
    list += (i ? ", " : "") + mlir::literal(type.type, values[i], "dense_constant");
  const Value v = emit1("stablehlo.constant", {}, "value = dense<[" + list + "]> : " + flat.mlir(), flat);
  return type.rank() == 1 ? v : reshape(v, type.dims);
}

Value HloBuilder::iota(const TensorType& type, int64_t dim) {
  OLMO_CHECK(dim >= 0 && dim < type.rank(), "hlo_builder: iota: dimension ", dim, " out of range for ",
             type.mlir());
  OLMO_CHECK(type.type != ElementType::kPred, "hlo_builder: iota of pred");
  return emit1("stablehlo.iota", {}, "iota_dimension = " + std::to_string(dim) + " : i64", type);
}

Value HloBuilder::unary(const char* op, const Value& x, bool float_only) {
  OLMO_CHECK(!float_only || is_float(x.type_.type), "hlo_builder: ", op, " needs a float operand, got ",
             x.type_.mlir());
  OLMO_CHECK(x.type_.type != ElementType::kPred, "hlo_builder: ", op, " of a pred tensor");
  return emit1(std::string("stablehlo.") + op, {x}, "", x.type_);
}

Value HloBuilder::binary(const char* op, const Value& a, const Value& b) {
  OLMO_CHECK(a.type_ == b.type_, "hlo_builder: ", op, ": operand types differ: ", a.type_.mlir(), " and ",
             b.type_.mlir(), " (broadcast_in_dim or convert first)");
  OLMO_CHECK(a.type_.type != ElementType::kPred, "hlo_builder: ", op, " of pred tensors");
  return emit1(std::string("stablehlo.") + op, {a, b}, "", a.type_);
}

Value HloBuilder::compare(const Value& a, const Value& b, Compare direction) {
  OLMO_CHECK(a.type_ == b.type_, "hlo_builder: compare: operand types differ: ", a.type_.mlir(), " and ",
             b.type_.mlir());
  return emit1("stablehlo.compare", {a, b},
               std::string("comparison_direction = #stablehlo<comparison_direction ") +
                   direction_name(direction) + ">",
               TensorType{ElementType::kPred, a.type_.dims});
}

Value HloBuilder::select(const Value& pred, const Value& on_true, const Value& on_false) {
  OLMO_CHECK(on_true.type_ == on_false.type_,
             "hlo_builder: select: branch types differ: ", on_true.type_.mlir(), " and ",
             on_false.type_.mlir());
  OLMO_CHECK(pred.type_.type == ElementType::kPred &&
                 (pred.type_.dims.empty() || pred.type_.dims == on_true.type_.dims),
             "hlo_builder: select: the predicate ", pred.type_.mlir(), " must be a pred scalar or of shape ",
             dims_string(on_true.type_.dims));
  return emit1("stablehlo.select", {pred, on_true, on_false}, "", on_true.type_);
}

Value HloBuilder::convert(const Value& x, ElementType to) {
  return emit1("stablehlo.convert", {x}, "", TensorType{to, x.type_.dims});
}

Value HloBuilder::broadcast_in_dim(const Value& x, const std::vector<int64_t>& dims,
                                   const std::vector<int64_t>& broadcast_dims) {
  const TensorType out{x.type_.type, dims};
  (void)out.elements();
  OLMO_CHECK(broadcast_dims.size() == x.type_.dims.size(),
             "hlo_builder: broadcast_in_dim: ", broadcast_dims.size(),
             " broadcast dimensions for an operand of rank ", x.type_.rank(), " (", x.type_.mlir(), ")");
  mlir::check_dims(broadcast_dims, out, "broadcast_in_dim", "broadcast");
  for (size_t i = 0; i < broadcast_dims.size(); ++i) {
    const int64_t n = x.type_.dims[i], m = dims[size_t(broadcast_dims[i])];
    OLMO_CHECK(n == 1 || n == m, "hlo_builder: broadcast_in_dim: operand dimension ", i, " (size ", n,
               ") cannot broadcast to result dimension ", broadcast_dims[i], " (size ", m, ") of ",
               out.mlir());
  }
  return emit1("stablehlo.broadcast_in_dim", {x}, "broadcast_dimensions = " + mlir::i64_array(broadcast_dims),
               out);
}

Value HloBuilder::reduce(const Value& x, const std::vector<int64_t>& dims, bool is_max) {
  const char* op = is_max ? "reduce_max" : "reduce_sum";
  OLMO_CHECK(x.type_.type != ElementType::kPred, "hlo_builder: ", op, " of a pred tensor");
  mlir::check_dims(dims, x.type_, op, "reduced");
  const TensorType scalar{x.type_.type, {}};
  double init = 0;
  if (is_max)
    init = is_float(x.type_.type)              ? -std::numeric_limits<double>::infinity()
           : x.type_.type == ElementType::kS32 ? -2147483648.0
                                               : -9223372036854775808.0;
  const Value init_v = constant(scalar, init);
  TensorType out{x.type_.type, {}};
  for (int64_t d = 0; d < x.type_.rank(); ++d)
    if (std::find(dims.begin(), dims.end(), d) == dims.end()) out.dims.push_back(x.type_.dims[size_t(d)]);
  const std::string body = region(
      {scalar, scalar},
      [is_max](HloBuilder& b, const std::vector<Value>& a) {
        return std::vector<Value>{is_max ? b.max(a[0], a[1]) : b.add(a[0], a[1])};
      },
      {scalar}, op);
  return emit("stablehlo.reduce", {x, init_v}, "dimensions = " + mlir::i64_array(dims), {out},
              " (" + body + ")")[0];
}

}  // namespace olmosft::xla
