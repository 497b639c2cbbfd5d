// A test's own temporary directory (docs/testing.md: every test writes under its own directory in the run's
// TMPDIR and removes it). `ScratchDir d("tag")` creates $TEST_TMPDIR/tag_<pid>_<random> (GoogleTest's
// TempDir) and removes it, with everything in it, when `d` goes out of scope; as a function-local static it
// lives until the process exits and is removed then.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <system_error>

#include "io/atomic_file.h"

namespace olmosft::testutil {

class ScratchDir {
 public:
  explicit ScratchDir(const std::string& tag)
      : path_((std::filesystem::path(testing::TempDir()) /
               (tag + "_" + std::to_string(::getpid()) + "_" + io::random_suffix()))
                  .string()) {
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace olmosft::testutil
