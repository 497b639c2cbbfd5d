// TensorBoard's own reader against our event writer. tests/golden/io/tb_trainer/ holds
//   metrics.jsonl           rows `olmosft train` wrote: olmo3_tiny, 3 steps, and olmo3moe_tiny, 2 steps with
//                           moe.buffer_factor=1.0 (so the per-layer drop counts are non-zero),
//   events.out.tfevents.*   the file TensorBoardWriter + train::tensorboard_scalars (the trainer's path)
//                           write for those rows with a fixed clock (wall_time = 1700000000 + 0.5 * index),
//   accumulator.json        what tensorboard 2.21.0's EventAccumulator (size_guidance SCALARS: 0) read from
//                           that file (tests/reference/tb_upstream.py, deps/venv-reference).
// (a) regenerates the event file and requires it byte for byte (so accumulator.json describes what the
//     writer produces today); (b) requires EventAccumulator's tags, steps, wall times and values to equal the
//     metrics.jsonl rows, through a tag -> key table written here (not the trainer's function).
// Regenerate the event file: OLMOSFT_WRITE_TB_FIXTURE=1 build/io_tb_upstream_test, then
// deps/venv-reference/bin/python tests/reference/tb_upstream.py (scripts/make-fixtures.sh does both).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "io/tensorboard.h"
#include "train/metrics.h"

namespace fs = std::filesystem;
using nlohmann::json;
using namespace olmosft;

namespace {

const std::string kDir = std::string(OLMOSFT_GOLDEN_DIR) + "/io/tb_trainer/";
const std::string kEventFile = "events.out.tfevents.1700000000.olmosft-fixture";
constexpr double kWall0 = 1700000000.0, kWallStep = 0.5;

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot open " + path);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::vector<json> metrics_rows() {
  std::vector<json> rows;
  std::istringstream is(slurp(kDir + "metrics.jsonl"));
  std::string line;
  while (std::getline(is, line))
    if (!line.empty()) rows.push_back(json::parse(line));
  return rows;
}

// The event file the trainer's path writes for the fixture rows, with the fixed clock.
std::string write_events(const std::string& logdir) {
  int64_t n = 0;
  io::TensorBoardWriter w(logdir, [&n] { return kWall0 + kWallStep * static_cast<double>(n++); });
  for (const json& row : metrics_rows())
    w.add_scalars(row.at("step").get<int64_t>(), train::tensorboard_scalars(row));
  w.close();
  return slurp(w.path());
}

}  // namespace

TEST(TensorBoardUpstream, WriterRegeneratesFixtureByteForByte) {
  const fs::path tmp = fs::temp_directory_path() / ("olmosft_tb_upstream_" + std::to_string(::getpid()));
  fs::remove_all(tmp);
  const std::string bytes = write_events(tmp.string());
  fs::remove_all(tmp);
  if (std::getenv("OLMOSFT_WRITE_TB_FIXTURE")) {
    std::ofstream(kDir + kEventFile, std::ios::binary) << bytes;
    std::printf("wrote %s%s (%zu bytes)\n", kDir.c_str(), kEventFile.c_str(), bytes.size());
  }
  const std::string golden = slurp(kDir + kEventFile);
  ASSERT_EQ(bytes.size(), golden.size());
  const auto diff = std::mismatch(bytes.begin(), bytes.end(), golden.begin());
  EXPECT_TRUE(diff.first == bytes.end()) << "first differing byte at offset " << (diff.first - bytes.begin());
}

TEST(TensorBoardUpstream, EventAccumulatorReadsMetricsJsonl) {
  const json acc = json::parse(slurp(kDir + "accumulator.json"));
  ASSERT_EQ(acc.at("tensorboard").get<std::string>(), "2.21.0");
  ASSERT_EQ(acc.at("event_file").get<std::string>(), kEventFile);
  // tag -> metrics.jsonl key (the trainer's contract, restated independently of train::tensorboard_scalars).
  const std::vector<std::pair<std::string, std::string>> direct = {{"train/loss", "loss"},
                                                                   {"train/ce", "ce"},
                                                                   {"train/lm_z", "lm_z"},
                                                                   {"train/moe_lb", "moe_lb"},
                                                                   {"train/router_z", "router_z"},
                                                                   {"train/grad_norm", "grad_norm"},
                                                                   {"train/lr", "lr"},
                                                                   {"train/tokens", "tokens"},
                                                                   {"perf/tokens_per_s", "tokens_per_s"},
                                                                   {"perf/step_time", "step_time"},
                                                                   {"perf/mfu", "mfu"}};
  // Expected (wall_time, step, value) per tag. Event 0 is the file_version event; row i is event i + 1.
  std::map<std::string, std::vector<std::tuple<double, int64_t, double>>> want;
  const std::vector<json> rows = metrics_rows();
  bool saw_moe = false;
  for (size_t i = 0; i < rows.size(); ++i) {
    const json& r = rows[i];
    const double wall = kWall0 + kWallStep * static_cast<double>(i + 1);
    const int64_t step = r.at("step").get<int64_t>();
    for (const auto& [tag, key] : direct)
      want[tag].emplace_back(wall, step, static_cast<double>(static_cast<float>(r.at(key).get<double>())));
    if (!r.at("moe_required_buffer_factor").empty()) {
      saw_moe = true;
      const auto& f = r.at("moe_required_buffer_factor");
      double mx = f.at(0).get<double>(), sum = 0;
      for (const auto& x : f) mx = std::max(mx, x.get<double>());
      for (const auto& x : r.at("moe_dropped_tokens")) sum += x.get<double>();
      want["train/moe_required_buffer_factor_max"].emplace_back(wall, step, double(float(mx)));
      want["train/moe_dropped_tokens"].emplace_back(wall, step, double(float(sum)));
    }
  }
  ASSERT_TRUE(saw_moe) << "the fixture should include MoE rows";
  const json& got = acc.at("scalars");
  std::vector<std::string> got_tags, want_tags;
  for (auto it = got.begin(); it != got.end(); ++it) got_tags.push_back(it.key());
  for (const auto& [tag, v] : want) want_tags.push_back(tag);
  std::sort(got_tags.begin(), got_tags.end());
  ASSERT_EQ(got_tags, want_tags);
  size_t n = 0;
  for (const auto& [tag, events] : want) {
    const json& g = got.at(tag);
    ASSERT_EQ(g.size(), events.size()) << tag;
    for (size_t i = 0; i < events.size(); ++i) {
      const auto& [wall, step, value] = events[i];
      EXPECT_EQ(g[i].at(0).get<double>(), wall) << tag << " #" << i;
      EXPECT_EQ(g[i].at(1).get<int64_t>(), step) << tag << " #" << i;
      EXPECT_EQ(g[i].at(2).get<double>(), value) << tag << " #" << i;  // exact: float32 both ways
      ++n;
    }
  }
  std::printf("EventAccumulator: %zu tags, %zu scalars equal to metrics.jsonl\n", want.size(), n);
}
