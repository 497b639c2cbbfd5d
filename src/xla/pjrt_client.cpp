// PJRT client, buffers (host <-> device) and executables (compile, execute with donation).
#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include "xla/pjrt_internal.h"

namespace olmosft::xla {

void destroy_quietly(const Plugin& plugin, PJRT_Error* err) {
  if (err == nullptr) return;
  auto d = OLMO_PJRT_ARGS(PJRT_Error_Destroy_Args);
  d.error = err;
  plugin.api()->PJRT_Error_Destroy(&d);
}

namespace {

void destroy_buffer(const Plugin& plugin, PJRT_Buffer* b) {  // one not (yet) owned by a Buffer
  if (b == nullptr) return;
  auto args = OLMO_PJRT_ARGS(PJRT_Buffer_Destroy_Args);
  args.buffer = b;
  destroy_quietly(plugin, plugin.api()->PJRT_Buffer_Destroy(&args));
}

TensorType buffer_type(const Plugin& plugin, PJRT_Buffer* b) {
  auto et = OLMO_PJRT_ARGS(PJRT_Buffer_ElementType_Args);
  et.buffer = b;
  OLMO_PJRT_CALL(plugin, PJRT_Buffer_ElementType, et);
  auto dims = OLMO_PJRT_ARGS(PJRT_Buffer_Dimensions_Args);
  dims.buffer = b;
  OLMO_PJRT_CALL(plugin, PJRT_Buffer_Dimensions, dims);
  return TensorType{from_pjrt(et.type, "a device buffer"),
                    std::vector<int64_t>(dims.dims, dims.dims + dims.num_dims)};
}

}  // namespace

ClientState::~ClientState() {
  if (client == nullptr) return;
  auto args = OLMO_PJRT_ARGS(PJRT_Client_Destroy_Args);
  args.client = client;
  destroy_quietly(*plugin, plugin->api()->PJRT_Client_Destroy(&args));
}

// ---------------------------------------------------------------------------------------------- Buffer

Buffer::Buffer(std::shared_ptr<ClientState> client, PJRT_Buffer* buffer)
    : client_(std::move(client)), buffer_(buffer) {
  try {
    type_ = buffer_type(*client_->plugin, buffer_);
  } catch (...) {
    release();
    throw;
  }
}

Buffer::Buffer(Buffer&& o) noexcept
    : client_(std::move(o.client_)),
      buffer_(std::exchange(o.buffer_, nullptr)),
      type_(std::move(o.type_)),
      consumed_(o.consumed_) {}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    release();
    client_ = std::move(o.client_);
    buffer_ = std::exchange(o.buffer_, nullptr);
    type_ = std::move(o.type_);
    consumed_ = o.consumed_;
  }
  return *this;
}

Buffer::~Buffer() { release(); }

void Buffer::release() noexcept {
  if (buffer_ != nullptr) destroy_buffer(*client_->plugin, std::exchange(buffer_, nullptr));
}

PJRT_Buffer* Buffer::handle() const {
  OLMO_CHECK(!consumed_, "xla: a buffer ", type_.mlir(), " was donated to an execution and is consumed");
  OLMO_CHECK(buffer_ != nullptr, "xla: use of an empty (moved-from) buffer");
  return buffer_;
}

void Buffer::mark_consumed() {
  release();
  consumed_ = true;
}

void Buffer::check_host_type(size_t host_bytes) const {
  OLMO_CHECK(host_bytes == element_bytes(type_.type), "xla: reading a ", type_.mlir(), " buffer into ",
             host_bytes, "-byte host elements");
}

void Buffer::to_host(void* dst, size_t dst_bytes) const {
  PJRT_Buffer* b = handle();
  OLMO_CHECK(dst_bytes == type_.bytes(), "xla: reading a ", type_.mlir(), " buffer (", type_.bytes(),
             " bytes) into ", dst_bytes, " host bytes");
  const Plugin& plugin = *client_->plugin;
  auto args = OLMO_PJRT_ARGS(PJRT_Buffer_ToHostBuffer_Args);
  args.src = b;
  args.dst = dst;
  args.dst_size = dst_bytes;
  OLMO_PJRT_CALL(plugin, PJRT_Buffer_ToHostBuffer, args);
  Event(plugin, args.event).await("PJRT_Buffer_ToHostBuffer");
}

// ------------------------------------------------------------------------------------------ Executable

Executable::Executable(std::shared_ptr<ClientState> client, PJRT_LoadedExecutable* exe)
    : client_(std::move(client)), exe_(exe) {
  const Plugin& plugin = *client_->plugin;
  try {
    auto get = OLMO_PJRT_ARGS(PJRT_LoadedExecutable_GetExecutable_Args);
    get.loaded_executable = exe_;
    OLMO_PJRT_CALL(plugin, PJRT_LoadedExecutable_GetExecutable, get);
    auto n = OLMO_PJRT_ARGS(PJRT_Executable_NumOutputs_Args);
    n.executable = get.executable;
    PJRT_Error* err =
        api_function(plugin, &PJRT_Api::PJRT_Executable_NumOutputs, "PJRT_Executable_NumOutputs")(&n);
    auto destroy = OLMO_PJRT_ARGS(PJRT_Executable_Destroy_Args);
    destroy.executable = get.executable;
    destroy_quietly(plugin, plugin.api()->PJRT_Executable_Destroy(&destroy));
    check(plugin, err, "PJRT_Executable_NumOutputs");
    num_outputs_ = n.num_outputs;
  } catch (...) {
    release();
    throw;
  }
}

Executable::Executable(Executable&& o) noexcept
    : client_(std::move(o.client_)), exe_(std::exchange(o.exe_, nullptr)), num_outputs_(o.num_outputs_) {}

Executable& Executable::operator=(Executable&& o) noexcept {
  if (this != &o) {
    release();
    client_ = std::move(o.client_);
    exe_ = std::exchange(o.exe_, nullptr);
    num_outputs_ = o.num_outputs_;
  }
  return *this;
}

Executable::~Executable() { release(); }

void Executable::release() noexcept {
  if (exe_ == nullptr) return;
  auto args = OLMO_PJRT_ARGS(PJRT_LoadedExecutable_Destroy_Args);
  args.executable = std::exchange(exe_, nullptr);
  destroy_quietly(*client_->plugin, client_->plugin->api()->PJRT_LoadedExecutable_Destroy(&args));
}

std::vector<Buffer> Executable::execute(std::span<Buffer* const> args, std::span<const size_t> donate) {
  const std::vector<Buffer*> one(args.begin(), args.end());
  return std::move(execute_partitioned(std::span<const std::vector<Buffer*>>(&one, 1), donate)[0]);
}

namespace {

// Takes ownership of every non-null output handle (destroying them all if owning one throws).
std::vector<std::vector<Buffer>> own_outputs(const std::shared_ptr<ClientState>& client,
                                             std::vector<std::vector<PJRT_Buffer*>>& outputs) {
  std::vector<std::vector<Buffer>> result(outputs.size());
  for (size_t d = 0; d < outputs.size(); ++d) {
    for (size_t i = 0; i < outputs[d].size(); ++i) {
      PJRT_Buffer* b = std::exchange(outputs[d][i], nullptr);
      if (b == nullptr) continue;
      try {
        result[d].emplace_back(client, b);
      } catch (...) {
        for (auto& rest : outputs)
          for (PJRT_Buffer* r : rest) destroy_buffer(*client->plugin, r);
        throw;
      }
    }
  }
  return result;
}

}  // namespace

std::vector<std::vector<Buffer>> Executable::execute_partitioned(std::span<const std::vector<Buffer*>> args,
                                                                 std::span<const size_t> donate) {
  OLMO_CHECK(exe_ != nullptr, "xla: execute on an empty (moved-from) executable");
  OLMO_CHECK(!args.empty(), "xla: execute: no device's arguments");
  const Plugin& plugin = *client_->plugin;
  const size_t n = args.front().size();
  std::vector<std::vector<PJRT_Buffer*>> handles(args.size());
  for (size_t d = 0; d < args.size(); ++d) {
    OLMO_CHECK(args[d].size() == n, "xla: execute: device ", d, " has ", args[d].size(),
               " arguments, device 0 ", n);
    for (size_t i = 0; i < n; ++i) {
      const Buffer* a = args[d][i];
      OLMO_CHECK(a != nullptr, "xla: execute: argument ", i, " of device ", d, " is null");
      handles[d].push_back(a->handle());
      OLMO_CHECK(a->client_ == client_, "xla: execute: argument ", i, " (", a->type_.mlir(),
                 ") belongs to another PJRT client than the executable");
    }
  }
  std::vector<int64_t> keep;  // every argument not listed in DONATE
  for (size_t i = 0; i < n; ++i)
    if (std::find(donate.begin(), donate.end(), i) == donate.end()) keep.push_back(static_cast<int64_t>(i));
  for (size_t d : donate) OLMO_CHECK(d < n, "xla: execute: donated argument ", d, " of ", n, " arguments");

  auto options = OLMO_PJRT_ARGS(PJRT_ExecuteOptions);
  options.non_donatable_input_indices = keep.data();
  options.num_non_donatable_input_indices = keep.size();
  std::vector<std::vector<PJRT_Buffer*>> outputs(args.size(),
                                                 std::vector<PJRT_Buffer*>(num_outputs_, nullptr));
  std::vector<PJRT_Buffer* const*> arg_lists;
  std::vector<PJRT_Buffer**> out_lists;
  for (size_t d = 0; d < args.size(); ++d) {
    arg_lists.push_back(handles[d].data());
    out_lists.push_back(outputs[d].data());
  }
  std::vector<PJRT_Event*> done(args.size(), nullptr);
  auto ex = OLMO_PJRT_ARGS(PJRT_LoadedExecutable_Execute_Args);
  ex.executable = exe_;
  ex.options = &options;
  ex.argument_lists = arg_lists.data();
  ex.num_devices = args.size();
  ex.num_args = n;
  ex.output_lists = out_lists.data();
  ex.device_complete_events = done.data();
  OLMO_PJRT_CALL(plugin, PJRT_LoadedExecutable_Execute, ex);
  std::vector<std::unique_ptr<Event>> events;
  for (PJRT_Event* e : done) events.push_back(std::make_unique<Event>(plugin, e));
  std::vector<std::vector<Buffer>> result = own_outputs(client_, outputs);  // owned before anything can throw
  for (auto& e : events) e->await("PJRT_LoadedExecutable_Execute");
  for (size_t d = 0; d < result.size(); ++d)
    OLMO_CHECK(result[d].size() == num_outputs_, "xla: execute returned ", result[d].size(), " of ",
               num_outputs_, " outputs on device ", d);
  for (size_t d = 0; d < args.size(); ++d) {
    for (size_t i : donate) {
      auto del = OLMO_PJRT_ARGS(PJRT_Buffer_IsDeleted_Args);
      del.buffer = handles[d][i];
      OLMO_PJRT_CALL(plugin, PJRT_Buffer_IsDeleted, del);
      if (del.is_deleted) args[d][i]->mark_consumed();
    }
  }
  return result;
}

namespace {
// F(the PJRT_Executable of the loaded EXE), destroyed afterwards whether or not F throws.
template <typename F>
auto with_executable(const Plugin& plugin, PJRT_LoadedExecutable* exe, F f) {
  auto get = OLMO_PJRT_ARGS(PJRT_LoadedExecutable_GetExecutable_Args);
  get.loaded_executable = exe;
  OLMO_PJRT_CALL(plugin, PJRT_LoadedExecutable_GetExecutable, get);
  struct Owned {
    const Plugin& plugin;
    PJRT_Executable* exe;
    ~Owned() {
      auto d = OLMO_PJRT_ARGS(PJRT_Executable_Destroy_Args);
      d.executable = exe;
      destroy_quietly(plugin, plugin.api()->PJRT_Executable_Destroy(&d));
    }
  } owned{plugin, get.executable};
  return f(owned.exe);
}
}  // namespace

MemoryStats Executable::memory_stats() const {
  OLMO_CHECK(exe_ != nullptr, "xla: memory_stats of an empty (moved-from) executable");
  const Plugin& plugin = *client_->plugin;
  return with_executable(plugin, exe_, [&](PJRT_Executable* e) { return compiled_memory_stats(plugin, e); });
}

CostAnalysis Executable::cost_analysis() const {
  OLMO_CHECK(exe_ != nullptr, "xla: cost_analysis of an empty (moved-from) executable");
  const Plugin& plugin = *client_->plugin;
  return with_executable(plugin, exe_, [&](PJRT_Executable* e) { return compiled_cost_analysis(plugin, e); });
}

// ---------------------------------------------------------------------------------------------- Client

namespace {
// PJRT_Client_Create's key-value callbacks over a KeyValueStore (their user_arg). A value handed back is a
// copy the plugin frees with delete_value; a store that throws becomes an UNAVAILABLE error, a get that
// timed out DEADLINE_EXCEEDED and a try-get of a missing key NOT_FOUND (what the plugin expects of it).
PJRT_Error* kv_error(PJRT_CallbackError* make, PJRT_Error_Code code, const std::string& message) {
  return (*make)(code, message.data(), message.size());
}
void delete_value(char* value) { delete[] value; }
template <typename Args>
PJRT_Error* give_value(Args* a, const std::string& v) {
  a->value = new char[v.size() + 1];
  std::memcpy(a->value, v.data(), v.size());
  a->value_size = v.size();
  a->value_deleter_callback = &delete_value;
  return nullptr;
}
PJRT_Error* kv_get(PJRT_KeyValueGetCallback_Args* a) {
  const std::string key(a->key, a->key_size);
  try {
    const auto v =
        static_cast<KeyValueStore*>(a->user_arg)->get(key, std::chrono::milliseconds(a->timeout_in_ms));
    if (!v)
      return kv_error(
          a->callback_error, PJRT_Error_Code_DEADLINE_EXCEEDED,
          "olmosft kv store: key " + key + " was not put within " + std::to_string(a->timeout_in_ms) + " ms");
    return give_value(a, *v);
  } catch (const std::exception& e) {
    return kv_error(a->callback_error, PJRT_Error_Code_UNAVAILABLE, e.what());
  }
}
PJRT_Error* kv_try_get(PJRT_KeyValueTryGetCallback_Args* a) {
  const std::string key(a->key, a->key_size);
  try {
    const auto v = static_cast<KeyValueStore*>(a->user_arg)->try_get(key);
    if (!v) return kv_error(a->callback_error, PJRT_Error_Code_NOT_FOUND, "olmosft kv store: no key " + key);
    return give_value(a, *v);
  } catch (const std::exception& e) {
    return kv_error(a->callback_error, PJRT_Error_Code_UNAVAILABLE, e.what());
  }
}
PJRT_Error* kv_put(PJRT_KeyValuePutCallback_Args* a) {
  try {
    static_cast<KeyValueStore*>(a->user_arg)
        ->put(std::string(a->key, a->key_size), std::string(a->value, a->value_size));
    return nullptr;
  } catch (const std::exception& e) {
    return kv_error(a->callback_error, PJRT_Error_Code_UNAVAILABLE, e.what());
  }
}

// The create options: cpu_device_count, node_id, num_nodes (each when set), then the extra ones.
std::vector<NamedValue> create_values(const ClientOptions& options) {
  std::vector<NamedValue> values;
  if (options.cpu_device_count) {
    OLMO_CHECK(*options.cpu_device_count >= 1, "xla: cpu_device_count must be >= 1, got ",
               *options.cpu_device_count);
    values.push_back({"cpu_device_count", *options.cpu_device_count});
  }
  if (options.num_nodes) {
    OLMO_CHECK(*options.num_nodes >= 1, "xla: num_nodes must be >= 1, got ", *options.num_nodes);
    OLMO_CHECK(*options.num_nodes == 1 || options.kv_store, "xla: a client of ", *options.num_nodes,
               " nodes needs a key-value store (ClientOptions::kv_store) to exchange their topologies");
  }
  if (options.node_id) {
    const int64_t n = options.num_nodes.value_or(1);
    OLMO_CHECK(*options.node_id >= 0 && *options.node_id < n, "xla: node_id ", *options.node_id,
               " is not one of the ", n, " nodes");
    values.push_back({"node_id", *options.node_id});
  }
  if (options.num_nodes) values.push_back({"num_nodes", *options.num_nodes});
  values.insert(values.end(), options.extra.begin(), options.extra.end());
  return values;
}
}  // namespace

Client Client::create(std::shared_ptr<const Plugin> plugin, const ClientOptions& options) {
  auto state = std::make_shared<ClientState>();
  state->plugin = std::move(plugin);
  state->kv_store = options.kv_store;
  const Plugin& p = *state->plugin;
  const std::vector<NamedValue> values = create_values(options);
  const std::vector<PJRT_NamedValue> named = to_pjrt(values);  // names point into VALUES
  auto args = OLMO_PJRT_ARGS(PJRT_Client_Create_Args);
  args.create_options = named.data();
  args.num_options = named.size();
  if (KeyValueStore* kv = state->kv_store.get()) {
    args.kv_get_callback = &kv_get, args.kv_get_user_arg = kv;
    args.kv_try_get_callback = &kv_try_get, args.kv_try_get_user_arg = kv;
    args.kv_put_callback = &kv_put, args.kv_put_user_arg = kv;
  }
  OLMO_PJRT_CALL(p, PJRT_Client_Create, args);
  state->client = args.client;
  auto devs = OLMO_PJRT_ARGS(PJRT_Client_AddressableDevices_Args);
  devs.client = state->client;
  OLMO_PJRT_CALL(p, PJRT_Client_AddressableDevices, devs);
  state->devices.assign(devs.addressable_devices, devs.addressable_devices + devs.num_addressable_devices);
  OLMO_CHECK(!state->devices.empty(), "xla: the PJRT plugin ", p.path(), " has no addressable device");
  return Client(std::move(state));
}

Client Client::create(std::string_view plugin_name_or_path, const ClientOptions& options) {
  return create(Plugin::load(plugin_name_or_path), options);
}

const Plugin& Client::plugin() const { return *state_->plugin; }

std::string Client::platform_name() const {
  auto args = OLMO_PJRT_ARGS(PJRT_Client_PlatformName_Args);
  args.client = state_->client;
  OLMO_PJRT_CALL(*state_->plugin, PJRT_Client_PlatformName, args);
  return std::string(args.platform_name, args.platform_name_size);
}

size_t Client::device_count() const { return state_->devices.size(); }

std::vector<std::string> Client::device_descriptions() const {
  const Plugin& p = *state_->plugin;
  std::vector<std::string> out;
  for (PJRT_Device* d : state_->devices) {
    auto desc = OLMO_PJRT_ARGS(PJRT_Device_GetDescription_Args);
    desc.device = d;
    OLMO_PJRT_CALL(p, PJRT_Device_GetDescription, desc);
    auto s = OLMO_PJRT_ARGS(PJRT_DeviceDescription_DebugString_Args);
    s.device_description = desc.device_description;
    OLMO_PJRT_CALL(p, PJRT_DeviceDescription_DebugString, s);
    out.emplace_back(s.debug_string, s.debug_string_size);
  }
  return out;
}

Client::DeviceMemory Client::device_memory(size_t device) const {
  OLMO_CHECK(device < state_->devices.size(), "xla: device ", device, " out of range: the client has ",
             state_->devices.size(), " addressable devices");
  const Plugin& p = *state_->plugin;
  auto args = OLMO_PJRT_ARGS(PJRT_Device_MemoryStats_Args);
  args.device = state_->devices[device];
  try {
    OLMO_PJRT_CALL(p, PJRT_Device_MemoryStats, args);
  } catch (const Error&) {  // unimplemented (the CPU plugin) or absent from an older API table
    return {};
  }
  return {args.bytes_in_use, args.peak_bytes_in_use_is_set ? args.peak_bytes_in_use : 0,
          args.bytes_limit_is_set ? args.bytes_limit : 0};
}

Buffer Client::to_device(const void* data, const TensorType& type, size_t device) const {
  OLMO_CHECK(device < state_->devices.size(), "xla: device ", device, " out of range: the client has ",
             state_->devices.size(), " addressable devices");
  const Plugin& p = *state_->plugin;
  auto args = OLMO_PJRT_ARGS(PJRT_Client_BufferFromHostBuffer_Args);
  args.client = state_->client;
  args.data = data;
  args.type = to_pjrt(type.type);
  args.dims = type.dims.data();
  args.num_dims = type.dims.size();
  args.host_buffer_semantics = PJRT_HostBufferSemantics_kImmutableUntilTransferCompletes;
  args.device = state_->devices[device];
  OLMO_PJRT_CALL(p, PJRT_Client_BufferFromHostBuffer, args);
  Event done(p, args.done_with_host_buffer);
  try {
    done.await("PJRT_Client_BufferFromHostBuffer");  // DATA may be freed once this returns
  } catch (...) {
    destroy_buffer(p, args.buffer);
    throw;
  }
  return Buffer(state_, args.buffer);
}

namespace {
template <typename T>
TensorType host_type(ElementType et, std::span<const T> data, std::vector<int64_t> dims) {
  TensorType t{et, std::move(dims)};
  OLMO_CHECK(static_cast<size_t>(t.elements()) == data.size(), "xla: to_device: ", data.size(),
             " host elements for shape ", t.mlir());
  return t;
}
}  // namespace

Buffer Client::to_device(std::span<const float> data, std::vector<int64_t> dims, size_t device) const {
  return to_device(data.data(), host_type(ElementType::kF32, data, std::move(dims)), device);
}
Buffer Client::to_device(std::span<const double> data, std::vector<int64_t> dims, size_t device) const {
  return to_device(data.data(), host_type(ElementType::kF64, data, std::move(dims)), device);
}
Buffer Client::to_device(std::span<const int32_t> data, std::vector<int64_t> dims, size_t device) const {
  return to_device(data.data(), host_type(ElementType::kS32, data, std::move(dims)), device);
}
Buffer Client::to_device_bf16(std::span<const uint16_t> data, std::vector<int64_t> dims,
                              size_t device) const {
  return to_device(data.data(), host_type(ElementType::kBF16, data, std::move(dims)), device);
}

Executable Client::compile(std::string_view mlir, const CompileOptions& options) const {
  const Plugin& p = *state_->plugin;
  std::string code(mlir);
  static constexpr char kFormat[] = "mlir";
  auto program = OLMO_PJRT_ARGS(PJRT_Program);
  program.code = code.data();
  program.code_size = code.size();
  program.format = kFormat;
  program.format_size = sizeof(kFormat) - 1;
  const std::string proto = compile_options_proto(options);
  auto args = OLMO_PJRT_ARGS(PJRT_Client_Compile_Args);
  args.client = state_->client;
  args.program = &program;
  args.compile_options = proto.data();
  args.compile_options_size = proto.size();
  OLMO_PJRT_CALL(p, PJRT_Client_Compile, args);
  return Executable(state_, args.executable);
}

}  // namespace olmosft::xla
