// The memory planner on LoRA roles (issues 30.6 and 41.1): the frozen base and the adapters'
// states by hand at ZeRO 2 and 3, the planned engine peak against a real LoRA Trainer's
// tracked peak (exact), dropout's saved inputs, LoRA actors, critics and adapter
// directories in specs, and the 70B example's actor with LoRA on fewer GPUs.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <filesystem>

#include "core/spec.h"
#include "engine/memory_plan.h"
#include "engine/trainer.h"
#include "test_paths.h"
#include "tests/engine/tiny_job.h"
#include "tests/engine/tiny_plan.h"
#include "transport/collective_group.h"

namespace fs = std::filesystem;
namespace rt = rlhf::testing;
using namespace rlhf::engine;
using rt::kEmbed;
using rt::kHead;
using rt::kLayer;
using rt::kParams;
using rt::MemoryPlanSpec;
using rt::tiny_trainer;

namespace {

// Issue 30.6: a LoRA actor (rank 8 on all seven linears of the tiny preset) freezes the base
// in the compute dtype (whole on every rank at ZeRO 1/2, sharded at 3) and trains only the
// adapters: per layer
// r (in + out) summed over q 64+64, k 64+32, v 64+32, o 64+64, gate/up 64+176, down 176+64
// = 8 x 1168 = 9344 elements, 18688 in all.
constexpr int64_t kAdapterLayer = 9344, kAdapters = 2 * kAdapterLayer;

RoleMemoryInput tiny_lora(int stage, int world) {
  RoleMemoryInput in = tiny_trainer(stage, world, true);
  in.lora_rank = 8;
  in.lora_targets = {"all-linear"};
  return in;
}

TEST(MemoryPlan, LoraFreezesTheBaseAndTrainsTheAdapters) {
  const auto units = lora_unit_numels(rt::tiny_config(false), 8, {"all-linear"});
  EXPECT_EQ(units, (std::vector<int64_t>{0, kAdapterLayer, kAdapterLayer, 0}));
  EXPECT_EQ(lora_unit_numels(rt::tiny_config(false), 8, {"q_proj", "v_proj"})[1], 8 * (128 + 96));
  // ZeRO-2, one rank, BF16: the base 2 bytes per element; each adapter element 2 (its BF16
  // parameter) + 4 master + 8 AdamW + 4 FP32 gradient = 18 bytes.
  const MemoryTerms two = plan_role(tiny_lora(2, 1));
  EXPECT_EQ(two.weights, 2 * kParams + 2 * kAdapters);
  EXPECT_EQ(two.master + two.optimizer + two.grads, 16 * kAdapters);
  EXPECT_EQ(two.buffers, 4 * (kAdapterLayer + kAdapterLayer)) << "a layer's reduce-scatter";
  EXPECT_EQ(two.engine_peak, 2 * kParams + 18 * kAdapters + 8 * kAdapterLayer);
  EXPECT_LT(two.engine_peak, plan_role(tiny_trainer(2, 1, true)).engine_peak / 4);
  // ZeRO-3 over two ranks (issue 41.1): the base sharded like the adapters, half on each
  // rank. The largest transient: the head (kept for its input's gradient; the frozen
  // embeddings are freed after their forward) beside a layer's base and adapters gathered.
  const MemoryTerms three = plan_role(tiny_lora(3, 2));
  EXPECT_EQ(three.weights, 2 * (kParams / 2));
  EXPECT_EQ(three.master + three.optimizer + three.grads, 16 * (kAdapters / 2));
  EXPECT_EQ(three.gathered, 2 * (kHead + kLayer + kAdapterLayer));
  EXPECT_EQ(three.buffers, 0);
  EXPECT_EQ(three.engine_phases.at("train"), three.engine_peak);
  EXPECT_EQ(three.engine_phases.at("load"), 2 * (kParams / 2) + 16 * (kAdapters / 2));
}

// Issue 41.1: the same for a LoRA trainer (rank 8 on every linear): the frozen base whole in
// the model at stage 1/2, sharded at stage 3 and gathered with its unit (released after the
// embeddings' forward, kept with the head whose input needs a gradient), to the byte.
TEST(MemoryPlan, LoraEnginePeakEqualsTheTrainersTrackedPeak) {
  const fs::path dir =
      fs::temp_directory_path() / ("rlhf_memory_plan_lora_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  torch::set_num_threads(1);
  int n = 0;
  for (int stage : {2, 3}) {
    for (bool checkpointing : {true, false}) {
      for (bool tied : {false, true}) {
        auto model = rt::tiny_lora_model(tied, checkpointing);
        rt::OneRankStep run(*model, stage, tied, (dir / ("store" + std::to_string(n++))).string());
        RoleMemoryInput in = tiny_lora(stage, 1);
        in.checkpointing = checkpointing;
        in.model = rt::tiny_config(tied);
        const MemoryTerms planned = plan_role(in);
        const std::string what = "stage " + std::to_string(stage) +
                                 (checkpointing ? " ckpt" : " no ckpt") + (tied ? " tied" : "");
        EXPECT_EQ(planned.engine_peak, run.step_peak) << what;
        EXPECT_EQ(planned.engine_phases.at("train"), run.step_peak) << what;
        EXPECT_EQ(planned.engine_phases.at("score"), run.score_peak()) << what;
      }
    }
  }
  fs::remove_all(dir);
}

TEST_F(MemoryPlanSpec, PpoLoraActorIsItsOwnReference) {
  const auto plain = spec("4");
  EXPECT_NE(plan_memory(plain, models(plain)).role("ref"), nullptr);
  const auto s = spec("4", {"actor.lora.rank=8"});
  const MemoryPlan plan = plan_memory(s, models(s));
  EXPECT_EQ(plan.role("ref"), nullptr) << "the LoRA actor scores the reference with adapters off";
  const RolePlan* actor = plan.role("actor");
  ASSERT_NE(actor, nullptr);
  EXPECT_EQ(actor->input.lora_rank, 8);
  EXPECT_EQ(actor->terms.master, 4 * kAdapters);
}

// Issue 30.6 (b): with lora.dropout > 0 each adapter keeps its dropped input [B T, in] (e
// bytes) and dropout's own saved tensor (CPU: the scaled noise, e bytes; CUDA: a bool mask)
// for backward: per token and checkpointed layer, the inputs of the seven linears
// (q, k, v, gate, up: H = 64; o: 64; down: I = 176; 560 in all) x (e + e).
TEST(MemoryPlan, LoraDropoutCountsTheInputsItSaves) {
  RoleMemoryInput in = tiny_lora(2, 1);
  const MemoryTerms plain = plan_role(in);
  in.lora_dropout = 0.1;
  const MemoryTerms dropped = plan_role(in);
  const int64_t e = in.compute_bytes, tokens = in.micro_batch * in.seq_len;
  EXPECT_EQ(dropped.activations - plain.activations, tokens * 560 * (e + e));
  in.device_kind = rlhf::DeviceKind::kCuda;
  const MemoryTerms cuda = plan_role(in);
  in.lora_dropout = 0;
  EXPECT_EQ(cuda.activations - plan_role(in).activations, tokens * 560 * (e + 1));
}

// Issue 30.6 (c): a LoRA critic trains the adapters and its value head [1, H] (H = 64): the
// head's states are the only ones beside the adapters'.
TEST_F(MemoryPlanSpec, LoraCriticTrainsTheAdaptersAndTheHead) {
  const auto s = spec("4", {"critic.lora.rank=8"});
  const MemoryPlan plan = plan_memory(s, models(s));
  const RolePlan* critic = plan.role("critic");
  ASSERT_NE(critic, nullptr);
  EXPECT_EQ(critic->input.lora_rank, 8);
  EXPECT_EQ(critic->terms.master, 4 * (kAdapters + 64));
}

// Issue 30.6 (a): with only <role>.lora.adapter the plan takes r, the targets and the dropout
// from the adapter's adapter_config.json, as the trainer does: r = 4 on q and v is
// 2 layers x 4 x ((64 + 64) + (64 + 32)) adapter elements, not a full-weights actor.
TEST_F(MemoryPlanSpec, AnAdapterDirectoryGivesTheLoraTerms) {
  const fs::path adapter = dir_ / "adapter";
  fs::create_directories(adapter);
  std::ofstream(adapter / "adapter_config.json")
      << R"({"peft_type": "LORA", "r": 4, "lora_alpha": 8, "lora_dropout": 0.05,
            "target_modules": ["q_proj", "v_proj"]})";
  const auto s = spec("4", {"actor.lora.adapter=" + adapter.string()});
  const MemoryPlan plan = plan_memory(s, models(s));
  const RolePlan* actor = plan.role("actor");
  ASSERT_NE(actor, nullptr);
  EXPECT_EQ(actor->input.lora_rank, 4);
  EXPECT_EQ(actor->input.lora_targets, (std::vector<std::string>{"q_proj", "v_proj"}));
  EXPECT_EQ(actor->input.lora_dropout, 0.05);
  EXPECT_EQ(actor->terms.master, 4 * (2 * 4 * (128 + 96)));
  EXPECT_EQ(plan.role("ref"), nullptr) << "the adapter's actor is its own reference";
}

// Issue 41.1: examples/ppo_70b.json's actor with rank-16 adapters on every linear. Before,
// each of its 32 GPUs held the BF16 base whole (131.4 GiB, over 80 GiB at any GPU count);
// with the base sharded ZeRO-3 it fits 4 GPUs, where the full fine-tune needs 8 (each with
// adam_offload, as the example), and not 2 (half the base, 65.7 GiB, plus the step).
TEST(MemoryPlan, SeventyBillionLoraActorFitsFewerGpusThanTheFullFineTune) {
  const std::string example = std::string(RLHF_SOURCE_DIR) + "/examples/ppo_70b.json";
  const std::vector<std::string> lora = {"actor.lora.rank=16",
                                         "actor.lora.target_modules=all-linear"};
  auto actor_fits = [&](int gpus, bool with_lora) {
    std::string devices = "actor.devices={\"n0\": [";
    for (int g = 0; g < gpus; ++g) devices += (g ? ", " : "") + std::to_string(g);
    std::vector<std::string> sets = {devices + "]}"};
    if (with_lora) sets.insert(sets.end(), lora.begin(), lora.end());
    const auto s = rlhf::JobSpec::load(example, sets);
    std::vector<std::string> missing;
    const MemoryPlan plan = plan_memory(s, load_role_models(s, missing));
    const RolePlan* actor = plan.role("actor");
    EXPECT_EQ(actor->input.group_size, gpus);
    const auto& d = plan.devices.front();  // n0:0, actor rank 0
    EXPECT_EQ(d.roles.front(), "actor[0]");
    return d.fits();
  };
  EXPECT_FALSE(actor_fits(4, false));
  EXPECT_TRUE(actor_fits(8, false));
  EXPECT_FALSE(actor_fits(2, true));
  EXPECT_TRUE(actor_fits(4, true));
  // The 32-GPU layout: each rank holds 1/32 of the base (padded per unit), not all of it,
  // beside the BF16 copy of its adapter shard (adam_offload keeps the master on the host).
  const auto s = rlhf::JobSpec::load(example, lora);
  std::vector<std::string> missing;
  const auto models = load_role_models(s, missing);
  const MemoryPlan plan = plan_memory(s, models);
  EXPECT_TRUE(plan.fits());
  const RolePlan* actor = plan.role("actor");
  const auto& c = models.at(rlhf::Role::kActor);
  int64_t shards = 0;
  for (int64_t n : unit_numels(c)) shards += (n + 31) / 32;
  for (int64_t n : lora_unit_numels(c, 16, {"all-linear"})) shards += (n + 31) / 32;
  EXPECT_EQ(actor->terms.weights, 2 * shards);
  EXPECT_NEAR(static_cast<double>(actor->terms.weights), 2.0 * c.num_parameters() / 32,
              0.01 * 2.0 * c.num_parameters() / 32);
  EXPECT_LT(actor->terms.device_total(), 25ll << 30);
}

}  // namespace
