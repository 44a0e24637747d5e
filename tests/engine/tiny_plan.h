// What the memory planner's tests share: the tiny preset's unit sizes by hand, a trained
// role's planner input for the tiny job, and a PPO spec on disk with tiny models.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/spec.h"
#include "engine/memory_plan.h"
#include "engine/trainer.h"
#include "tests/engine/tiny_job.h"
#include "transport/collective_group.h"

namespace rlhf::testing {

using engine::RoleMemoryInput;
using engine::RoleWork;

// The tiny preset (hidden 64, intermediate 176, 2 layers, 4 heads of 16, 2 KV heads,
// vocab 288), by hand:
//   embed  288 x 64                                        = 18432
//   layer  q 64x64 + k 64x32 + v 64x32 + o 64x64 = 12288; MLP 3 x 64 x 176 = 33792;
//          two norms 128                                   = 46208
//   head   norm 64 + lm_head 288 x 64                      = 18496
constexpr int64_t kEmbed = 18432, kLayer = 46208, kHead = 18496;
constexpr int64_t kParams = kEmbed + 2 * kLayer + kHead;  // 129344

inline RoleMemoryInput tiny_trainer(int stage, int world, bool checkpointing) {
  RoleMemoryInput in;
  in.role = "actor";
  in.model = tiny_config(false);
  in.work = RoleWork::kTrain;
  in.group_size = world;
  in.zero_stage = stage;
  in.checkpointing = checkpointing;
  in.micro_batch = kMicroBatchSize;
  in.seq_len = kSeqLen;
  return in;
}

namespace fs = std::filesystem;

// A spec on disk with tiny models: colocated roles share a device budget, an over-budget
// device gets changes that were planned again (and the first one fits).
class MemoryPlanSpec : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("rlhf_memory_plan_spec_" + std::to_string(::getpid()));
    fs::create_directories(dir_ / "tiny");
    std::ofstream(dir_ / "tiny" / "config.json") << tiny_config(false).to_json_text();
  }
  void TearDown() override { fs::remove_all(dir_); }

  JobSpec spec(const std::string& memory_gb, const std::vector<std::string>& extra = {}) {
    const std::string model = (dir_ / "tiny").string();
    std::vector<std::string> sets = {"actor.model=" + model, "critic.model=" + model,
                                     "ref.model=" + model};
    sets.insert(sets.end(), extra.begin(), extra.end());
    std::string text =
        R"({"kind": "ppo", "cluster": {"nodes": [{"name": "local", "kind": "cpu", "devices": 4,
      "memory_gb": )" +
        memory_gb + R"(}]},
      "actor": {"devices": [0], "zero_stage": 2}, "critic": {"devices": [1]},
          "ref": {"colocate_with": "actor"},
      "reward": {"rule": "letters"}, "rollout": {"devices": [2], "batch_size": 8,
          "micro_batch_size": 4,
      "n_samples_per_prompt": 2, "max_new_tokens": 16},
      "data": {"prompt_dataset": "synthetic:letters", "prompt_max_len": 16, "max_len": 32},
      "train": {"batch_size": 16, "micro_batch_size": 8}})";
    return JobSpec::parse(text, "test spec", sets);
  }

  std::map<Role, models::ModelConfig> models(const JobSpec& s) {
    std::vector<std::string> missing;
    auto m = engine::load_role_models(s, missing);
    EXPECT_TRUE(missing.empty());
    return m;
  }

  fs::path dir_;
};

// One BF16 optimizer step of the tiny job on a one-rank Trainer of `model` at ZeRO `stage`
// over a fresh Gloo group at `store`: what the planner's engine terms are checked against.
struct OneRankStep {
  OneRankStep(models::CausalLM& model, int stage, bool tied_embeddings, const std::string& store)
      : model_(model) {
    transport::CollectiveConfig cc;
    cc.store_path = store;
    group = transport::make_collective_group(cc);
    engine::TrainerConfig config = parity_config(stage, torch::kBFloat16, 1);
    config.tied_embeddings = tied_embeddings;
    trainer = std::make_unique<engine::Trainer>(config, model, *group);
    step_peak = trainer
                    ->train_step([&](int64_t i) {
                      return nll_loss(model, micro_batch(0, i, model.config().vocab_size));
                    })
                    .memory.peak;
  }
  // The tracked peak of one forward without grad after the step (the score phase).
  int64_t score_peak() {
    trainer->begin_memory_window();
    torch::NoGradGuard no_grad;
    auto tokens = micro_batch(1, 0, model_.config().vocab_size);
    model_.forward(tokens, torch::ones_like(tokens));
    return trainer->memory_report().window_peak;
  }

  std::unique_ptr<transport::CollectiveGroup> group;
  std::unique_ptr<engine::Trainer> trainer;
  int64_t step_peak = 0;

 private:
  models::CausalLM& model_;
};

}  // namespace rlhf::testing
