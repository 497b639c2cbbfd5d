// Multi-process tests re-launch their own test binary under mpirun (several ranks on this machine), running
// one worker test that skips unless its environment variable is set. Shared by the dist*_test files.
#pragma once
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace olmosft::mpitest {

struct MpiRun {
  int rc = -1;
  double seconds = 0;
  std::string log;  // the job's stdout and stderr
};

// `env` (VAR='value' ... assignments, may be empty) mpirun -np N <this test binary> --gtest_filter=<worker>,
// one thread per rank, killed after `limit` seconds; the output goes to a log in `scratch`.
inline MpiRun mpirun_worker(int np, const std::string& env, const std::string& worker,
                            const std::filesystem::path& scratch, int limit) {
  const std::string log =
      (scratch / ("mpirun-" + std::to_string(np) + "-" + std::to_string(::getpid()) + ".log")).string();
  const std::string cmd =
      env + " OMP_NUM_THREADS=1 OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none " +
      "OMPI_MCA_rmaps_base_oversubscribe=1 timeout -s KILL " + std::to_string(limit) +
      " mpirun --oversubscribe --allow-run-as-root -np " + std::to_string(np) + " " +
      std::filesystem::read_symlink("/proc/self/exe").string() + " --gtest_filter=" + worker + " > " + log +
      " 2>&1";
  const auto t0 = std::chrono::steady_clock::now();
  const int st = std::system(cmd.c_str());
  MpiRun r;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  std::ifstream f(log);
  r.log.assign(std::istreambuf_iterator<char>(f), {});
  return r;
}

inline std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream f(path);
  std::vector<std::string> v;
  for (std::string l; std::getline(f, l);) v.push_back(l);
  return v;
}

}  // namespace olmosft::mpitest
