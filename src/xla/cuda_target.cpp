#include "xla/cuda_target.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace olmosft::xla {

namespace {

struct Gpu {
  const char* name;
  const char* description;  // XLA's device_description_str
};
constexpr std::array<Gpu, 3> kGpus{
    {{"h100", "NVIDIA H100 80GB HBM3"}, {"h200", "NVIDIA H200 141GB HBM3e"}, {"b200", "NVIDIA B200"}}};

bool parse_positive(std::string_view s, int64_t& out) {
  const char* end = s.data() + s.size();
  auto [p, ec] = std::from_chars(s.data(), end, out);
  return ec == std::errc() && p == end && out >= 1;
}

// The integer after "KEY: " in TEXT's first line that holds it, or -1.
int64_t field(std::string_view text, std::string_view key) {
  const std::string k = std::string(key) + ": ";
  const size_t i = text.find(k);
  if (i == std::string_view::npos) return -1;
  const size_t a = i + k.size(), b = text.find('\n', a);
  int64_t v = -1;
  return parse_positive(text.substr(a, b == std::string_view::npos ? std::string_view::npos : b - a), v) ? v
                                                                                                         : -1;
}

// The plugin file mapped read-only for the search.
class Mapped {
 public:
  explicit Mapped(const std::string& path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    OLMO_CHECK(fd_ >= 0, "xla: cannot open the CUDA plugin ", path, ": ", std::strerror(errno));
    struct stat st {};
    OLMO_CHECK(::fstat(fd_, &st) == 0 && st.st_size > 0, "xla: cannot stat the CUDA plugin ", path);
    size_ = size_t(st.st_size);
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd_, 0);
    OLMO_CHECK(p != MAP_FAILED, "xla: cannot map the CUDA plugin ", path, ": ", std::strerror(errno));
    data_ = static_cast<const char*>(p);
  }
  Mapped(const Mapped&) = delete;
  Mapped& operator=(const Mapped&) = delete;
  ~Mapped() {
    if (data_ != nullptr) ::munmap(const_cast<char*>(data_), size_);
    if (fd_ >= 0) ::close(fd_);
  }
  std::string_view view() const { return {data_, size_}; }

 private:
  int fd_ = -1;
  const char* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace

std::string gpu_names() {
  std::string s;
  for (const Gpu& g : kGpus) s += (s.empty() ? "" : ", ") + std::string(g.name);
  return s;
}

std::string gpu_device_description(std::string_view gpu) {
  for (const Gpu& g : kGpus)
    if (gpu == g.name) return g.description;
  fail("xla: unknown GPU '", gpu, "' (expected one of ", gpu_names(), ")");
}

GpuCluster parse_gpu_cluster(std::string_view spec) {
  const size_t colon = spec.find(':'), x = spec.find('x', colon == std::string_view::npos ? 0 : colon);
  GpuCluster c;
  bool ok = colon != std::string_view::npos && x != std::string_view::npos;
  if (ok) {
    c.gpu = std::string(spec.substr(0, colon));
    ok = !c.gpu.empty() && parse_positive(spec.substr(colon + 1, x - colon - 1), c.hosts) &&
         parse_positive(spec.substr(x + 1), c.gpus_per_host);
  }
  OLMO_CHECK(ok, "GPU cluster '", spec,
             "': expected GPU:HOSTSxGPUS_PER_HOST (e.g. h100:2x8; GPUs: ", gpu_names(), ")");
  gpu_device_description(c.gpu);  // refuses an unknown GPU
  return c;
}

GpuTarget cuda_target(const std::string& plugin_path, std::string_view gpu) {
  GpuTarget t;
  t.description = gpu_device_description(gpu);
  const Mapped m(plugin_path);
  const std::string_view all = m.view();
  const std::string needle = "device_description_str: \"" + t.description + "\"\n";
  const size_t at = all.find(needle);
  OLMO_CHECK(at != std::string_view::npos, "xla: the CUDA plugin ", plugin_path,
             " carries no target spec for ", t.description, " (", gpu,
             "): another XLA build than scripts/install-deps.sh --cuda installs?");
  const size_t nul = all.rfind('\0', at), begin = nul == std::string_view::npos ? 0 : nul + 1;
  const size_t end = all.find('\0', at);
  t.text = std::string(all.substr(begin, (end == std::string_view::npos ? all.size() : end) - begin));
  t.memory_bytes = field(t.text, "device_memory_size");
  t.core_count = field(t.text, "core_count");
  OLMO_CHECK(t.text.find("proto-message: stream_executor.GpuTargetConfigProto") != std::string::npos &&
                 t.text.find("gpu_device_info {") != std::string::npos && t.memory_bytes > 0 &&
                 t.core_count > 0,
             "xla: the CUDA plugin ", plugin_path, "'s spec text for ", t.description,
             " is not a stream_executor.GpuTargetConfigProto with gpu_device_info, device_memory_size and "
             "core_count (its embedded specs changed form; refused rather than guessed)");
  return t;
}

std::string cuda_wheel_root(const std::string& plugin_path) {
  const std::filesystem::path root =
      std::filesystem::path(plugin_path).parent_path().parent_path() / "nvidia" / "cu13";
  std::error_code ec;
  return std::filesystem::is_regular_file(root / "nvvm" / "libdevice" / "libdevice.10.bc", ec) ? root.string()
                                                                                               : "";
}

std::vector<NamedValue> cuda_topology_options(const GpuTarget& target, const GpuCluster& cluster) {
  return {{"target_config", target.text},
          {"topology", "1x" + std::to_string(cluster.hosts) + "x" + std::to_string(cluster.gpus_per_host)}};
}

}  // namespace olmosft::xla
