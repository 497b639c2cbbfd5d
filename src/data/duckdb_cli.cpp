#include "data/duckdb_cli.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>

#include "core/error.h"
#include "core/signals.h"
#include "io/atomic_file.h"

extern char** environ;

namespace olmosft::duckdb {

namespace {
bool executable(const std::string& p) { return !p.empty() && ::access(p.c_str(), X_OK) == 0; }

std::string on_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  if (!path) return "";
  std::string all = path;
  size_t start = 0;
  while (start <= all.size()) {
    size_t end = all.find(':', start);
    if (end == std::string::npos) end = all.size();
    std::string cand = all.substr(start, end - start) + "/" + name;
    if (end > start && executable(cand)) return cand;
    start = end + 1;
  }
  return "";
}

struct Output {
  int status = -1;
  std::string out, err;
};

// Runs argv with stdin from /dev/null, stdout and stderr captured through temporary files (no pipe deadlock,
// no shell).
Output run(const std::vector<std::string>& argv) {
  namespace fs = std::filesystem;
  std::string dir = (fs::temp_directory_path() / "olmosft-duckdb-XXXXXX").string();
  OLMO_CHECK(::mkdtemp(dir.data()) != nullptr, "cannot create a temporary directory: ", std::strerror(errno));
  struct Cleanup {
    std::string d;
    ~Cleanup() {
      std::error_code ec;
      fs::remove_all(d, ec);
    }
  } cleanup{dir};
  const std::string out_path = dir + "/stdout", err_path = dir + "/stderr";
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_addopen(&fa, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  int rc = 0;
  {
    const StopSignalsUnblocked child_mask;  // the child inherits this thread's mask (core/signals.h)
    rc = ::posix_spawn(&pid, argv[0].c_str(), &fa, nullptr, args.data(), environ);
  }
  posix_spawn_file_actions_destroy(&fa);
  OLMO_CHECK(rc == 0, "cannot run ", argv[0], ": ", std::strerror(rc));
  int st = 0;
  while (::waitpid(pid, &st, 0) < 0) {
    OLMO_CHECK(errno == EINTR, "waiting for ", argv[0], ": ", std::strerror(errno));
  }
  Output o;
  o.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  o.out = io::read_file(out_path);
  o.err = io::read_file(err_path);
  return o;
}

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ' || s.back() == '\r')) s.pop_back();
  return s;
}
}  // namespace

std::string cli_path() {
  if (const char* env = std::getenv("OLMOSFT_DUCKDB"); env && *env) {
    OLMO_CHECK(executable(env), "OLMOSFT_DUCKDB=", env, " is not an executable file");
    return env;
  }
#ifdef OLMOSFT_DUCKDB_CLI
  if (executable(OLMOSFT_DUCKDB_CLI)) return OLMOSFT_DUCKDB_CLI;
#endif
  std::string p = on_path("duckdb");
  OLMO_CHECK(
      !p.empty(),
      "--sql needs the DuckDB command-line binary, and none was found: run scripts/install-deps.sh "
      "(it installs the pinned duckdb-cli wheel into deps/venv), or set OLMOSFT_DUCKDB=/path/to/duckdb");
  return p;
}

std::string cli_version() {
  static std::once_flag once;
  static std::string v;
  std::call_once(once, [] {
    Output o = run({cli_path(), "-version"});
    OLMO_CHECK(o.status == 0, "DuckDB CLI ", cli_path(), " -version failed: ", trim(o.err));
    v = trim(o.out);
    if (size_t sp = v.find(' '); sp != std::string::npos) v = v.substr(0, sp);
  });
  return v;
}

std::vector<std::string> run_sql(const std::string& sql, const std::string& what, int threads) {
  std::string full = "SET threads = " + std::to_string(threads < 1 ? 1 : threads) +
                     "; SET preserve_insertion_order = true; " + sql;
  Output o = run({cli_path(), "-no-init", "-batch", "-bail", "-jsonlines", "-c", full, ":memory:"});
  if (o.status != 0) {
    std::string msg = trim(o.err.empty() ? o.out : o.err);
    fail(what, ": ", msg.empty() ? "DuckDB exited with status " + std::to_string(o.status) : msg);
  }
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < o.out.size()) {
    size_t end = o.out.find('\n', start);
    if (end == std::string::npos) end = o.out.size();
    if (end > start) lines.push_back(o.out.substr(start, end - start));
    start = end + 1;
  }
  return lines;
}

std::string sql_string(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') out += '\'';
    out += c;
  }
  return out + "'";
}

std::string sql_ident(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

}  // namespace olmosft::duckdb
