// A stand-in PJRT plugin for xla_runtime_test's version checks (built twice by cmake/xla.cmake): it exports
// GetPjrtApi with an API table that has only the plugin functions, and reports either a different major
// version (OLMOSFT_FAKE_PJRT_NEWER_MAJOR) or a newer minor one (OLMOSFT_FAKE_PJRT_NEWER_MINOR).
#include <pjrt_c_api.h>

namespace {

PJRT_Error* initialize(PJRT_Plugin_Initialize_Args*) { return nullptr; }

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
  return api;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) const PJRT_Api* GetPjrtApi() {
  static const PJRT_Api api = make_api();
  return &api;
}
