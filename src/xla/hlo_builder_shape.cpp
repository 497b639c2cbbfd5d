// HloBuilder: dot_general, the shape ops (reshape, transpose, slices, concatenate), row gather/scatter-add,
// loops and custom calls.
#include <algorithm>

#include "core/error.h"
#include "xla/hlo_builder.h"
#include "xla/mlir_text.h"

namespace olmosft::xla {

namespace {

// The dimensions of T in neither A nor B, in order.
std::vector<int64_t> free_dims(const TensorType& t, const std::vector<int64_t>& a,
                               const std::vector<int64_t>& b) {
  std::vector<int64_t> out;
  for (int64_t d = 0; d < t.rank(); ++d)
    if (std::find(a.begin(), a.end(), d) == a.end() && std::find(b.begin(), b.end(), d) == b.end())
      out.push_back(d);
  return out;
}

}  // namespace

Value HloBuilder::dot_general(const Value& lhs, const Value& rhs, const DotDims& d,
                              std::optional<ElementType> result) {
  const TensorType &l = lhs.type(), &r = rhs.type();
  OLMO_CHECK(l.type == r.type && l.type != ElementType::kPred,
             "hlo_builder: dot_general: operand element types ", l.mlir(), " and ", r.mlir(),
             " must be the same numeric type");
  OLMO_CHECK(d.lhs_batch.size() == d.rhs_batch.size(), "hlo_builder: dot_general: ", d.lhs_batch.size(),
             " lhs batch dimensions but ", d.rhs_batch.size(), " rhs ones");
  OLMO_CHECK(d.lhs_contract.size() == d.rhs_contract.size(),
             "hlo_builder: dot_general: ", d.lhs_contract.size(), " lhs contracting dimensions but ",
             d.rhs_contract.size(), " rhs ones");
  std::vector<int64_t> lhs_all = d.lhs_batch, rhs_all = d.rhs_batch;
  lhs_all.insert(lhs_all.end(), d.lhs_contract.begin(), d.lhs_contract.end());
  rhs_all.insert(rhs_all.end(), d.rhs_contract.begin(), d.rhs_contract.end());
  mlir::check_dims(lhs_all, l, "dot_general", "lhs batch/contracting");
  mlir::check_dims(rhs_all, r, "dot_general", "rhs batch/contracting");
  for (size_t i = 0; i < lhs_all.size(); ++i) {
    const int64_t a = l.dims[size_t(lhs_all[i])], b = r.dims[size_t(rhs_all[i])];
    OLMO_CHECK(a == b, "hlo_builder: dot_general: lhs dimension ", lhs_all[i], " (size ", a,
               ") pairs with rhs dimension ", rhs_all[i], " (size ", b, "): ", l.mlir(), " x ", r.mlir());
  }
  if (result && *result != l.type)
    OLMO_CHECK(is_float(l.type) && is_float(*result) && element_bytes(*result) >= element_bytes(l.type),
               "hlo_builder: dot_general: result element type ", mlir_name(*result),
               " must be a float type at least as wide as the operands' ", mlir_name(l.type));
  TensorType out{result.value_or(l.type), {}};
  for (int64_t b : d.lhs_batch) out.dims.push_back(l.dims[size_t(b)]);
  for (int64_t f : free_dims(l, d.lhs_batch, d.lhs_contract)) out.dims.push_back(l.dims[size_t(f)]);
  for (int64_t f : free_dims(r, d.rhs_batch, d.rhs_contract)) out.dims.push_back(r.dims[size_t(f)]);
  const std::string attr =
      "dot_dimension_numbers = #stablehlo.dot<lhs_batching_dimensions = " + mlir::i64_list(d.lhs_batch) +
      ", rhs_batching_dimensions = " + mlir::i64_list(d.rhs_batch) +
      ", lhs_contracting_dimensions = " + mlir::i64_list(d.lhs_contract) +
      ", rhs_contracting_dimensions = " + mlir::i64_list(d.rhs_contract) + ">" +
      // f32 / f64 operands: full precision on every device. XLA's DEFAULT lets a GPU multiply f32 in TF32
      // (10-bit mantissa) and a TPU in one bf16 pass: an fp32 model silently trained at lower precision.
      (l.type == ElementType::kF32 || l.type == ElementType::kF64
           ? ", precision_config = [#stablehlo<precision HIGHEST>, #stablehlo<precision HIGHEST>]"
           : "");
  return emit1("stablehlo.dot_general", {lhs, rhs}, attr, out);
}

Value HloBuilder::triangular_solve(const Value& a, const Value& b, bool lower, bool unit_diagonal,
                                   bool transpose_a) {
  const TensorType &ta = a.type(), &tb = b.type();
  const size_t r = ta.dims.size();
  OLMO_CHECK(ta.type == tb.type && is_float(ta.type), "hlo_builder: triangular_solve: operands ", ta.mlir(),
             " and ", tb.mlir(), " must have the same float element type");
  OLMO_CHECK(r >= 2 && tb.dims.size() == r && ta.dims[r - 1] == ta.dims[r - 2] &&
                 tb.dims[r - 2] == ta.dims[r - 1] &&
                 std::equal(ta.dims.begin(), ta.dims.end() - 2, tb.dims.begin()),
             "hlo_builder: triangular_solve: a ", ta.mlir(), " must be [..., n, n] and b ", tb.mlir(),
             " [..., n, m] with the same leading dimensions");
  const std::string attr = std::string("left_side = true, lower = ") + (lower ? "true" : "false") +
                           ", unit_diagonal = " + (unit_diagonal ? "true" : "false") +
                           ", transpose_a = #stablehlo<transpose " +
                           (transpose_a ? "TRANSPOSE" : "NO_TRANSPOSE") + ">";
  return emit1("stablehlo.triangular_solve", {a, b}, attr, tb);
}

Value HloBuilder::reshape(const Value& x, const std::vector<int64_t>& dims) {
  const TensorType out{x.type().type, dims};
  OLMO_CHECK(out.elements() == x.type().elements(), "hlo_builder: reshape: ", x.type().mlir(), " (",
             x.type().elements(), " elements) cannot become ", out.mlir(), " (", out.elements(), ")");
  return emit1("stablehlo.reshape", {x}, "", out);
}

Value HloBuilder::transpose(const Value& x, const std::vector<int64_t>& perm) {
  const TensorType& t = x.type();
  OLMO_CHECK(int64_t(perm.size()) == t.rank(), "hlo_builder: transpose: permutation ", dims_string(perm),
             " for ", t.mlir());
  mlir::check_dims(perm, t, "transpose", "permutation");
  TensorType out{t.type, {}};
  for (int64_t p : perm) out.dims.push_back(t.dims[size_t(p)]);
  return emit1("stablehlo.transpose", {x}, "permutation = " + mlir::i64_array(perm), out);
}

Value HloBuilder::slice(const Value& x, const std::vector<int64_t>& start, const std::vector<int64_t>& limit,
                        std::vector<int64_t> strides) {
  const TensorType& t = x.type();
  if (strides.empty()) strides.assign(t.dims.size(), 1);
  OLMO_CHECK(int64_t(start.size()) == t.rank() && int64_t(limit.size()) == t.rank() &&
                 int64_t(strides.size()) == t.rank(),
             "hlo_builder: slice: start ", dims_string(start), ", limit ", dims_string(limit),
             " and strides ", dims_string(strides), " need one entry per dimension of ", t.mlir());
  TensorType out{t.type, {}};
  for (size_t i = 0; i < t.dims.size(); ++i) {
    OLMO_CHECK(0 <= start[i] && start[i] <= limit[i] && limit[i] <= t.dims[i] && strides[i] >= 1,
               "hlo_builder: slice: dimension ", i, " [", start[i], ", ", limit[i], ") step ", strides[i],
               " out of range for ", t.mlir());
    out.dims.push_back((limit[i] - start[i] + strides[i] - 1) / strides[i]);
  }
  return emit1("stablehlo.slice", {x},
               "start_indices = " + mlir::i64_array(start) + ", limit_indices = " + mlir::i64_array(limit) +
                   ", strides = " + mlir::i64_array(strides),
               out);
}

namespace {
void check_starts(const std::vector<Value>& starts, const TensorType& t, const char* op) {
  OLMO_CHECK(int64_t(starts.size()) == t.rank(), "hlo_builder: ", op, ": ", starts.size(),
             " start indices for ", t.mlir());
  for (const Value& s : starts)
    OLMO_CHECK(is_integer(s.type().type) && s.type().dims.empty() && s.type() == starts[0].type(),
               "hlo_builder: ", op, ": start indices are integer scalars of one type, got ", s.type().mlir());
}
}  // namespace

Value HloBuilder::dynamic_slice(const Value& x, const std::vector<Value>& starts,
                                const std::vector<int64_t>& sizes) {
  const TensorType& t = x.type();
  check_starts(starts, t, "dynamic_slice");
  OLMO_CHECK(int64_t(sizes.size()) == t.rank(), "hlo_builder: dynamic_slice: sizes ", dims_string(sizes),
             " for ", t.mlir());
  for (size_t i = 0; i < sizes.size(); ++i)
    OLMO_CHECK(sizes[i] >= 0 && sizes[i] <= t.dims[i], "hlo_builder: dynamic_slice: size ", sizes[i],
               " of dimension ", i, " exceeds ", t.mlir());
  std::vector<Value> operands{x};
  operands.insert(operands.end(), starts.begin(), starts.end());
  return emit1("stablehlo.dynamic_slice", operands, "slice_sizes = " + mlir::i64_array(sizes),
               TensorType{t.type, sizes});
}

Value HloBuilder::dynamic_update_slice(const Value& x, const Value& update,
                                       const std::vector<Value>& starts) {
  const TensorType &t = x.type(), &u = update.type();
  check_starts(starts, t, "dynamic_update_slice");
  OLMO_CHECK(u.type == t.type && u.rank() == t.rank(), "hlo_builder: dynamic_update_slice: update ", u.mlir(),
             " does not match operand ", t.mlir());
  for (size_t i = 0; i < t.dims.size(); ++i)
    OLMO_CHECK(u.dims[i] <= t.dims[i], "hlo_builder: dynamic_update_slice: update ", u.mlir(),
               " larger than ", t.mlir(), " in dimension ", i);
  std::vector<Value> operands{x, update};
  operands.insert(operands.end(), starts.begin(), starts.end());
  return emit1("stablehlo.dynamic_update_slice", operands, "", t);
}

Value HloBuilder::concatenate(const std::vector<Value>& xs, int64_t dim) {
  OLMO_CHECK(!xs.empty(), "hlo_builder: concatenate of nothing");
  const TensorType& first = xs[0].type();
  OLMO_CHECK(dim >= 0 && dim < first.rank(), "hlo_builder: concatenate: dimension ", dim,
             " out of range for ", first.mlir());
  TensorType out = first;
  out.dims[size_t(dim)] = 0;
  for (const Value& x : xs) {
    const TensorType& t = x.type();
    bool ok = t.type == first.type && t.rank() == first.rank();
    for (int64_t i = 0; ok && i < t.rank(); ++i) ok = i == dim || t.dims[size_t(i)] == first.dims[size_t(i)];
    OLMO_CHECK(ok, "hlo_builder: concatenate along ", dim, ": ", t.mlir(), " does not match ", first.mlir());
    out.dims[size_t(dim)] += t.dims[size_t(dim)];
  }
  return emit1("stablehlo.concatenate", xs, "dimension = " + std::to_string(dim) + " : i64", out);
}

namespace {
// Checks TABLE [V, d...] (V >= 1) and IDS (s32, rank 1 or 2); returns the row dimensions (d...).
std::vector<int64_t> row_dims(const TensorType& table, const TensorType& ids, const char* op) {
  OLMO_CHECK(table.rank() >= 1 && table.dims[0] >= 1, "hlo_builder: ", op, ": the table ", table.mlir(),
             " needs rank >= 1 and at least one row");
  OLMO_CHECK(ids.type == ElementType::kS32 && (ids.rank() == 1 || ids.rank() == 2), "hlo_builder: ", op,
             ": ids ", ids.mlir(), " must be s32 of rank 1 ([N]) or 2 ([B, T]) (table ", table.mlir(), ")");
  return std::vector<int64_t>(table.dims.begin() + 1, table.dims.end());
}

// The window dimensions of the gather result or the scatter updates: the row's, after the ids' dimensions.
std::vector<int64_t> window_dims(const TensorType& ids, const std::vector<int64_t>& row) {
  std::vector<int64_t> d;
  for (size_t i = 0; i < row.size(); ++i) d.push_back(ids.rank() + int64_t(i));
  return d;
}

// IDS [N] (or [B, T]) as [N, 1] ([B, T, 1]): the index vector is the last dimension, of size 1.
std::vector<int64_t> with_index_vector(const TensorType& ids) {
  std::vector<int64_t> d = ids.dims;
  d.push_back(1);
  return d;
}
}  // namespace

Value HloBuilder::gather_rows(const Value& table, const Value& ids) {
  const TensorType &t = table.type(), &i = ids.type();
  const std::vector<int64_t> row = row_dims(t, i, "gather_rows"), offset_dims = window_dims(i, row);
  TensorType out{t.type, i.dims};
  out.dims.insert(out.dims.end(), row.begin(), row.end());
  std::vector<int64_t> slice_sizes{1};
  slice_sizes.insert(slice_sizes.end(), row.begin(), row.end());
  const Value idx = reshape(ids, with_index_vector(i));
  // Empty dimension lists are left out of the attribute (a table of rank 1 has no offset dimensions).
  const std::string attrs =
      "dimension_numbers = #stablehlo.gather<" +
      (offset_dims.empty() ? "" : "offset_dims = " + mlir::i64_list(offset_dims) + ", ") +
      "collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = " + std::to_string(i.rank()) +
      ">, indices_are_sorted = false, slice_sizes = " + mlir::i64_array(slice_sizes);
  return emit1("stablehlo.gather", {table, idx}, attrs, out);
}

Value HloBuilder::scatter_add_rows(const Value& table, const Value& ids, const Value& updates) {
  const TensorType &t = table.type(), &i = ids.type(), &u = updates.type();
  const std::vector<int64_t> row = row_dims(t, i, "scatter_add_rows"), windows = window_dims(i, row);
  OLMO_CHECK(t.type != ElementType::kPred, "hlo_builder: scatter_add_rows of a pred table ", t.mlir());
  std::vector<int64_t> want = i.dims;
  want.insert(want.end(), row.begin(), row.end());
  OLMO_CHECK(u.type == t.type && u.dims == want, "hlo_builder: scatter_add_rows: updates ", u.mlir(),
             " must be ", TensorType{t.type, want}.mlir(), " (ids ", i.mlir(), " into table ", t.mlir(), ")");
  const Value idx = reshape(ids, with_index_vector(i));
  const TensorType scalar{t.type, {}};
  const std::string body = region(
      {scalar, scalar},
      [](HloBuilder& b, const std::vector<Value>& a) { return std::vector<Value>{b.add(a[0], a[1])}; },
      {scalar}, "scatter_add_rows");
  const std::string attrs =
      "indices_are_sorted = false, scatter_dimension_numbers = #stablehlo.scatter<" +
      (windows.empty() ? "" : "update_window_dims = " + mlir::i64_list(windows) + ", ") +
      "inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = " +
      std::to_string(i.rank()) + ">, unique_indices = false";
  return emit("stablehlo.scatter", {table, idx, updates}, attrs, {t}, " (" + body + ")")[0];
}

Value HloBuilder::cumsum(const Value& x, int64_t dim) {
  const TensorType& t = x.type();
  OLMO_CHECK(t.type != ElementType::kPred && dim >= 0 && dim < t.rank(), "hlo_builder: cumsum of ", t.mlir(),
             " along dimension ", dim, " (a numeric tensor and one of its dimensions)");
  const TensorType scalar{t.type, {}};
  const std::string body = region(
      {scalar, scalar},
      [](HloBuilder& b, const std::vector<Value>& a) { return std::vector<Value>{b.add(a[0], a[1])}; },
      {scalar}, "cumsum");
  std::vector<int64_t> window(size_t(t.rank()), 1), strides(size_t(t.rank()), 1);
  window[size_t(dim)] = t.dims[size_t(dim)];
  std::string pad = "dense<[";
  for (int64_t i = 0; i < t.rank(); ++i)
    pad += std::string(i ? ", " : "") + "[" + std::to_string(i == dim ? t.dims[size_t(i)] - 1 : 0) + ", 0]";
  pad += "]> : tensor<" + std::to_string(t.rank()) + "x2xi64>";
  const std::string attrs = "padding = " + pad + ", window_dimensions = " + mlir::i64_array(window) +
                            ", window_strides = " + mlir::i64_array(strides);
  return emit("stablehlo.reduce_window", {x, constant(scalar, 0.0)}, attrs, {t}, " (" + body + ")")[0];
}

std::vector<Value> HloBuilder::while_loop(const std::vector<Value>& init, const RegionFn& cond,
                                          const RegionFn& body, const std::string& name) {
  OLMO_CHECK(!init.empty(), "hlo_builder: while_loop with no carried values");
  std::vector<TensorType> types;
  for (const Value& v : init) types.push_back(v.type());
  const std::string c = region(types, cond, {TensorType{ElementType::kPred, {}}}, "while_loop condition");
  const std::string b = region(types, body, types, "while_loop body");
  return emit("stablehlo.while", init, "", types, " (" + c + ", " + b + ")", name);
}

std::vector<Value> HloBuilder::for_loop(int64_t trip_count, const std::vector<Value>& init,
                                        const LoopFn& body, const std::string& name) {
  OLMO_CHECK(trip_count >= 0 && trip_count <= 2147483647, "hlo_builder: for_loop: trip count ", trip_count,
             " out of the s32 range");
  std::vector<Value> carried{scalar(ElementType::kS32, 0)};
  carried.insert(carried.end(), init.begin(), init.end());
  auto out = while_loop(
      carried,
      [trip_count](HloBuilder& b, const std::vector<Value>& a) {
        return std::vector<Value>{
            b.compare(a[0], b.scalar(ElementType::kS32, double(trip_count)), Compare::kLt)};
      },
      [&body](HloBuilder& b, const std::vector<Value>& a) {
        std::vector<Value> next{b.add(a[0], b.scalar(ElementType::kS32, 1))};
        const std::vector<Value> state(a.begin() + 1, a.end());
        std::vector<Value> r = body(b, a[0], state);
        next.insert(next.end(), r.begin(), r.end());
        return next;
      },
      name);
  return std::vector<Value>(out.begin() + 1, out.end());
}

namespace {

// `[dense<[3, 2, 1, 0]> : tensor<4xindex>, ...]`: one minor-to-major permutation per value of TYPES.
std::string layouts_attr(const std::string& target, const char* what,
                         const std::vector<std::vector<int64_t>>& layouts,
                         const std::vector<TensorType>& types) {
  OLMO_CHECK(layouts.size() == types.size(), "hlo_builder: custom_call ", target, ": ", layouts.size(), " ",
             what, " layouts for ", types.size(), " ", what, "s (give one per ", what, ", or none at all)");
  std::string s = "[";
  for (size_t i = 0; i < layouts.size(); ++i) {
    const std::vector<int64_t>& l = layouts[i];
    std::vector<int64_t> sorted = l;
    std::sort(sorted.begin(), sorted.end());
    bool permutation = static_cast<int64_t>(l.size()) == types[i].rank();
    for (size_t j = 0; permutation && j < sorted.size(); ++j)
      permutation = sorted[j] == static_cast<int64_t>(j);
    OLMO_CHECK(permutation, "hlo_builder: custom_call ", target, ": ", what, " ", i, "'s layout ",
               dims_string(l), " is not a permutation of its ", types[i].rank(), " dimensions (",
               types[i].mlir(), ")");
    std::string dims;
    for (size_t j = 0; j < l.size(); ++j) dims += (j ? ", " : "") + std::to_string(l[j]);
    s += (i ? ", " : "") + std::string("dense<") + (l.size() == 1 ? dims : "[" + dims + "]") + "> : tensor<" +
         std::to_string(l.size()) + "xindex>";
  }
  return s + "]";
}

}  // namespace

std::vector<Value> HloBuilder::custom_call(const std::string& target, const std::vector<Value>& operands,
                                           const std::vector<TensorType>& results,
                                           const CustomCallOptions& o) {
  OLMO_CHECK(!target.empty(), "hlo_builder: custom_call without a target name");
  OLMO_CHECK(!results.empty(), "hlo_builder: custom_call ", target, " declares no results");
  for (const TensorType& t : results) (void)t.elements();
  std::string config = mlir::quoted(o.backend_config);
  if (o.api_version == 4) {  // typed FFI: the configuration is an MLIR dictionary attribute
    config = o.backend_config.empty() ? "{}" : o.backend_config;
    OLMO_CHECK(config.front() == '{' && config.back() == '}', "hlo_builder: custom_call ", target,
               ": with api_version 4 (typed FFI) backend_config is an MLIR dictionary attribute such as "
               "{eps = 1.0e-06 : f32}, got `",
               o.backend_config, "`");
  }
  std::string attrs = "call_target_name = " + mlir::quoted(target) +
                      ", has_side_effect = " + (o.has_side_effect ? "true" : "false") +
                      ", backend_config = " + config + ", api_version = " + std::to_string(o.api_version) +
                      " : i32";
  if (!o.operand_layouts.empty() || !o.result_layouts.empty()) {
    std::vector<TensorType> operand_types;
    for (const Value& v : operands) operand_types.push_back(v.type());
    attrs += ", operand_layouts = " + layouts_attr(target, "operand", o.operand_layouts, operand_types) +
             ", result_layouts = " + layouts_attr(target, "result", o.result_layouts, results);
  }
  if (!o.sharding.empty()) attrs += ", mhlo.sharding = " + mlir::quoted(o.sharding);
  return emit("stablehlo.custom_call", operands, attrs, results);
}

}  // namespace olmosft::xla
