// `olmosft forward`: run a model on given token ids and write per-position next-token log-probabilities and
// the mean cross-entropy over the trained targets as JSON, so that any other implementation can be
// compared with this one.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <xtensor/xarray.hpp>
#include <xtensor/xnpy.hpp>

#include "cli/verb.h"
#include "core/error.h"
#include "io/atomic_file.h"
#include "io/json.h"
#include "kernels/attention.h"
#include "model/model.h"
#include "train/batch.h"

namespace {

using olmosft::fail;
using Rows = std::vector<std::vector<int64_t>>;

bool ends_with(const std::string& s, const std::string& suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}

// .npy through xtensor's reader; the element type is found by trying the accepted ones in turn (xtensor
// checks the header's descr against the requested type).
template <typename T>
bool try_npy(const std::string& path, Rows& rows) {
  std::ifstream f(path, std::ios::binary);
  OLMO_CHECK(f, path, ": cannot open");
  xt::xarray<T> a;
  try {
    a = xt::load_npy<T>(f);
  } catch (const std::runtime_error& e) {
    if (std::string(e.what()).find("formats not matching") != std::string::npos) return false;
    fail(path, ": not a valid .npy file (", e.what(), ")");
  }
  if (a.dimension() == 1) {
    rows.emplace_back();
    for (size_t t = 0; t < a.shape()[0]; ++t) rows.back().push_back(int64_t(a(t)));
  } else if (a.dimension() == 2) {
    for (size_t b = 0; b < a.shape()[0]; ++b) {
      rows.emplace_back();
      for (size_t t = 0; t < a.shape()[1]; ++t) rows.back().push_back(int64_t(a(b, t)));
    }
  } else {
    fail(path, ": expected a 1-D [T] or 2-D [B, T] array, got ", a.dimension(), " dimensions");
  }
  return true;
}

Rows load_rows(const std::string& path, const char* what) {
  std::error_code ec;
  OLMO_CHECK(std::filesystem::is_regular_file(path, ec), what, " file ", path, " does not exist");
  Rows rows;
  if (ends_with(path, ".npy")) {
    if (!try_npy<int32_t>(path, rows) && !try_npy<int64_t>(path, rows) && !try_npy<uint8_t>(path, rows) &&
        !try_npy<bool>(path, rows)) {
      fail(path, ": unsupported .npy dtype (expected int32, int64, uint8 or bool)");
    }
  } else {
    const nlohmann::json j = olmosft::io::parse_json(olmosft::io::read_file(path), path);
    OLMO_CHECK(j.is_array() && !j.empty(), path,
               ": expected a non-empty JSON array [[ids...], ...] or [ids...]");
    const bool flat = !j[0].is_array();
    nlohmann::json rowsj = flat ? nlohmann::json::array({j}) : j;
    for (size_t b = 0; b < rowsj.size(); ++b) {
      const auto& r = rowsj[b];
      OLMO_CHECK(r.is_array(), path, ": row ", b, " is not an array (mixing numbers and rows?)");
      rows.emplace_back();
      for (size_t t = 0; t < r.size(); ++t) {
        OLMO_CHECK(r[t].is_number_integer(), path, ": row ", b, ", position ", t,
                   ": expected an integer, got ", olmosft::io::json_excerpt(r[t]));
        rows.back().push_back(r[t].get<int64_t>());
      }
    }
  }
  OLMO_CHECK(!rows.empty(), path, ": no rows");
  for (size_t b = 0; b < rows.size(); ++b) OLMO_CHECK(!rows[b].empty(), path, ": row ", b, " is empty");
  return rows;
}

void check_same_shape(const Rows& a, const Rows& b, const std::string& a_name, const std::string& b_name) {
  OLMO_CHECK(a.size() == b.size(), b_name, ": has ", b.size(), " rows, ", a_name, " has ", a.size());
  for (size_t r = 0; r < a.size(); ++r)
    OLMO_CHECK(a[r].size() == b[r].size(), b_name, ": row ", r, " has ", b[r].size(), " entries, ", a_name,
               " has ", a[r].size());
}

int forward_main(int argc, char** argv) {
  CLI::App app{"Run a model on token ids; write next-token log-probabilities and the mean CE as JSON",
               "forward"};
  std::string model_dir, tokens_path, segments_path, trained_path, out_path;
  app.add_option("--model", model_dir, "HF model directory (config.json + safetensors)")->required();
  app.add_option("--tokens", tokens_path,
                 "token ids: JSON [[ids...], ...] or [ids...], or .npy int32/int64 [B, T] or [T]; rows may "
                 "differ in length (JSON)")
      ->required();
  app.add_option("--segments", segments_path,
                 "document id per token, same shape (documents are contiguous runs; default: one per row)");
  app.add_option("--trained", trained_path,
                 "0/1 per token, same shape: 1 = the token is a training target, scored given the tokens "
                 "before it in its document (default: every token after the first of its document)");
  app.add_option("--out", out_path, "output JSON file")->required();
  return olmosft::cli::run_app(app, argc, argv, [&] {
    using namespace olmosft;
    Rows tok = load_rows(tokens_path, "--tokens");
    Rows seg, tr;
    if (!segments_path.empty()) {
      seg = load_rows(segments_path, "--segments");
      check_same_shape(tok, seg, tokens_path, segments_path);
    }
    if (!trained_path.empty()) {
      tr = load_rows(trained_path, "--trained");
      check_same_shape(tok, tr, tokens_path, trained_path);
      for (size_t b = 0; b < tr.size(); ++b)
        for (size_t t = 0; t < tr[b].size(); ++t)
          OLMO_CHECK(tr[b][t] == 0 || tr[b][t] == 1, trained_path, ": row ", b, ", position ", t,
                     ": expected 0 or 1, got ", tr[b][t]);
    }
    auto model = model::load_model(model_dir);
    const int64_t V = model->config().vocab_size;
    const int64_t B = int64_t(tok.size());
    int64_t T = 0;
    for (const auto& r : tok) T = std::max<int64_t>(T, int64_t(r.size()));
    const int64_t N = B * T;
    std::vector<int32_t> ids(size_t(N), 0), sg(size_t(N), -1), ps(size_t(N), 0), tg(size_t(N), -100);
    std::vector<uint8_t> mask(size_t(N), 0);
    for (int64_t b = 0; b < B; ++b) {
      const auto& r = tok[size_t(b)];
      int32_t p = 0;
      for (int64_t t = 0; t < int64_t(r.size()); ++t) {
        const int64_t i = b * T + t;
        OLMO_CHECK(r[size_t(t)] >= 0 && r[size_t(t)] < V, tokens_path, ": row ", b, ", position ", t,
                   ": token id ", r[size_t(t)], " is outside the model's vocabulary [0, ", V, ")");
        ids[size_t(i)] = int32_t(r[size_t(t)]);
        if (!seg.empty()) {
          const int64_t s = seg[size_t(b)][size_t(t)];
          OLMO_CHECK(s >= 0 && s <= INT32_MAX, segments_path, ": row ", b, ", position ", t,
                     ": segment id must be in [0, 2^31), got ", s);
          sg[size_t(i)] = int32_t(s);
        } else {
          sg[size_t(i)] = 0;
        }
        if (t > 0 && sg[size_t(i)] != sg[size_t(i - 1)]) p = 0;
        ps[size_t(i)] = p++;
      }
      try {
        attention_check_segments(sg.data() + b * T, T, b);
      } catch (const Error& e) {
        fail(segments_path, ": each document must be one contiguous run of tokens in its row: ", e.what());
      }
      // Targets: the next token of the same document.
      for (int64_t t = 0; t + 1 < int64_t(r.size()); ++t) {
        const int64_t i = b * T + t;
        if (sg[size_t(i + 1)] != sg[size_t(i)]) continue;
        tg[size_t(i)] = ids[size_t(i + 1)];
        mask[size_t(i)] = tr.empty() ? 1 : uint8_t(tr[size_t(b)][size_t(t + 1)]);
      }
    }
    const model::Batch batch = train::batch_view(B, T, ids, sg, ps, tg, mask);
    std::vector<float> lp(static_cast<size_t>(N));
    model::LossConfig lc;
    auto parts = model->forward(batch, lc, nullptr, lp.data());

    nlohmann::json out;
    out["model"] = model_dir;
    out["model_type"] = model->config().model_type_name;
    out["rows"] = B;
    out["trained_targets"] = parts.tokens;
    out["ce_sum"] = parts.sum[olmosft::model::kLossCe];
    out["mean_ce"] = parts.tokens > 0
                         ? nlohmann::json(parts.sum[olmosft::model::kLossCe] / double(parts.tokens))
                         : nlohmann::json();
    nlohmann::json lps = nlohmann::json::array();
    for (int64_t b = 0; b < B; ++b) {
      nlohmann::json row = nlohmann::json::array();
      for (int64_t t = 0; t < int64_t(tok[size_t(b)].size()); ++t) {
        const int64_t i = b * T + t;
        if (mask[size_t(i)])
          row.push_back(double(lp[size_t(i)]));
        else
          row.push_back(nullptr);
      }
      lps.push_back(std::move(row));
    }
    out["logprobs"] = std::move(lps);
    out["note"] =
        "logprobs[b][t] = log p(token[b][t+1] | tokens of its document up to t), null where that target is "
        "untrained or absent; mean_ce = ce_sum / trained_targets";
    io::write_file_atomic(out_path, out.dump() + "\n");
    std::ostringstream msg;
    msg.precision(10);
    msg << "forward: " << B << " rows, " << parts.tokens << " trained targets, mean CE ";
    if (parts.tokens > 0)
      msg << parts.sum[olmosft::model::kLossCe] / double(parts.tokens);
    else
      msg << "n/a";
    std::cout << msg.str() << " -> " << out_path << "\n";
    return 0;
  });
}

}  // namespace

OLMOSFT_VERB("forward", "run a model on token ids; write next-token log-probs and mean CE as JSON",
             forward_main);
