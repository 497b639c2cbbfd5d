// Plugin loading (dlopen + GetPjrtApi + version check + PJRT_Plugin_Initialize once), errors and events.
#include <dlfcn.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>

#include "xla/pjrt_internal.h"

#ifndef OLMOSFT_XLA_CPU_PLUGIN
#error "OLMOSFT_XLA_CPU_PLUGIN (the CPU plugin's path) is set by cmake/xla.cmake"
#endif

namespace olmosft::xla {

namespace {

std::string error_code_name(PJRT_Error_Code c) {
  static const char* const names[] = {
      "OK",        "CANCELLED",      "UNKNOWN",           "INVALID_ARGUMENT",   "DEADLINE_EXCEEDED",
      "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
      "ABORTED",   "OUT_OF_RANGE",   "UNIMPLEMENTED",     "INTERNAL",           "UNAVAILABLE",
      "DATA_LOSS", "UNAUTHENTICATED"};
  const auto i = static_cast<size_t>(c);
  return i < std::size(names) ? names[i] : "code " + std::to_string(i);
}

// A plugin name's file: $VAR when set (the image sets one per plugin), else where scripts/install-deps.sh
// unpacks it, next to the CPU plugin under deps/xla (SUB: cpu/xla_cpu_pjrt.so, cuda/..., tpu/libtpu.so).
std::string named_plugin(const char* var, const char* sub) {
  const char* p = std::getenv(var);
  if (p != nullptr && *p != '\0') return p;
  if (std::string_view(sub).starts_with("cpu/")) return OLMOSFT_XLA_CPU_PLUGIN;
  return (std::filesystem::path(OLMOSFT_XLA_CPU_PLUGIN).parent_path().parent_path() / sub).string();
}

// What the plugin reports through PJRT_Plugin_Attributes, as text.
std::map<std::string, std::string> read_attributes(const Plugin& plugin) {
  if (plugin.api()->struct_size <= offsetof(PJRT_Api, PJRT_Plugin_Attributes)) return {};
  auto args = OLMO_PJRT_ARGS(PJRT_Plugin_Attributes_Args);
  OLMO_PJRT_CALL(plugin, PJRT_Plugin_Attributes, args);
  return named_values_text(args.attributes, args.num_attributes);
}

// dlopen + GetPjrtApi + version check; the Plugin's constructor calls PJRT_Plugin_Initialize. A refused
// plugin stays mapped (unloading a library whose static initialisers ran is not safe in general); it is
// simply never used.
std::shared_ptr<const Plugin> open_plugin(const std::string& path) {
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    fail("xla: cannot load the PJRT plugin ", path, ": ", why ? why : "dlopen failed");
  }
  using GetApi = const PJRT_Api* (*)();
  auto get_api = reinterpret_cast<GetApi>(dlsym(handle, "GetPjrtApi"));
  OLMO_CHECK(get_api != nullptr, "xla: ", path, " does not export GetPjrtApi: not a PJRT plugin");
  const PJRT_Api* api = get_api();
  OLMO_CHECK(api != nullptr, "xla: GetPjrtApi of ", path, " returned no API table");
  OLMO_CHECK(api->struct_size >= offsetof(PJRT_Api, pjrt_api_version) + sizeof(PJRT_Api_Version),
             "xla: the PJRT plugin ", path, " has an API table of ", api->struct_size,
             " bytes, too short to hold its version");
  const int major = api->pjrt_api_version.major_version, minor = api->pjrt_api_version.minor_version;
  OLMO_CHECK(major == PJRT_API_MAJOR, "xla: the PJRT plugin ", path, " implements PJRT C API ", major, ".",
             minor, " but olmosft was built against API ", PJRT_API_MAJOR, ".", PJRT_API_MINOR,
             " (pjrt_c_api.h from deps/xla): a different major version is not compatible");
  return std::make_shared<Plugin>(path, api, major, minor);
}

}  // namespace

std::map<std::string, std::string> named_values_text(const PJRT_NamedValue* values, size_t n) {
  std::map<std::string, std::string> out;
  for (size_t i = 0; i < n; ++i) {
    const PJRT_NamedValue& v = values[i];
    std::string text;
    switch (v.type) {
      case PJRT_NamedValue_kString:
        text.assign(v.string_value, v.value_size);
        break;
      case PJRT_NamedValue_kInt64:
        text = std::to_string(v.int64_value);
        break;
      case PJRT_NamedValue_kInt64List:
        for (size_t j = 0; j < v.value_size; ++j)
          text += (j ? "." : "") + std::to_string(v.int64_array_value[j]);
        break;
      case PJRT_NamedValue_kFloat:
        text = std::to_string(v.float_value);
        break;
      case PJRT_NamedValue_kBool:
        text = v.bool_value ? "true" : "false";
        break;
    }
    out[std::string(v.name, v.name_size)] = text;
  }
  return out;
}

Plugin::Plugin(std::string path, const PJRT_Api* api, int major, int minor)
    : path_(std::move(path)), api_(api), major_(major), minor_(minor) {
  auto init = OLMO_PJRT_ARGS(PJRT_Plugin_Initialize_Args);
  OLMO_PJRT_CALL(*this, PJRT_Plugin_Initialize, init);
  attributes_ = read_attributes(*this);
}

int Plugin::header_major() { return PJRT_API_MAJOR; }
int Plugin::header_minor() { return PJRT_API_MINOR; }

std::string Plugin::resolve(std::string_view name) {
  if (name == "cpu") return named_plugin("OLMOSFT_PJRT_CPU", "cpu/xla_cpu_pjrt.so");
  // XLA's CUDA plugin (xla_cuda_plugin.so of the jax-cuda13-pjrt wheel): install-deps.sh --cuda, or a JAX
  // install's; libtpu: a TPU VM's own, or install-deps.sh --tpu's (ahead-of-time compiles on this machine).
  if (name == "cuda") return named_plugin("OLMOSFT_PJRT_CUDA", "cuda/xla_cuda_plugin.so");
  if (name == "tpu") return named_plugin("OLMOSFT_PJRT_TPU", "tpu/libtpu.so");
  OLMO_CHECK(name.find('/') != std::string_view::npos || name.ends_with(".so"), "xla: unknown PJRT plugin `",
             name, "`: expected cpu, cuda, tpu or the path of a plugin (.so)");
  return std::string(name);
}

std::shared_ptr<const Plugin> Plugin::load(std::string_view name_or_path) {
  const std::string path = resolve(name_or_path);
  std::error_code ec;
  OLMO_CHECK(std::filesystem::is_regular_file(path, ec), "xla: PJRT plugin ", path, " not found",
             path == name_or_path ? "" : " (`" + std::string(name_or_path) + "`)",
             name_or_path == "cpu"    ? "; run scripts/install-deps.sh or set OLMOSFT_PJRT_CPU"
             : name_or_path == "cuda" ? "; run scripts/install-deps.sh --cuda or set OLMOSFT_PJRT_CUDA"
             : name_or_path == "tpu"  ? "; run scripts/install-deps.sh --tpu or set OLMOSFT_PJRT_TPU"
                                      : "");
  const std::string key = std::filesystem::canonical(path, ec).string();
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<const Plugin>> loaded;  // never unloaded
  std::lock_guard lock(mu);
  auto it = loaded.find(key);
  if (it != loaded.end()) return it->second;
  auto plugin = open_plugin(path);
  loaded.emplace(key, plugin);
  return plugin;
}

void check(const Plugin& plugin, PJRT_Error* err, std::string_view call) {
  if (err == nullptr) return;
  const PJRT_Api* api = plugin.api();
  auto msg = OLMO_PJRT_ARGS(PJRT_Error_Message_Args);
  msg.error = err;
  api->PJRT_Error_Message(&msg);
  std::string text(msg.message, msg.message_size);
  auto code = OLMO_PJRT_ARGS(PJRT_Error_GetCode_Args);
  code.error = err;
  PJRT_Error* code_err = api->PJRT_Error_GetCode(&code);
  const std::string code_name = code_err ? "UNKNOWN" : error_code_name(code.code);
  auto destroy = OLMO_PJRT_ARGS(PJRT_Error_Destroy_Args);
  for (PJRT_Error* e : {code_err, err}) {
    if (e == nullptr) continue;
    destroy.error = e;
    api->PJRT_Error_Destroy(&destroy);
  }
  fail("xla: ", call, " failed (PJRT plugin ", plugin.path(), "): ", code_name, ": ", text);
}

Event::~Event() {
  if (event_ == nullptr) return;
  auto args = OLMO_PJRT_ARGS(PJRT_Event_Destroy_Args);
  args.event = event_;
  PJRT_Error* err = plugin_.api()->PJRT_Event_Destroy(&args);
  if (err != nullptr) {
    auto d = OLMO_PJRT_ARGS(PJRT_Error_Destroy_Args);
    d.error = err;
    plugin_.api()->PJRT_Error_Destroy(&d);
  }
}

void Event::await(std::string_view call) {
  if (event_ == nullptr) return;
  auto args = OLMO_PJRT_ARGS(PJRT_Event_Await_Args);
  args.event = event_;
  check(plugin_, api_function(plugin_, &PJRT_Api::PJRT_Event_Await, "PJRT_Event_Await")(&args),
        std::string(call) + " (awaiting its event)");
}

PJRT_Buffer_Type to_pjrt(ElementType t) {
  switch (t) {
    case ElementType::kPred:
      return PJRT_Buffer_Type_PRED;
    case ElementType::kS32:
      return PJRT_Buffer_Type_S32;
    case ElementType::kS64:
      return PJRT_Buffer_Type_S64;
    case ElementType::kBF16:
      return PJRT_Buffer_Type_BF16;
    case ElementType::kF32:
      return PJRT_Buffer_Type_F32;
    case ElementType::kF64:
      return PJRT_Buffer_Type_F64;
    case ElementType::kU8:
      return PJRT_Buffer_Type_U8;
  }
  fail("xla: unknown element type ", int(t));
}

ElementType from_pjrt(PJRT_Buffer_Type t, std::string_view context) {
  switch (t) {
    case PJRT_Buffer_Type_PRED:
      return ElementType::kPred;
    case PJRT_Buffer_Type_S32:
      return ElementType::kS32;
    case PJRT_Buffer_Type_S64:
      return ElementType::kS64;
    case PJRT_Buffer_Type_BF16:
      return ElementType::kBF16;
    case PJRT_Buffer_Type_F32:
      return ElementType::kF32;
    case PJRT_Buffer_Type_F64:
      return ElementType::kF64;
    case PJRT_Buffer_Type_U8:
      return ElementType::kU8;
    default:
      break;
  }
  fail("xla: ", context, ": PJRT element type ", int(t),
       " is not one olmosft handles (pred, s32, s64, bf16, f32, f64)");
}

}  // namespace olmosft::xla
