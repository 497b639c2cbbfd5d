// The PJRT runtime: loads a PJRT plugin (XLA's CPU plugin, its CUDA plugin, libtpu, or any file exporting
// GetPjrtApi), creates a client, moves arrays between the host and its devices, compiles StableHLO MLIR text
// and executes it. Every PJRT object is owned by a C++ object (client, buffers, executables; events inside
// the calls), and every PJRT_Error becomes an olmosft::Error naming the call that failed and carrying the
// plugin's message. The PJRT C API header stays out of this header (docs/xla.md).
#pragma once
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "xla/types.h"

struct PJRT_Api;
struct PJRT_Buffer;
struct PJRT_Executable;
struct PJRT_LoadedExecutable;
struct PJRT_TopologyDescription;

namespace olmosft::xla {

// A loaded plugin. Plugins are loaded once per process and path, initialised once (PJRT_Plugin_Initialize)
// and never unloaded (a PJRT plugin may keep threads and static state alive until exit).
class Plugin {
 public:
  // NAME_OR_PATH: `cpu` (XLA's CPU plugin installed under deps/xla by scripts/install-deps.sh), `cuda` (the
  // path in $OLMOSFT_PJRT_CUDA; not installed by this project), `tpu` ($OLMOSFT_PJRT_TPU, else the libtpu.so
  // that `scripts/install-deps.sh --tpu` unpacks into deps/xla/tpu), or a path to a plugin.
  static std::string resolve(std::string_view name_or_path);
  // Loads (or returns the already loaded) plugin. Refuses a plugin whose PJRT API major differs from the
  // header olmosft was built with; a newer minor is accepted (structs are versioned by struct_size), an older
  // one too as long as it has every function olmosft calls (checked at each call).
  static std::shared_ptr<const Plugin> load(std::string_view name_or_path);

  const std::string& path() const { return path_; }
  int api_major() const { return major_; }
  int api_minor() const { return minor_; }
  // The plugin's attributes (xla_version, stablehlo_current_version, ...), as text.
  const std::map<std::string, std::string>& attributes() const { return attributes_; }
  const PJRT_Api* api() const { return api_; }

  // The API version of the header olmosft was compiled against.
  static int header_major();
  static int header_minor();

  // Initialises the plugin (PJRT_Plugin_Initialize) and reads its attributes; use load().
  Plugin(std::string path, const PJRT_Api* api, int major, int minor);

 private:
  std::string path_;
  const PJRT_Api* api_;
  int major_, minor_;
  std::map<std::string, std::string> attributes_;
};

// A typed option passed to a plugin as a PJRT_NamedValue (topology and client create options). Which names
// and types a plugin reads is the plugin's own business: libtpu's topology options are in
// tpu_topology_options below.
struct NamedValue {
  std::string name;
  std::variant<std::string, int64_t, std::vector<int64_t>, float, bool> value;
};
// `name=value` pairs joined by ", " (int64 lists as 2,2,1 in brackets, strings quoted): for logs and errors.
std::string format_named_values(std::span<const NamedValue> values);

// A key-value store shared by the processes of one job: what PJRT_Client_Create's kv callbacks read and
// write (a multi-node CUDA client exchanges its local and global topologies, later NCCL ids, through it;
// dist/kv_store.h serves one over TCP). Implementations are thread-safe: the plugin calls from many threads.
// A failure of the store itself (a lost connection) throws olmosft::Error.
class KeyValueStore {
 public:
  virtual ~KeyValueStore() = default;
  // KEY's value, waiting up to TIMEOUT for it to be put; nullopt when it was not put in time.
  virtual std::optional<std::string> get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  // KEY's value now, or nullopt.
  virtual std::optional<std::string> try_get(const std::string& key) = 0;
  virtual void put(const std::string& key, const std::string& value) = 0;
};

struct ClientOptions {
  // Number of CPU devices (XLA's CPU plugin reads the create option "cpu_device_count"; its default is 4).
  // Unset: no option is passed, as other plugins may refuse options they do not know.
  std::optional<int64_t> cpu_device_count = {};
  // Further create options as the plugin names them (the CUDA plugin's memory_fraction, ...), passed as
  // given after cpu_device_count and the node options.
  std::vector<NamedValue> extra = {};
  // One node of a client over several processes (the CUDA plugin's int64 create options node_id and
  // num_nodes; libtpu takes a host's identity from its environment instead and refuses them): unset, no
  // option is passed. KV_STORE, when given, is handed to the plugin as its get / try-get / put callbacks and
  // kept alive by the client (the plugin uses it until the client is destroyed).
  std::optional<int64_t> node_id = {}, num_nodes = {};
  std::shared_ptr<KeyValueStore> kv_store = {};
};

// What goes into the serialized xla.CompileOptionsProto (compile_options_proto below).
struct CompileOptions {
  int64_t num_replicas = 1;
  int64_t num_partitions = 1;
  bool use_spmd_partitioning = false;
  int64_t device_ordinal = -1;  // -1: not set (the plugin's default device assignment)
  // XLA debug options for this compile only, as (flag, value) strings: CompileOptionsProto field 7
  // env_option_overrides (e.g. xla_gpu_cuda_data_dir, xla_dump_to).
  std::vector<std::pair<std::string, std::string>> env_option_overrides = {};
};

// The serialized xla.CompileOptionsProto for OPTIONS: field 3 executable_build_options with device_ordinal
// (1), num_replicas (4), num_partitions (5) and use_spmd_partitioning (6); field 7 env_option_overrides, one
// map entry per override (key 1, value 2: an OptionOverrideProto with string_field 1). An empty proto aborts
// the CPU plugin.
std::string compile_options_proto(const CompileOptions& options);

struct ClientState;  // shared by a client and everything made from it (pjrt_internal.h)

// An array on a device. Move-only; destroying it frees the device memory. A buffer donated to an execution is
// consumed: it stays valid as an object, and using it throws an Error that says so.
class Buffer {
 public:
  Buffer() = default;
  Buffer(std::shared_ptr<ClientState> client, PJRT_Buffer* buffer);
  Buffer(Buffer&& o) noexcept;
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer();

  const TensorType& type() const { return type_; }
  bool consumed() const { return consumed_; }
  // Copies the array to DST (DST_BYTES must be type().bytes()); waits for the copy.
  void to_host(void* dst, size_t dst_bytes) const;
  template <typename T>
  std::vector<T> to_host() const {
    std::vector<T> out(static_cast<size_t>(type_.elements()));
    check_host_type(sizeof(T));
    to_host(out.data(), out.size() * sizeof(T));
    return out;
  }
  PJRT_Buffer* handle() const;  // throws if empty or consumed
  void mark_consumed();         // frees the handle (after a donation)

 private:
  friend class Executable;  // checks that arguments come from its own client
  void check_host_type(size_t host_bytes) const;
  void release() noexcept;
  std::shared_ptr<ClientState> client_;
  PJRT_Buffer* buffer_ = nullptr;
  TensorType type_;
  bool consumed_ = false;
};

// What a compiled program needs in device memory (PJRT_Executable_GetCompiledMemoryStats, xla's
// CompiledMemoryStats), in bytes; the host_* fields are the same for host memory (offloading), zero
// without it. peak_bytes is 0 where the plugin does not report it.
struct MemoryStats {
  int64_t argument_bytes = 0, output_bytes = 0, alias_bytes = 0, temp_bytes = 0, generated_code_bytes = 0;
  int64_t host_argument_bytes = 0, host_output_bytes = 0, host_alias_bytes = 0, host_temp_bytes = 0,
          host_generated_code_bytes = 0;
  int64_t peak_bytes = 0;
  // What the program occupies while it runs, as JAX's memory_analysis() users count it: arguments +
  // outputs - what outputs reuse of donated arguments + temporaries + code.
  int64_t total_bytes() const {
    return argument_bytes + output_bytes - alias_bytes + temp_bytes + generated_code_bytes;
  }
};

// A compiled program's cost analysis (PJRT_Executable_GetCostAnalysis: XLA's HloCostAnalysis of the optimised
// program; for an SPMD program, of one device's partition): property -> value, e.g. "flops",
// "transcendentals", "bytes accessed". XLA counts a while loop's body once, not once per iteration.
using CostAnalysis = std::map<std::string, double>;

// A compiled program loaded on the client's devices. Move-only.
class Executable {
 public:
  Executable(std::shared_ptr<ClientState> client, PJRT_LoadedExecutable* exe);
  Executable(Executable&& o) noexcept;
  Executable& operator=(Executable&& o) noexcept;
  Executable(const Executable&) = delete;
  Executable& operator=(const Executable&) = delete;
  ~Executable();

  size_t num_outputs() const { return num_outputs_; }
  // Runs the program on one device with ARGS (in func.func @main's order) and waits for it. DONATE lists the
  // argument indices the program may consume (arguments the module marks with tf.aliasing_output); every
  // other argument is passed as not donatable, so it survives even if the module marks it. Donated buffers
  // are consumed afterwards (Buffer::consumed()).
  std::vector<Buffer> execute(std::span<Buffer* const> args, std::span<const size_t> donate = {});
  // Runs a program compiled for ARGS.size() devices (CompileOptions::num_partitions, an SPMD program) on the
  // client's first ARGS.size() addressable devices: ARGS[d] are device d's arguments (its shards, each on
  // device d), result[d] its outputs (its shards of each result; a replicated result has a full copy on
  // every device). DONATE as for execute(), for every device.
  std::vector<std::vector<Buffer>> execute_partitioned(std::span<const std::vector<Buffer*>> args,
                                                       std::span<const size_t> donate = {});
  // The compiled program's memory needs (PJRT_Executable_GetCompiledMemoryStats of its PJRT_Executable).
  MemoryStats memory_stats() const;
  CostAnalysis cost_analysis() const;

 private:
  void release() noexcept;
  std::shared_ptr<ClientState> client_;
  PJRT_LoadedExecutable* exe_ = nullptr;
  size_t num_outputs_ = 0;
};

// A PJRT client. Buffers and executables keep what they need of it alive, so they may outlive this object.
class Client {
 public:
  static Client create(std::shared_ptr<const Plugin> plugin, const ClientOptions& options = {});
  static Client create(std::string_view plugin_name_or_path, const ClientOptions& options = {});

  const Plugin& plugin() const;
  std::string platform_name() const;
  size_t device_count() const;  // addressable devices
  std::vector<std::string> device_descriptions() const;
  // Addressable device DEVICE's allocator (PJRT_Device_MemoryStats): bytes in use now, the peak so far and
  // the limit it may hand out (for the CUDA plugin its memory fraction of the GPU, for libtpu the HBM less
  // what it keeps); each 0 where the plugin reports none (XLA's CPU plugin reports nothing).
  struct DeviceMemory {
    int64_t in_use = 0, peak = 0, limit = 0;
  };
  DeviceMemory device_memory(size_t device = 0) const;
  int64_t device_memory_limit(size_t device = 0) const { return device_memory(device).limit; }

  // Copies a dense row-major host array to device DEVICE (an index into the addressable devices); the host
  // data may be freed when this returns.
  Buffer to_device(const void* data, const TensorType& type, size_t device = 0) const;
  Buffer to_device(std::span<const float> data, std::vector<int64_t> dims, size_t device = 0) const;
  Buffer to_device(std::span<const double> data, std::vector<int64_t> dims, size_t device = 0) const;
  Buffer to_device(std::span<const int32_t> data, std::vector<int64_t> dims, size_t device = 0) const;
  // bf16 as its bit pattern (core/bf16.h).
  Buffer to_device_bf16(std::span<const uint16_t> data, std::vector<int64_t> dims, size_t device = 0) const;

  // Compiles StableHLO (or any MLIR the plugin accepts) given as text.
  Executable compile(std::string_view mlir, const CompileOptions& options = {}) const;

 private:
  explicit Client(std::shared_ptr<ClientState> s) : state_(std::move(s)) {}
  std::shared_ptr<ClientState> state_;
};

// ------------------------------------------------------------------ ahead-of-time compile for a topology
//
// A plugin that can describe devices it does not have (libtpu: any TPU slice, on a machine without a TPU)
// compiles for them with the client-less PJRT_Compile: the program is checked by the real compiler and its
// memory needs are known before a TPU is ever allocated (docs/xla.md "Ahead-of-time compile for a TPU
// topology").

struct TopologyState;  // pjrt_aot.cpp
class AotExecutable;

// A device topology described by a plugin (PJRT_TopologyDescription_Create). Copies and the executables
// compiled for it share the one PJRT topology, destroyed with the last of them.
class Topology {
 public:
  // NAME and OPTIONS are the plugin's: libtpu takes e.g. "v4:2x2x1" with tpu_topology_options("v4:2x2x1").
  static Topology create(std::shared_ptr<const Plugin> plugin, std::string_view name,
                         std::span<const NamedValue> options = {});
  static Topology create(std::string_view plugin_name_or_path, std::string_view name,
                         std::span<const NamedValue> options = {});

  const Plugin& plugin() const;
  const std::string& name() const;
  std::string platform_name() const;              // "tpu", "cpu"
  std::string platform_version() const;           // e.g. libtpu's build
  size_t device_count() const;                    // devices of the whole topology (chips, for a megacore TPU)
  std::vector<std::string> device_kinds() const;  // one per device ("TPU v4")
  // Per device, in the topology's order: its id and the process (host) it is addressable from
  // (PJRT_DeviceDescription_Id / _ProcessIndex; the CUDA plugin's "1x2x8" gives devices 8..15 process 1).
  std::vector<int64_t> device_ids() const;
  std::vector<int64_t> device_processes() const;
  // The topology's attributes and those of its first device, as text (PJRT_TopologyDescription_Attributes,
  // PJRT_DeviceDescription_Attributes); empty where the plugin has none.
  std::map<std::string, std::string> attributes() const;
  std::map<std::string, std::string> device_attributes() const;
  PJRT_TopologyDescription* handle() const;

 private:
  explicit Topology(std::shared_ptr<TopologyState> s) : state_(std::move(s)) {}
  friend AotExecutable compile_for_topology(const Topology&, std::string_view, const CompileOptions&);
  std::shared_ptr<TopologyState> state_;
};

// A program compiled for a topology, not loaded on any device (PJRT_Executable). Move-only.
class AotExecutable {
 public:
  AotExecutable(std::shared_ptr<TopologyState> topology, PJRT_Executable* exe);
  AotExecutable(AotExecutable&& o) noexcept;
  AotExecutable& operator=(AotExecutable&& o) noexcept;
  AotExecutable(const AotExecutable&) = delete;
  AotExecutable& operator=(const AotExecutable&) = delete;
  ~AotExecutable();

  size_t num_outputs() const;
  MemoryStats memory_stats() const;
  CostAnalysis cost_analysis() const;

 private:
  void release() noexcept;
  std::shared_ptr<TopologyState> topology_;
  PJRT_Executable* exe_ = nullptr;
};

// Compiles StableHLO text for TOPOLOGY with PJRT_Compile (no client, no device).
AotExecutable compile_for_topology(const Topology& topology, std::string_view mlir,
                                   const CompileOptions& options = {});

// libtpu's topology create options for a TPU slice written as JAX writes it, GENERATION:XxYxZ ("v4:2x2x1",
// "v4:4x4x8"): what jax.experimental.topologies.get_topology_desc is given for it on a machine without a
// TPU. Only the megacore generation v4 (3-D slices, one device per chip, both TensorCores): chip_config_name
// "megacore", chips_per_host_bounds 2x2x1 (one host's chips), num_slices 1 and wrap 1 on every axis for a
// torus (a slice of 4x4x4 chips or more), else 0. Throws for anything else, naming TOPOLOGY.
std::vector<NamedValue> tpu_topology_options(std::string_view topology);
// Its chip bounds [X, Y, Z] and their product (the slice's devices), refused as above.
std::vector<int64_t> tpu_topology_bounds(std::string_view topology);
int64_t tpu_topology_chips(std::string_view topology);
// libtpu on a machine without a TPU: skip the cloud metadata server (else it retries for over 10 minutes)
// and the single-process lock file (TPU_SKIP_MDS_QUERY, ALLOW_MULTIPLE_LIBTPU_LOAD), where not set already.
void libtpu_deviceless_env();

}  // namespace olmosft::xla
