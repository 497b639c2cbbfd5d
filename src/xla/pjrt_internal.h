// Internal to src/xla: what the runtime's .cpp files share on top of the PJRT C API header (which only they
// include). Not for use outside src/xla.
#pragma once
#include <pjrt_c_api.h>

#include <cstddef>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "xla/pjrt.h"

namespace olmosft::xla {

// Throws an Error for a non-null ERR (then destroyed): "PJRT CALL failed (plugin PATH): CODE: message".
void check(const Plugin& plugin, PJRT_Error* err, std::string_view call);

// The function NAME of PLUGIN's API table, refused if the plugin's table is too short to have it (an older
// minor version) or leaves it empty.
template <typename Fn>
Fn* api_function(const Plugin& plugin, Fn* PJRT_Api::*member, std::string_view name) {
  const PJRT_Api* api = plugin.api();
  const auto offset = static_cast<size_t>(reinterpret_cast<const char*>(&(api->*member)) -
                                          reinterpret_cast<const char*>(api));
  Fn* f = offset + sizeof(Fn*) <= api->struct_size ? api->*member : nullptr;
  OLMO_CHECK(f != nullptr, "xla: the PJRT plugin ", plugin.path(), " (API ", plugin.api_major(), ".",
             plugin.api_minor(), ") does not provide ", name);
  return f;
}

// Zero-initialised argument struct with its struct_size set (the header's size: versioning by struct_size).
template <typename Args>
Args pjrt_args(size_t struct_size) {
  Args a{};
  a.struct_size = struct_size;
  return a;
}
#define OLMO_PJRT_ARGS(T) ::olmosft::xla::pjrt_args<T>(T##_STRUCT_SIZE)

// Calls NAME(&ARGS) through PLUGIN's table and turns an error into an olmosft::Error naming NAME.
#define OLMO_PJRT_CALL(plugin, NAME, args)                                                                 \
  ::olmosft::xla::check((plugin), ::olmosft::xla::api_function((plugin), &PJRT_Api::NAME, #NAME)(&(args)), \
                        #NAME)

// Owns a PJRT_Event; await() blocks until it is ready and throws its error.
class Event {
 public:
  Event(const Plugin& plugin, PJRT_Event* e) : plugin_(plugin), event_(e) {}
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  ~Event();
  // Waits for the event (nothing to do for a null event); CALL names the operation it belongs to.
  void await(std::string_view call);

 private:
  const Plugin& plugin_;
  PJRT_Event* event_;
};

struct ClientState {
  std::shared_ptr<const Plugin> plugin;
  std::shared_ptr<KeyValueStore> kv_store;  // the kv callbacks' store: outlives the client (destroyed first)
  PJRT_Client* client = nullptr;
  std::vector<PJRT_Device*> devices;  // addressable, owned by the client

  ClientState() = default;
  ClientState(const ClientState&) = delete;
  ClientState& operator=(const ClientState&) = delete;
  ~ClientState();
};

// PJRT_NamedValues pointing into VALUES (which must outlive them).
std::vector<PJRT_NamedValue> to_pjrt(std::span<const NamedValue> values);
// Named values a plugin returned (attributes), as text: int64 lists joined by '.', bools as true / false.
std::map<std::string, std::string> named_values_text(const PJRT_NamedValue* values, size_t n);

// PJRT_Executable_GetCompiledMemoryStats of EXE.
MemoryStats compiled_memory_stats(const Plugin& plugin, PJRT_Executable* exe);
// PJRT_Executable_GetCostAnalysis of EXE: its numeric properties (float and int64 values).
CostAnalysis compiled_cost_analysis(const Plugin& plugin, PJRT_Executable* exe);
void destroy_quietly(const Plugin& plugin, PJRT_Error* err);  // for destructors, which cannot throw

PJRT_Buffer_Type to_pjrt(ElementType t);
// Refuses a type olmosft does not handle, naming CONTEXT.
ElementType from_pjrt(PJRT_Buffer_Type t, std::string_view context);

}  // namespace olmosft::xla
