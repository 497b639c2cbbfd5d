#include "xla/hlo_loops.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "core/error.h"

namespace olmosft::xla {

namespace {

struct Computation {
  std::vector<std::string> lines;
};

// "%name (params) -> type {" or "ENTRY %name ..." opens a computation; "}" alone closes it.
std::map<std::string, Computation> computations(std::string_view hlo) {
  std::map<std::string, Computation> out;
  std::istringstream in{std::string(hlo)};
  std::string line, current;
  static const std::regex head(R"(^(?:ENTRY\s+)?%([^\s(]+)\s.*\{\s*$)");
  for (std::smatch m; std::getline(in, line);) {
    if (current.empty()) {
      if (std::regex_match(line, m, head)) current = m[1];
      continue;
    }
    if (line == "}") {
      current.clear();
      continue;
    }
    out[current].lines.push_back(line);
  }
  return out;
}

// The computations an instruction LINE calls.
std::vector<std::string> callees(const std::string& line) {
  static const std::regex one(R"((?:calls|to_apply|body|condition)=%([^\s,)}]+))");
  static const std::regex many(R"(branch_computations=\{([^}]*)\})");
  std::vector<std::string> out;
  for (auto it = std::sregex_iterator(line.begin(), line.end(), one); it != std::sregex_iterator(); ++it)
    out.push_back((*it)[1]);
  std::smatch m;
  if (std::regex_search(line, m, many)) {
    static const std::regex name(R"(%([^\s,]+))");
    const std::string list = m[1];
    for (auto it = std::sregex_iterator(list.begin(), list.end(), name); it != std::sregex_iterator(); ++it)
      out.push_back((*it)[1]);
  }
  return out;
}

}  // namespace

std::vector<LoopCollective> collectives_in_loops(std::string_view hlo) {
  const std::map<std::string, Computation> comps = computations(hlo);
  static const std::regex loop(R"(^\s*(?:ROOT\s+)?%([^\s=]+)\s*=.*\swhile\(.*\sbody=%([^\s,)}]+))");
  static const std::regex collective(
      R"(\s(all-gather|all-gather-start|all-to-all|collective-permute|collective-permute-start|all-reduce|)"
      R"(all-reduce-start|reduce-scatter)\()");
  static const std::regex op_name(R"re(op_name="([^"]*)")re");
  std::vector<LoopCollective> out;
  std::set<std::pair<std::string, std::string>> seen;  // (loop, computation) visited
  for (const auto& [name, comp] : comps)
    for (const std::string& line : comp.lines) {
      std::smatch w;
      if (!std::regex_search(line, w, loop)) continue;
      const std::string while_name = w[1];
      std::smatch on;
      const std::string loop_name = std::regex_search(line, on, op_name) ? std::string(on[1]) : "";
      std::vector<std::string> todo{w[2]};
      while (!todo.empty()) {
        const std::string c = todo.back();
        todo.pop_back();
        if (!seen.insert({while_name, c}).second) continue;
        const auto it = comps.find(c);
        if (it == comps.end()) continue;
        for (const std::string& l : it->second.lines) {
          std::smatch m;
          if (std::regex_search(l, m, collective)) out.push_back({m[1], c, while_name, loop_name, l});
          for (const std::string& callee : callees(l)) todo.push_back(callee);
        }
      }
    }
  return out;
}

bool unwanted_loop_collective(const LoopCollective& c) {
  return c.loop_name.rfind("olmosft.", 0) == 0 && c.loop_name != kLayerScanLoop;
}

PartitionedDump::PartitionedDump() {
  static int serial = 0;
  const std::filesystem::path d =
      std::filesystem::temp_directory_path() /
      ("olmosft_hlo_dump_" + std::to_string(::getpid()) + "_" + std::to_string(++serial));
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  dir_ = d.string();
}

PartitionedDump::~PartitionedDump() {
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

void PartitionedDump::add_to(CompileOptions& options) const {
  options.env_option_overrides.push_back({"xla_dump_to", dir_});
  options.env_option_overrides.push_back({"xla_dump_hlo_pass_re", "spmd-partitioning"});
}

std::string PartitionedDump::text(const CompileOptions& options) const {
  size_t files = 0;
  // XLA's CPU and GPU compilers: ".after_spmd-partitioning."; libtpu: ".after_tpu-spmd-partitioning."
  static const std::regex after(R"(\.after_[a-z-]*spmd-partitioning\.)");
  for (const auto& f : std::filesystem::directory_iterator(dir_)) {
    ++files;
    const std::string n = f.path().filename().string();
    if (!std::regex_search(n, after) || !n.ends_with(".txt")) continue;
    std::ifstream in(f.path());
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }
  fail("xla: no HLO after SPMD partitioning was dumped (", files,
       " other files; is the program partitioned: num_partitions ", options.num_partitions,
       ", use_spmd_partitioning ", options.use_spmd_partitioning ? "true" : "false", "?)");
}

std::string partitioned_hlo(const Client& client, std::string_view mlir, CompileOptions options) {
  const PartitionedDump dump;
  dump.add_to(options);
  client.compile(mlir, options);
  return dump.text(options);
}

}  // namespace olmosft::xla
