// A small typed builder that writes StableHLO as MLIR text (generic op syntax) for one function,
// `func.func public @main(args...) -> (results...)`, with no tuples. Every value carries its type (element
// type + shape); each op checks its operands' types and refuses a mismatch with an olmosft::Error naming the
// op and the types. The text is what Client::compile (pjrt.h) takes. docs/xla.md lists the ops.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "xla/types.h"

namespace olmosft::xla {

class HloBuilder;

// An SSA value of the function being built. Cheap to copy; valid only in the region that defined it and the
// regions nested in it (checked on use).
class Value {
 public:
  const TensorType& type() const { return type_; }
  const std::string& name() const { return name_; }

 private:
  friend class HloBuilder;
  Value(std::string name, TensorType type, int region)
      : name_(std::move(name)), type_(std::move(type)), region_(region) {}
  std::string name_;
  TensorType type_;
  int region_ = 0;
};

enum class Compare { kEq, kNe, kLt, kLe, kGt, kGe };

// dot_general's dimension numbers: batch dimensions pair up in order, as do contracting ones.
struct DotDims {
  std::vector<int64_t> lhs_batch, rhs_batch, lhs_contract, rhs_contract;
};

struct CustomCallOptions {
  // api_version 1-3: any bytes, written as an MLIR string attribute (escaped). api_version 4 (typed FFI): an
  // MLIR dictionary attribute, written as is, e.g. `{eps = 1.0e-06 : f32}` (empty: `{}`).
  std::string backend_config;
  int api_version =
      2;  // XLA's custom-call API version (2: status returning, as cuDNN's attention; 4: typed FFI)
  bool has_side_effect = false;
  // Layouts (minor-to-major dimension orders, one per operand / result, each a permutation of its rank) that
  // the call's implementation reads and writes, e.g. cuDNN's attention results as {3, 1, 2, 0}. Empty: none
  // stated (XLA's default, row-major); otherwise both lists are given, one entry per operand and result.
  std::vector<std::vector<int64_t>> operand_layouts, result_layouts;
  // An HloSharding text written as the call's mhlo.sharding (the partitioner's @Sharding,
  // @SPMDFullToShardShape and @SPMDShardToFullShape calls; HloBuilder::constrain, full_to_shard,
  // shard_to_full). Empty: none.
  std::string sharding;
};

class HloBuilder {
 public:
  // A region body: receives the region's block arguments and returns what the region yields.
  using RegionFn = std::function<std::vector<Value>(HloBuilder&, const std::vector<Value>&)>;
  // A counted loop body: the iteration index (s32 scalar) and the carried values; returns the new carried
  // values.
  using LoopFn = std::function<std::vector<Value>(HloBuilder&, const Value&, const std::vector<Value>&)>;

  explicit HloBuilder(std::string module_name = "olmosft");

  // Function arguments, in order. ALIAS_OUTPUT marks the argument as donatable into that result
  // (tf.aliasing_output): the result must have the same type, and Executable::execute may then consume it.
  Value argument(const TensorType& type, std::optional<int> alias_output = std::nullopt);
  // The function's results (once, at the top level).
  void returns(const std::vector<Value>& results);

  // SPMD (XLA's partitioner; docs/xla.md "SPMD"): the module is one program for N devices
  // (mhlo.num_partitions; compile it with CompileOptions num_partitions N and use_spmd_partitioning). An
  // argument or result may then carry its layout over the devices as an HloSharding text (mhlo.sharding):
  // sharding_replicated(), or sharding_tiled(TILES) that splits dimension i into TILES[i] parts. Unmarked
  // ones are the partitioner's choice.
  void partitions(int64_t n);
  void shard_argument(const Value& argument, const std::string& sharding);
  void shard_result(size_t index, const std::string& sharding);
  // The whole module's text; needs returns().
  std::string module() const;

  // A constant with every element VALUE (integer types need an integral VALUE, pred 0 or 1).
  Value constant(const TensorType& type, double value);
  Value scalar(ElementType type, double value) { return constant(TensorType{type, {}}, value); }
  // A constant with the given VALUES, row-major, one per element (each exact in TYPE's element type: floats
  // as their bits, so an f32 table passed as floats round-trips bit for bit).
  Value dense_constant(const TensorType& type, const std::vector<double>& values);
  Value iota(const TensorType& type, int64_t dim);

  Value neg(const Value& x) { return unary("negate", x, false); }
  Value abs(const Value& x) { return unary("abs", x, false); }
  Value exp(const Value& x) { return unary("exponential", x, true); }
  Value log(const Value& x) { return unary("log", x, true); }
  Value sqrt(const Value& x) { return unary("sqrt", x, true); }
  Value rsqrt(const Value& x) { return unary("rsqrt", x, true); }
  Value tanh(const Value& x) { return unary("tanh", x, true); }
  Value logistic(const Value& x) { return unary("logistic", x, true); }
  Value cos(const Value& x) { return unary("cosine", x, true); }
  Value sin(const Value& x) { return unary("sine", x, true); }
  Value ceil(const Value& x) { return unary("ceil", x, true); }

  Value add(const Value& a, const Value& b) { return binary("add", a, b); }
  Value sub(const Value& a, const Value& b) { return binary("subtract", a, b); }
  Value mul(const Value& a, const Value& b) { return binary("multiply", a, b); }
  Value div(const Value& a, const Value& b) { return binary("divide", a, b); }
  Value max(const Value& a, const Value& b) { return binary("maximum", a, b); }
  Value min(const Value& a, const Value& b) { return binary("minimum", a, b); }
  Value pow(const Value& a, const Value& b) { return binary("power", a, b); }

  Value compare(const Value& a, const Value& b, Compare direction);
  // PRED is a pred tensor of the operands' shape, or a pred scalar.
  Value select(const Value& pred, const Value& on_true, const Value& on_false);
  Value convert(const Value& x, ElementType to);

  // Result shape DIMS; operand dimension i goes to result dimension BROADCAST_DIMS[i] (size 1 or equal).
  Value broadcast_in_dim(const Value& x, const std::vector<int64_t>& dims,
                         const std::vector<int64_t>& broadcast_dims);
  Value reduce_sum(const Value& x, const std::vector<int64_t>& dims) { return reduce(x, dims, false); }
  Value reduce_max(const Value& x, const std::vector<int64_t>& dims) { return reduce(x, dims, true); }
  // Result: batch dims, then lhs's free dims, then rhs's free dims. RESULT: the result's element type when it
  // differs from the operands' (a float type at least as wide, e.g. bf16 operands with an f32 result, so the
  // products are accumulated in f32); default the operands' type.
  Value dot_general(const Value& lhs, const Value& rhs, const DotDims& dims,
                    std::optional<ElementType> result = std::nullopt);

  // stablehlo.triangular_solve, left side: X with op(A) X = B, A [..., n, n] triangular (LOWER: its lower
  // triangle is read, the other ignored; UNIT_DIAGONAL: its diagonal is taken as ones, not read), B [..., n,
  // m] with the same leading (batch) dimensions, op(A) = A or (TRANSPOSE_A) A^T. Float types only.
  Value triangular_solve(const Value& a, const Value& b, bool lower, bool unit_diagonal, bool transpose_a);

  Value reshape(const Value& x, const std::vector<int64_t>& dims);
  Value transpose(const Value& x, const std::vector<int64_t>& permutation);
  // Static slice [START, LIMIT) with STRIDES (default 1).
  Value slice(const Value& x, const std::vector<int64_t>& start, const std::vector<int64_t>& limit,
              std::vector<int64_t> strides = {});
  // STARTS: one integer scalar per dimension (clamped into range by XLA).
  Value dynamic_slice(const Value& x, const std::vector<Value>& starts, const std::vector<int64_t>& sizes);
  Value dynamic_update_slice(const Value& x, const Value& update, const std::vector<Value>& starts);
  Value concatenate(const std::vector<Value>& xs, int64_t dim);
  // Rows of TABLE [V, d...] (any element type, V >= 1) picked by IDS (s32, [N] or [B, T]): the result is
  // [N, d...] (or [B, T, d...]) with row i = TABLE[IDS[i]] (stablehlo.gather). An out-of-range id is clamped
  // into [0, V-1] by XLA, not refused: the caller validates ids on the host.
  Value gather_rows(const Value& table, const Value& ids);
  // TABLE [V, d...] with UPDATES[i] added into row IDS[i] (stablehlo.scatter with an add region): IDS s32 [N]
  // (or [B, T]), UPDATES [N, d...] (or [B, T, d...]) of TABLE's numeric element type. Duplicate ids
  // accumulate, in an order XLA chooses (float sums may differ from a sequential sum in the last bits). An
  // update with an out-of-range id is dropped by XLA, not refused: the caller validates ids on the host.
  Value scatter_add_rows(const Value& table, const Value& ids, const Value& updates);
  // The inclusive cumulative sum of X (a numeric type) along DIM: y_i = x_0 + ... + x_i
  // (stablehlo.reduce_window with a window of the whole dimension, padded before, as jnp.cumsum lowers;
  // XLA rewrites it into a tree). Integer sums are exact; float ones in XLA's order.
  Value cumsum(const Value& x, int64_t dim);

  // stablehlo.while: COND returns one pred scalar, BODY returns values of INIT's types. NAME (optional) is
  // the op's location, loc("NAME"), which XLA keeps as the while instruction's op_name metadata: what the
  // partitioned program's checks (xla/hlo_loops.h) know a loop by.
  std::vector<Value> while_loop(const std::vector<Value>& init, const RegionFn& cond, const RegionFn& body,
                                const std::string& name = "");
  // A scan: BODY runs for i = 0 .. TRIP_COUNT-1 over the carried values (a while loop with an s32 counter).
  std::vector<Value> for_loop(int64_t trip_count, const std::vector<Value>& init, const LoopFn& body,
                              const std::string& name = "");

  std::vector<Value> custom_call(const std::string& target, const std::vector<Value>& operands,
                                 const std::vector<TensorType>& results,
                                 const CustomCallOptions& options = {});

  // ---- SPMD inside the program (hlo_builder_spmd.cpp; docs/xla.md "The device mesh") ----
  // X laid out as SHARDING from here on (a sharding constraint: GSPMD's @Sharding call).
  Value constrain(const Value& x, const std::string& sharding);
  // A manual region, as JAX's shard_map lowers to GSPMD: X (the whole array, laid out as SHARDING, which must
  // be tiled) becomes each device's own tile, LOCAL its type; inside, values are per device and only the
  // collectives below cross devices. shard_to_full is the inverse: each device's tile X back into the whole
  // array of type FULL, laid out as SHARDING.
  Value full_to_shard(const Value& x, const std::string& sharding, const TensorType& local);
  Value shard_to_full(const Value& x, const std::string& sharding, const TensorType& full);
  // Collectives over GROUPS of device (partition) ids, each group in order (use_global_device_ids; one
  // channel each): all_gather concatenates the group's tiles along DIM in group order; reduce_scatter sums
  // them and leaves each device the part of DIM at its place in its group; all_reduce_sum sums them.
  using DeviceGroups = std::vector<std::vector<int64_t>>;
  Value all_gather(const Value& x, int64_t dim, const DeviceGroups& groups);
  Value reduce_scatter(const Value& x, int64_t dim, const DeviceGroups& groups);
  Value all_reduce_sum(const Value& x, const DeviceGroups& groups);
  // A private function of the module built by BODY from arguments of ARGS's types, called here with ARGS
  // (func.call): its body sees only its arguments (values from outside are refused), and the compiler's
  // constant uniquing stays inside it. A manual region's body goes in one, as JAX's shard_map puts it:
  // XLA's importer otherwise shares a constant between the region and the rest, and sharding propagation
  // then spreads {manual} outside the region and aborts.
  std::vector<Value> call(const std::string& name, const std::vector<Value>& args, const RegionFn& body);
  // stablehlo.optimization_barrier: the values unchanged, but XLA may neither look through nor move work
  // across it (recomputation kept from being merged back into the forward, as jax.checkpoint does).
  std::vector<Value> optimization_barrier(const std::vector<Value>& xs);
  // stablehlo.remainder (integer: C's %, the sign of the dividend).
  Value rem(const Value& a, const Value& b) { return binary("remainder", a, b); }

 private:
  struct Region {
    int id;
    std::string text;
  };
  Value unary(const char* op, const Value& x, bool float_only);
  Value binary(const char* op, const Value& a, const Value& b);
  Value reduce(const Value& x, const std::vector<int64_t>& dims, bool is_max);
  // Emits `%vN = "stablehlo.OP"(operands) REGIONS {ATTRS} : (types) -> results` in the current region.
  std::vector<Value> emit(const std::string& op, const std::vector<Value>& operands, const std::string& attrs,
                          const std::vector<TensorType>& results, const std::string& regions = "",
                          const std::string& loc = "");
  Value emit1(const std::string& op, const std::vector<Value>& operands, const std::string& attrs,
              const TensorType& result) {
    return emit(op, operands, attrs, {result})[0];
  }
  // Builds a region with block arguments of ARG_TYPES; returns its text ("{ ^bb0(...): ... }").
  std::string region(const std::vector<TensorType>& arg_types, const RegionFn& fn,
                     const std::vector<TensorType>& yield_types, const std::string& what);
  void use(const Value& v, const char* op) const;  // refuses a value from a closed region or another builder
  std::string fresh();
  static int next_region_id();  // unique in the process

  std::string module_name_;
  int next_value_ = 0;
  std::vector<Region> regions_;  // open regions, ids unique in the process; [0] is the function body
  std::vector<std::pair<TensorType, std::optional<int>>> args_;
  std::vector<Value> results_;
  int64_t partitions_ = 1;
  std::map<size_t, std::string> arg_sharding_, result_sharding_;
  int64_t next_channel_ = 1;            // channel handles of the collectives
  std::vector<std::string> functions_;  // the module's private functions (call), complete texts
  bool returned_ = false;
  std::string body_;
};

// HloSharding texts for HloBuilder::shard_argument / shard_result: a full copy on every device, or the
// array split into TILES[i] equal parts along dimension i over prod(TILES) devices in order
// ({devices=[2,1]0,1}).
std::string sharding_replicated();
std::string sharding_tiled(const std::vector<int64_t>& tiles);

}  // namespace olmosft::xla
