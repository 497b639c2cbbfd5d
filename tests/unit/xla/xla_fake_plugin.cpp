// A stand-in PJRT plugin for xla_runtime_test's version checks (built twice by cmake/xla.cmake): it exports
// GetPjrtApi with an API table that has only the plugin functions, and reports either a different major
// version (OLMOSFT_FAKE_PJRT_NEWER_MAJOR) or a newer minor one (OLMOSFT_FAKE_PJRT_NEWER_MINOR).
// For xla_aot_test it also has PJRT_TopologyDescription_Create and _Destroy: a topology named "ok" is created
// (and counted until destroyed: the attribute-free PJRT_Plugin_Attributes cannot report it, so the count is
// the error text of the next create); any other name fails with an error that spells out the named values
// it received (name, PJRT type, value), so the test sees exactly what crossed the C API. It has no
// PJRT_Compile and nothing else of a topology.
#include <pjrt_c_api.h>

#include <string>

struct PJRT_Error {
  std::string message;
};

namespace {

PJRT_Error* initialize(PJRT_Plugin_Initialize_Args*) { return nullptr; }

void error_destroy(PJRT_Error_Destroy_Args* args) { delete args->error; }

void error_message(PJRT_Error_Message_Args* args) {
  args->message = args->error->message.data();
  args->message_size = args->error->message.size();
}

PJRT_Error* error_code(PJRT_Error_GetCode_Args* args) {
  args->code = PJRT_Error_Code_INVALID_ARGUMENT;
  return nullptr;
}

// "topology NAME: name1 string[3] abc; name2 int64 7; name3 int64_list[3] 2,2,1; name4 float 0.5; name5 bool
// true" (struct sizes checked too, as a plugin would).
int live_topologies = 0;
char the_topology;  // what "ok" returns

PJRT_Error* topology_destroy(PJRT_TopologyDescription_Destroy_Args* args) {
  if (args->topology != nullptr) --live_topologies;
  return nullptr;
}

PJRT_Error* topology_create(PJRT_TopologyDescription_Create_Args* args) {
  if (std::string(args->topology_name, args->topology_name_size) == "ok") {
    ++live_topologies;
    args->topology = reinterpret_cast<PJRT_TopologyDescription*>(&the_topology);
    return nullptr;
  }
  std::string m = "live " + std::to_string(live_topologies) + "; topology " +
                  std::string(args->topology_name, args->topology_name_size) + ":";
  for (size_t i = 0; i < args->num_options; ++i) {
    const PJRT_NamedValue& v = args->create_options[i];
    m += (i ? "; " : " ") + std::string(v.name, v.name_size);
    if (v.struct_size != PJRT_NamedValue_STRUCT_SIZE)
      m += " (struct_size " + std::to_string(v.struct_size) + ")";
    switch (v.type) {
      case PJRT_NamedValue_kString:
        m += " string[" + std::to_string(v.value_size) + "] " + std::string(v.string_value, v.value_size);
        break;
      case PJRT_NamedValue_kInt64:
        m += " int64 " + std::to_string(v.int64_value);
        break;
      case PJRT_NamedValue_kInt64List:
        m += " int64_list[" + std::to_string(v.value_size) + "] ";
        for (size_t j = 0; j < v.value_size; ++j)
          m += (j ? "," : "") + std::to_string(v.int64_array_value[j]);
        break;
      case PJRT_NamedValue_kFloat:
        m += " float " + std::to_string(v.float_value);
        break;
      case PJRT_NamedValue_kBool:
        m += std::string(" bool ") + (v.bool_value ? "true" : "false");
        break;
    }
  }
  return new PJRT_Error{m};
}

PJRT_Error* attributes(PJRT_Plugin_Attributes_Args* args) {
  args->attributes = nullptr;
  args->num_attributes = 0;
  return nullptr;
}

PJRT_Api make_api() {
  PJRT_Api api{};
  api.struct_size = PJRT_Api_STRUCT_SIZE;
  api.pjrt_api_version.struct_size = PJRT_Api_Version_STRUCT_SIZE;
#if defined(OLMOSFT_FAKE_PJRT_NEWER_MAJOR)
  api.pjrt_api_version.major_version = PJRT_API_MAJOR + 1;
  api.pjrt_api_version.minor_version = 0;
#else
  api.pjrt_api_version.major_version = PJRT_API_MAJOR;
  api.pjrt_api_version.minor_version = PJRT_API_MINOR + 1;
#endif
  api.PJRT_Plugin_Initialize = initialize;
  api.PJRT_Plugin_Attributes = attributes;
  api.PJRT_Error_Destroy = error_destroy;
  api.PJRT_Error_Message = error_message;
  api.PJRT_Error_GetCode = error_code;
  api.PJRT_TopologyDescription_Create = topology_create;
  api.PJRT_TopologyDescription_Destroy = topology_destroy;
  return api;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) const PJRT_Api* GetPjrtApi() {
  static const PJRT_Api api = make_api();
  return &api;
}
