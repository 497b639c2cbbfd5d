// Ahead-of-time compile for a topology (PJRT_TopologyDescription_Create + the client-less PJRT_Compile), the
// compiled memory statistics, typed named values, and libtpu's topology options.
#include <charconv>
#include <cstdlib>
#include <sstream>
#include <utility>

#include "xla/pjrt_internal.h"

namespace olmosft::xla {

struct TopologyState {
  std::shared_ptr<const Plugin> plugin;
  std::string name;
  PJRT_TopologyDescription* topology = nullptr;

  TopologyState() = default;
  TopologyState(const TopologyState&) = delete;
  TopologyState& operator=(const TopologyState&) = delete;
  ~TopologyState() {
    if (topology == nullptr) return;
    auto args = OLMO_PJRT_ARGS(PJRT_TopologyDescription_Destroy_Args);
    args.topology = topology;
    destroy_quietly(*plugin, plugin->api()->PJRT_TopologyDescription_Destroy(&args));
  }
};

// ------------------------------------------------------------------------------------------ named values

std::vector<PJRT_NamedValue> to_pjrt(std::span<const NamedValue> values) {
  std::vector<PJRT_NamedValue> out;
  out.reserve(values.size());
  for (const NamedValue& nv : values) {
    OLMO_CHECK(!nv.name.empty(), "xla: a PJRT option has an empty name");
    auto v = OLMO_PJRT_ARGS(PJRT_NamedValue);
    v.name = nv.name.data();
    v.name_size = nv.name.size();
    v.value_size = 1;  // the number of elements for a list, else 1 (a string: its length)
    if (const auto* s = std::get_if<std::string>(&nv.value)) {
      v.type = PJRT_NamedValue_kString;
      v.string_value = s->c_str();
      v.value_size = s->size();
    } else if (const auto* i = std::get_if<int64_t>(&nv.value)) {
      v.type = PJRT_NamedValue_kInt64;
      v.int64_value = *i;
    } else if (const auto* l = std::get_if<std::vector<int64_t>>(&nv.value)) {
      v.type = PJRT_NamedValue_kInt64List;
      v.int64_array_value = l->data();
      v.value_size = l->size();
    } else if (const auto* f = std::get_if<float>(&nv.value)) {
      v.type = PJRT_NamedValue_kFloat;
      v.float_value = *f;
    } else {
      v.type = PJRT_NamedValue_kBool;
      v.bool_value = std::get<bool>(nv.value);
    }
    out.push_back(v);
  }
  return out;
}

std::string format_named_values(std::span<const NamedValue> values) {
  std::ostringstream os;
  for (size_t i = 0; i < values.size(); ++i) {
    os << (i ? ", " : "") << values[i].name << "=";
    std::visit(
        [&](const auto& x) {
          using T = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<T, std::string>) {
            os << '"' << x << '"';
          } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
            os << "[";
            for (size_t j = 0; j < x.size(); ++j) os << (j ? "," : "") << x[j];
            os << "]";
          } else if constexpr (std::is_same_v<T, bool>) {
            os << (x ? "true" : "false");
          } else {
            os << x;
          }
        },
        values[i].value);
  }
  return os.str();
}

// ------------------------------------------------------------------------------------------ memory stats

MemoryStats compiled_memory_stats(const Plugin& plugin, PJRT_Executable* exe) {
  auto a = OLMO_PJRT_ARGS(PJRT_Executable_GetCompiledMemoryStats_Args);
  a.executable = exe;
  OLMO_PJRT_CALL(plugin, PJRT_Executable_GetCompiledMemoryStats, a);
  MemoryStats m;
  m.argument_bytes = a.argument_size_in_bytes;
  m.output_bytes = a.output_size_in_bytes;
  m.alias_bytes = a.alias_size_in_bytes;
  m.temp_bytes = a.temp_size_in_bytes;
  m.generated_code_bytes = a.generated_code_size_in_bytes;
  m.host_argument_bytes = a.host_argument_size_in_bytes;
  m.host_output_bytes = a.host_output_size_in_bytes;
  m.host_alias_bytes = a.host_alias_size_in_bytes;
  m.host_temp_bytes = a.host_temp_size_in_bytes;
  m.host_generated_code_bytes = a.host_generated_code_size_in_bytes;
  m.peak_bytes = a.peak_memory_in_bytes;
  return m;
}

CostAnalysis compiled_cost_analysis(const Plugin& plugin, PJRT_Executable* exe) {
  auto a = OLMO_PJRT_ARGS(PJRT_Executable_GetCostAnalysis_Args);
  a.executable = exe;
  OLMO_PJRT_CALL(plugin, PJRT_Executable_GetCostAnalysis, a);
  CostAnalysis c;
  for (size_t i = 0; i < a.num_properties; ++i) {
    const PJRT_NamedValue& v = a.properties[i];
    const std::string name(v.name, v.name_size);
    if (v.type == PJRT_NamedValue_kFloat) c[name] = double(v.float_value);
    if (v.type == PJRT_NamedValue_kInt64) c[name] = double(v.int64_value);
  }
  return c;
}

// ---------------------------------------------------------------------------------------------- Topology

Topology Topology::create(std::shared_ptr<const Plugin> plugin, std::string_view name,
                          std::span<const NamedValue> options) {
  auto state = std::make_shared<TopologyState>();
  state->plugin = std::move(plugin);
  state->name = std::string(name);
  const std::vector<PJRT_NamedValue> named = to_pjrt(options);
  auto args = OLMO_PJRT_ARGS(PJRT_TopologyDescription_Create_Args);
  args.topology_name = state->name.data();
  args.topology_name_size = state->name.size();
  args.create_options = named.data();
  args.num_options = named.size();
  OLMO_PJRT_CALL(*state->plugin, PJRT_TopologyDescription_Create, args);
  state->topology = args.topology;
  OLMO_CHECK(state->topology != nullptr, "xla: PJRT_TopologyDescription_Create of ", state->plugin->path(),
             " returned no topology for `", name, "`");
  return Topology(std::move(state));
}

Topology Topology::create(std::string_view plugin_name_or_path, std::string_view name,
                          std::span<const NamedValue> options) {
  return create(Plugin::load(plugin_name_or_path), name, options);
}

const Plugin& Topology::plugin() const { return *state_->plugin; }
const std::string& Topology::name() const { return state_->name; }
PJRT_TopologyDescription* Topology::handle() const { return state_->topology; }

std::string Topology::platform_name() const {
  auto args = OLMO_PJRT_ARGS(PJRT_TopologyDescription_PlatformName_Args);
  args.topology = state_->topology;
  OLMO_PJRT_CALL(plugin(), PJRT_TopologyDescription_PlatformName, args);
  return std::string(args.platform_name, args.platform_name_size);
}

std::string Topology::platform_version() const {
  auto args = OLMO_PJRT_ARGS(PJRT_TopologyDescription_PlatformVersion_Args);
  args.topology = state_->topology;
  OLMO_PJRT_CALL(plugin(), PJRT_TopologyDescription_PlatformVersion, args);
  return std::string(args.platform_version, args.platform_version_size);
}

namespace {
std::span<PJRT_DeviceDescription* const> topology_devices(const Plugin& p, PJRT_TopologyDescription* t) {
  auto args = OLMO_PJRT_ARGS(PJRT_TopologyDescription_GetDeviceDescriptions_Args);
  args.topology = t;
  OLMO_PJRT_CALL(p, PJRT_TopologyDescription_GetDeviceDescriptions, args);
  return {args.descriptions, args.num_descriptions};
}
}  // namespace

size_t Topology::device_count() const { return topology_devices(plugin(), state_->topology).size(); }

std::vector<std::string> Topology::device_kinds() const {
  std::vector<std::string> out;
  for (PJRT_DeviceDescription* d : topology_devices(plugin(), state_->topology)) {
    auto args = OLMO_PJRT_ARGS(PJRT_DeviceDescription_Kind_Args);
    args.device_description = d;
    OLMO_PJRT_CALL(plugin(), PJRT_DeviceDescription_Kind, args);
    out.emplace_back(args.device_kind, args.device_kind_size);
  }
  return out;
}

namespace {
// GET(device) for each device of T, in its order.
template <typename Get>
std::vector<int64_t> per_device(const Plugin& p, PJRT_TopologyDescription* t, Get get) {
  std::vector<int64_t> out;
  for (PJRT_DeviceDescription* d : topology_devices(p, t)) out.push_back(get(d));
  return out;
}
}  // namespace

std::vector<int64_t> Topology::device_ids() const {
  return per_device(plugin(), state_->topology, [&](PJRT_DeviceDescription* d) {
    auto a = OLMO_PJRT_ARGS(PJRT_DeviceDescription_Id_Args);
    a.device_description = d;
    OLMO_PJRT_CALL(plugin(), PJRT_DeviceDescription_Id, a);
    return int64_t(a.id);
  });
}

std::vector<int64_t> Topology::device_processes() const {
  return per_device(plugin(), state_->topology, [&](PJRT_DeviceDescription* d) {
    auto a = OLMO_PJRT_ARGS(PJRT_DeviceDescription_ProcessIndex_Args);
    a.device_description = d;
    OLMO_PJRT_CALL(plugin(), PJRT_DeviceDescription_ProcessIndex, a);
    return int64_t(a.process_index);
  });
}

std::map<std::string, std::string> Topology::attributes() const {
  auto args = OLMO_PJRT_ARGS(PJRT_TopologyDescription_Attributes_Args);
  args.topology = state_->topology;
  OLMO_PJRT_CALL(plugin(), PJRT_TopologyDescription_Attributes, args);
  return named_values_text(args.attributes, args.num_attributes);
}

std::map<std::string, std::string> Topology::device_attributes() const {
  const auto devices = topology_devices(plugin(), state_->topology);
  if (devices.empty()) return {};
  auto args = OLMO_PJRT_ARGS(PJRT_DeviceDescription_Attributes_Args);
  args.device_description = devices[0];
  OLMO_PJRT_CALL(plugin(), PJRT_DeviceDescription_Attributes, args);
  return named_values_text(args.attributes, args.num_attributes);
}

// ----------------------------------------------------------------------------------------- AotExecutable

AotExecutable::AotExecutable(std::shared_ptr<TopologyState> topology, PJRT_Executable* exe)
    : topology_(std::move(topology)), exe_(exe) {}

AotExecutable::AotExecutable(AotExecutable&& o) noexcept
    : topology_(std::move(o.topology_)), exe_(std::exchange(o.exe_, nullptr)) {}

AotExecutable& AotExecutable::operator=(AotExecutable&& o) noexcept {
  if (this != &o) {
    release();
    topology_ = std::move(o.topology_);
    exe_ = std::exchange(o.exe_, nullptr);
  }
  return *this;
}

AotExecutable::~AotExecutable() { release(); }

void AotExecutable::release() noexcept {
  if (exe_ == nullptr) return;
  auto args = OLMO_PJRT_ARGS(PJRT_Executable_Destroy_Args);
  args.executable = std::exchange(exe_, nullptr);
  destroy_quietly(*topology_->plugin, topology_->plugin->api()->PJRT_Executable_Destroy(&args));
}

size_t AotExecutable::num_outputs() const {
  OLMO_CHECK(exe_ != nullptr, "xla: num_outputs of an empty (moved-from) executable");
  auto n = OLMO_PJRT_ARGS(PJRT_Executable_NumOutputs_Args);
  n.executable = exe_;
  OLMO_PJRT_CALL(*topology_->plugin, PJRT_Executable_NumOutputs, n);
  return n.num_outputs;
}

MemoryStats AotExecutable::memory_stats() const {
  OLMO_CHECK(exe_ != nullptr, "xla: memory_stats of an empty (moved-from) executable");
  return compiled_memory_stats(*topology_->plugin, exe_);
}

CostAnalysis AotExecutable::cost_analysis() const {
  OLMO_CHECK(exe_ != nullptr, "xla: cost_analysis of an empty (moved-from) executable");
  return compiled_cost_analysis(*topology_->plugin, exe_);
}

AotExecutable compile_for_topology(const Topology& topology, std::string_view mlir,
                                   const CompileOptions& options) {
  const Plugin& p = topology.plugin();
  std::string code(mlir);
  static constexpr char kFormat[] = "mlir";
  auto program = OLMO_PJRT_ARGS(PJRT_Program);
  program.code = code.data();
  program.code_size = code.size();
  program.format = kFormat;
  program.format_size = sizeof(kFormat) - 1;
  const std::string proto = compile_options_proto(options);
  auto args = OLMO_PJRT_ARGS(PJRT_Compile_Args);
  args.topology = topology.handle();
  args.program = &program;
  args.compile_options = proto.data();
  args.compile_options_size = proto.size();
  args.client = nullptr;  // ahead of time: no device, no client
  OLMO_PJRT_CALL(p, PJRT_Compile, args);
  return AotExecutable(topology.state_, args.executable);
}

// ------------------------------------------------------------------------------------ libtpu's topologies

std::vector<int64_t> tpu_topology_bounds(std::string_view topology) {
  const auto bad = [&](std::string_view why) {
    fail("xla: TPU topology `", topology, "`: ", why, " (expected v4:XxYxZ, e.g. v4:2x2x1)");
  };
  const size_t colon = topology.find(':');
  if (colon == std::string_view::npos) bad("no `:`");
  const std::string_view gen = topology.substr(0, colon);
  if (gen != "v4") bad("generation `" + std::string(gen) + "` is not supported");
  std::vector<int64_t> bounds;
  std::string_view rest = topology.substr(colon + 1);
  while (true) {
    const size_t x = rest.find('x');
    const std::string_view part = rest.substr(0, x);
    int64_t v = 0;
    const auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), v);
    if (part.empty() || ec != std::errc() || end != part.data() + part.size() || v < 1)
      bad("`" + std::string(part) + "` is not a positive chip count");
    bounds.push_back(v);
    if (x == std::string_view::npos) break;
    rest = rest.substr(x + 1);
  }
  if (bounds.size() != 3)
    bad(std::to_string(bounds.size()) + " axes, a " + std::string(gen) + " slice has 3");
  return bounds;
}

int64_t tpu_topology_chips(std::string_view topology) {
  int64_t n = 1;
  for (int64_t b : tpu_topology_bounds(topology)) n *= b;
  return n;
}

std::vector<NamedValue> tpu_topology_options(std::string_view topology) {
  const std::vector<int64_t> bounds = tpu_topology_bounds(topology);
  // A host holds 2x2x1 chips of a v4 / v5p slice. A slice is a torus (wraparound links on every axis) once
  // it spans a whole 4x4x4 cube or more, else a mesh; MaxText's table of slices passes the same.
  const bool torus = bounds[0] >= 4 && bounds[1] >= 4 && bounds[2] >= 4;
  const std::vector<int64_t> per_host = {2, 2, 1}, wrap(3, torus ? 1 : 0);
  return {{"chip_config_name", std::string("megacore")},
          {"chips_per_host_bounds", per_host},
          {"num_slices", int64_t{1}},
          {"wrap", wrap}};
}

void libtpu_deviceless_env() {
  setenv("TPU_SKIP_MDS_QUERY", "1", 0);
  setenv("ALLOW_MULTIPLE_LIBTPU_LOAD", "1", 0);
}

}  // namespace olmosft::xla
