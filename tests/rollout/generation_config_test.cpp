// GenerationConfig (rollout/generation_config.h): the engine a job's rollout runs comes from the
// spec's rollout section, defaults included, and travels to a worker as one JSON object whose
// every field is required (issue 40: the worker's own defaults had drifted from the spec's).
#include "rollout/generation_config.h"

#include <gtest/gtest.h>

#include "core/errors.h"
#include "core/spec_schema.h"

namespace rlhf::rollout {
namespace {

using nlohmann::json;

// The spec's defaults give the paged engine (rollout.kv_block_size 16), CUDA graphs where a
// GPU allows (no enforce_eager), FlashInfer's kernels, and an unbounded pool for "auto" on
// the CPU (the driver puts the plan's pool there on a GPU).
TEST(GenerationConfig, TheSpecsDefaultsGiveThePagedEngine) {
  const json rollout = default_spec_json().at("rollout");
  const GenerationConfig c = generation_config_from_rollout_section(rollout);
  EXPECT_EQ(c.kv_block_size, 16);
  EXPECT_EQ(c.kv_block_size, rollout.at("kv_block_size").get<int64_t>());
  EXPECT_EQ(c.max_new_tokens, rollout.at("max_new_tokens").get<int64_t>());
  EXPECT_EQ(c.n_samples_per_prompt, rollout.at("n_samples_per_prompt").get<int64_t>());
  EXPECT_EQ(c.micro_batch_size, rollout.at("micro_batch_size").get<int64_t>());
  EXPECT_EQ(c.decode_steps, DecodeSteps::kAuto);
  EXPECT_TRUE(c.gpu_kernels);
  EXPECT_EQ(c.kv_cache_bytes, 0);
  // A hand-built engine (GenerationConfig{}) is the spec's: its defaults are the key table's
  // (before issue 40, its kv_block_size 0 ran a second, contiguous engine).
  const GenerationConfig bare;
  EXPECT_EQ(to_json(bare), to_json(c));
  json eager = rollout;
  eager["enforce_eager"] = true;
  eager["kv_cache_memory_gb"] = 0.5;
  eager["stop_token_ids"] = {3, 9};
  const GenerationConfig e = generation_config_from_rollout_section(eager);
  EXPECT_EQ(e.decode_steps, DecodeSteps::kEager);
  EXPECT_EQ(e.kv_cache_bytes, int64_t{1} << 29);
  EXPECT_EQ(e.stop_token_ids, (std::vector<int64_t>{3, 9}));
  const SamplingParams p = sampling_from_rollout_section(rollout);
  EXPECT_EQ(p.temperature, rollout.at("temperature").get<double>());
  EXPECT_EQ(p.top_k, rollout.at("top_k").get<int64_t>());
  json missing = rollout;
  missing.erase("kv_block_size");
  EXPECT_THROW(generation_config_from_rollout_section(missing), InputError);
}

// Every field survives the wire; a missing, unknown or mistyped field is an error naming it.
TEST(GenerationConfig, TravelsWholeAndRefusesMissingOrUnknownFields) {
  GenerationConfig c;
  c.max_new_tokens = 7;
  c.n_samples_per_prompt = 3;
  c.micro_batch_size = 5;
  c.kv_cache_bytes = 12345;
  c.kv_block_size = 32;
  c.max_num_seqs = 9;
  c.decode_steps = DecodeSteps::kPadded;
  c.gpu_kernels = false;
  c.stop_token_ids = {2, 4};
  c.pad_token_id = 1;
  c.sync_interval = 4;
  const json j = to_json(c);
  EXPECT_EQ(j.size(), 11u);
  const GenerationConfig back = generation_config_from_json(j, "load_model");
  EXPECT_EQ(to_json(back), j);
  const auto message = [&](const json& bad) -> std::string {
    try {
      generation_config_from_json(bad, "load_model \"generation\"");
    } catch (const std::exception& e) {
      return e.what();
    }
    return "(accepted)";
  };
  json bad = j;
  bad.erase("max_num_seqs");
  EXPECT_EQ(message(bad), "load_model \"generation\": missing field \"max_num_seqs\"");
  bad = j;
  bad["kv_blocks"] = 16;
  EXPECT_EQ(message(bad), "load_model \"generation\": unknown field \"kv_blocks\"");
  bad = j;
  bad["kv_block_size"] = "16";
  EXPECT_NE(message(bad).find("field \"kv_block_size\" has the wrong type"), std::string::npos);
  bad = j;
  bad["decode_steps"] = "graphs";
  EXPECT_NE(message(bad).find("\"decode_steps\" must be auto, eager or padded"), std::string::npos);
  bad = j;
  bad["n_samples_per_prompt"] = 0;  // in range is validate()'s: the key's name
  EXPECT_NE(message(bad).find("rollout.n_samples_per_prompt must be >= 1"), std::string::npos);
}

}  // namespace
}  // namespace rlhf::rollout
