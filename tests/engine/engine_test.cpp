// In-process engine tests (a one-rank Gloo group): schedule and AdamW golden values, the
// no-decay rule, ZeRO-3 gather/free around forward and backward, optimizer offload (for
// good, and to host and back between steps), checkpoint options, rotation and load errors.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/errors.h"
#include "engine/adamw.h"
#include "engine/checkpoint.h"
#include "engine/host_offload.h"
#include "engine/lr_schedule.h"
#include "engine/token_budget.h"
#include "engine/trainer.h"
#include "models/safetensors.h"
#include "tests/engine/tiny_job.h"
#include "transport/collective_group.h"

namespace fs = std::filesystem;
namespace rt = rlhf::testing;
using namespace rlhf::engine;

namespace {

fs::path fresh_dir(const std::string& name) {
  fs::path dir =
      fs::temp_directory_path() / ("rlhf_engine_unit_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::unique_ptr<rlhf::transport::CollectiveGroup> solo_group(const fs::path& dir) {
  rlhf::transport::CollectiveConfig config;
  config.store_path = (dir / ("store" + std::to_string(::rand()))).string();
  return rlhf::transport::make_collective_group(config);
}

std::vector<double> train(Trainer& trainer, rlhf::models::CausalLM& model, int64_t steps,
                          int64_t first = 0) {
  std::vector<double> losses;
  for (int64_t step = first; step < first + steps; ++step) {
    losses.push_back(trainer
                         .train_step([&](int64_t i) {
                           return rt::nll_loss(model,
                                               rt::micro_batch(step, i, model.config().vocab_size));
                         })
                         .loss);
  }
  return losses;
}

}  // namespace

TEST(LrSchedule, MatchesHfDefinitions) {
  TrainerConfig c;
  c.lr = 1.0;
  c.total_steps = 10;
  c.warmup_ratio = 0.2;  // ceil(10 x 0.2) = 2 warmup steps
  struct Row {
    LrScheduler kind;
    std::vector<double> at_0_1_2_6_10;
  };
  // cosine at step 6: progress (6-2)/(10-2) = 0.5 -> 0.1 + 0.9 x 0.5 x (1 + cos(pi/2)) = 0.55
  const std::vector<Row> table = {{LrScheduler::kCosineWithMinLr, {0.0, 0.5, 1.0, 0.55, 0.1}},
                                  {LrScheduler::kConstantWithWarmup, {0.0, 0.5, 1.0, 1.0, 1.0}},
                                  {LrScheduler::kConstant, {1.0, 1.0, 1.0, 1.0, 1.0}}};
  const std::vector<int64_t> steps = {0, 1, 2, 6, 10};
  for (const auto& row : table) {
    c.lr_scheduler = row.kind;
    LrSchedule schedule(c);
    EXPECT_EQ(schedule.warmup_steps(), 2);
    for (size_t i = 0; i < steps.size(); ++i) {
      EXPECT_NEAR(schedule.lr_at(steps[i]), row.at_0_1_2_6_10[i], 1e-12) << "step " << steps[i];
    }
  }
}

TEST(AdamW, FirstStepGoldenValuesWithDecoupledDecay) {
  // p = 1, g = 0.5, lr 0.1, wd 0.1, betas (0.9, 0.95): m = 0.05, v = 0.0125, bias-corrected
  // m/sqrt(v) = (0.05/0.1)/(sqrt(0.0125/0.05)) = 1, so p <- p (1 - 0.01) - 0.1 x 1.
  auto master = torch::ones({2});
  auto m = torch::zeros({2}), v = torch::zeros({2});
  auto grad = torch::full({2}, 0.5f);
  adamw_update(master, m, v, grad, {{0, 1}}, AdamWStep{0.1, 0.9, 0.95, 1e-8, 0.1, 1});
  EXPECT_NEAR(master[0].item<double>(), 0.89, 1e-6);  // decayed
  EXPECT_NEAR(master[1].item<double>(), 0.90, 1e-6);  // outside the decay range
  EXPECT_NEAR(m[0].item<double>(), 0.05, 1e-7);
  EXPECT_NEAR(v[0].item<double>(), 0.0125, 1e-7);
}

TEST(AdamW, NoDecayForBiasesAndNorms) {
  EXPECT_TRUE(takes_weight_decay("model.layers.0.self_attn.q_proj.weight"));
  EXPECT_TRUE(takes_weight_decay("model.embed_tokens.weight"));
  EXPECT_FALSE(takes_weight_decay("model.layers.0.self_attn.q_proj.bias"));
  EXPECT_FALSE(takes_weight_decay("model.layers.0.input_layernorm.weight"));
  EXPECT_FALSE(takes_weight_decay("model.norm.weight"));
}

TEST(TrainerStage3, ParametersLiveOnlyWhileAUnitNeedsThem) {
  torch::set_num_threads(1);
  const fs::path dir = fresh_dir("gather");
  auto group = solo_group(dir);
  auto model = rt::tiny_model(false);
  Trainer trainer(rt::parity_config(3, torch::kBFloat16, 1), *model, *group);
  // Sharded: the model's own parameter tensors are empty between uses.
  EXPECT_EQ(model->embed_tokens->weight.numel(), 0);
  EXPECT_EQ(trainer.memory_report().gathered, 0);
  auto tokens = rt::micro_batch(0, 0, model->config().vocab_size);
  {
    torch::NoGradGuard no_grad;
    rt::nll_loss(*model, tokens);
    EXPECT_EQ(trainer.memory_report().gathered, 0) << "inference must free every unit after use";
  }
  auto loss = rt::nll_loss(*model, tokens);
  // Checkpointed layers were freed after forward; embeddings and head (graph alive) kept.
  const auto& units = trainer.units();
  const int64_t kept = (units.front()->padded_numel() + units.back()->padded_numel()) * 2;  // BF16
  EXPECT_EQ(trainer.memory_report().gathered, kept);
  EXPECT_EQ(model->layers->ptr(0)->parameters()[0].numel(), 0);
  trainer.backward(loss);
  EXPECT_EQ(trainer.memory_report().gathered, 0);
  EXPECT_GT(trainer.memory_report().peak, trainer.memory_report().model_states() + kept - 1);
  for (int i = 1; i < 4; ++i)
    trainer.backward(rt::nll_loss(*model, rt::micro_batch(0, i, model->config().vocab_size)));
  const auto metrics = trainer.step();
  EXPECT_EQ(metrics.step, 1);
  EXPECT_GT(metrics.grad_norm, 0.0);
}

TEST(TrainerOffload, HostOptimizerGivesTheSameLossesOnCpu) {
  torch::set_num_threads(1);
  const fs::path dir = fresh_dir("offload");
  auto group = solo_group(dir);
  std::vector<double> losses[2];
  for (int offload = 0; offload < 2; ++offload) {
    auto model = rt::tiny_model(false);
    auto config = rt::parity_config(3, torch::kFloat, 1);
    config.optimizer_placement = offload ? OptimizerPlacement::kHost : OptimizerPlacement::kDevice;
    Trainer trainer(config, *model, *group);
    losses[offload] = train(trainer, *model, 3);
  }
  EXPECT_EQ(losses[0], losses[1]);  // same code path, same arithmetic: bit-identical
  EXPECT_NE(losses[0][0], losses[0][2]) << "training must change the loss";
}

TEST(HostOffload, RoundTripIsBitExactAndKeepsViewsAndAliases) {
  auto weight = torch::randn({4, 5});
  auto tied = weight;              // the same tensor (tied embeddings)
  auto row = weight.select(0, 2);  // a view into it
  auto half = torch::randn({7}).to(torch::kBFloat16);
  const auto weight_before = weight.clone(), half_before = half.clone();
  HostOffload offload;
  EXPECT_EQ(offload.offload({weight, tied, row, half, torch::Tensor()}),
            4 * 5 * 4 + 7 * 2);  // each storage once
  EXPECT_TRUE(offload.offloaded());
  EXPECT_EQ(offload.bytes(), 4 * 5 * 4 + 7 * 2);
  EXPECT_EQ(weight.storage().nbytes(), 0u) << "the memory must be freed while offloaded";
  EXPECT_EQ(half.storage().nbytes(), 0u);
  EXPECT_THROW(offload.offload({weight}), rlhf::RuntimeError);
  EXPECT_EQ(offload.restore(), 4 * 5 * 4 + 7 * 2);
  EXPECT_FALSE(offload.offloaded());
  EXPECT_EQ(offload.restore(), 0);
  EXPECT_TRUE(torch::equal(weight, weight_before));  // bit for bit
  EXPECT_TRUE(torch::equal(half, half_before));
  EXPECT_EQ(weight.sizes(), (std::vector<int64_t>{4, 5}));
  // The view and the alias still share the restored memory.
  weight[2][3] = 42.0f;
  EXPECT_EQ(row[3].item<float>(), 42.0f);
  EXPECT_EQ(tied[2][3].item<float>(), 42.0f);
  // The host copies were slices of one arena of exactly their bytes, each rounded up to 256
  // (80 -> 256, 14 -> 256), kept for the next offload: a second round trip allocates nothing
  // new and is bit-exact again.
  EXPECT_EQ(offload.arena_bytes(), 256 + 256);
  EXPECT_EQ(offload.offload({half, weight}), 4 * 5 * 4 + 7 * 2);
  EXPECT_EQ(offload.arena_bytes(), 256 + 256);
  offload.restore();
  EXPECT_TRUE(torch::equal(half, half_before));
  EXPECT_EQ(weight[2][3].item<float>(), 42.0f);
}

// The optimizer state to host and back between steps (and offloaded across a checkpoint
// save, which brings it back itself) leaves training bit-identical, at each ZeRO stage.
TEST(TrainerOffload, OptimizerStateToHostBetweenStepsChangesNothing) {
  torch::set_num_threads(1);
  const fs::path dir = fresh_dir("offload_between");
  auto group = solo_group(dir);
  for (int stage : {1, 2, 3}) {
    std::vector<double> losses[2];
    std::vector<torch::Tensor> masters[2];
    for (int offload = 0; offload < 2; ++offload) {
      auto model = rt::tiny_model(false);
      Trainer trainer(rt::parity_config(stage, torch::kFloat, 1), *model, *group);
      losses[offload] = train(trainer, *model, 1);
      if (offload) {
        int64_t expected = 0;
        for (const auto& u : trainer.units())
          expected += (stage == 3 ? 0 : u->master().nbytes()) + u->exp_avg().nbytes() +
                      u->exp_avg_sq().nbytes() + u->grad_buffer().nbytes();
        EXPECT_EQ(trainer.offload_optimizer_state(), expected) << "stage " << stage;
        EXPECT_TRUE(trainer.optimizer_state_offloaded());
        EXPECT_EQ(trainer.units()[0]->exp_avg().storage().nbytes(), 0u);
        EXPECT_EQ(trainer.offload_optimizer_state(), 0) << "already offloaded";
        EXPECT_EQ(trainer.restore_optimizer_state(), expected);
        trainer.offload_optimizer_state();
        trainer.save_checkpoint((dir / ("ckpt" + std::to_string(stage))).string());
        EXPECT_FALSE(trainer.optimizer_state_offloaded()) << "the save restores it";
        trainer.offload_optimizer_state();  // the next step restores it
      }
      auto more = train(trainer, *model, 2, 1);
      losses[offload].insert(losses[offload].end(), more.begin(), more.end());
      for (const auto& u : trainer.units()) masters[offload].push_back(u->master().clone());
    }
    EXPECT_EQ(losses[0], losses[1]) << "stage " << stage;
    for (size_t u = 0; u < masters[0].size(); ++u)
      EXPECT_TRUE(torch::equal(masters[0][u], masters[1][u])) << "stage " << stage << " unit " << u;
  }
}

TEST(TrainerOffload, NothingMovesWhenTheOptimizerLivesOnTheHost) {
  torch::set_num_threads(1);
  const fs::path dir = fresh_dir("offload_host");
  auto group = solo_group(dir);
  auto model = rt::tiny_model(false);
  auto config = rt::parity_config(2, torch::kFloat, 1);
  config.optimizer_placement = OptimizerPlacement::kHost;
  Trainer trainer(config, *model, *group);
  EXPECT_EQ(trainer.offload_optimizer_state(), 0);
  EXPECT_FALSE(trainer.optimizer_state_offloaded());
}

TEST(TrainerCheckpoint, SaveOnlyModelRotationAndLoadErrors) {
  torch::set_num_threads(1);
  const fs::path dir = fresh_dir("ckpt_unit");
  auto group = solo_group(dir);
  auto model = rt::tiny_model(false);
  Trainer trainer(rt::parity_config(2, torch::kFloat, 1), *model, *group);
  CheckpointOptions options;
  options.max_num = 2;
  for (int64_t step = 1; step <= 4; ++step) {
    train(trainer, *model, 1, step - 1);
    options.save_only_model = step == 4;
    trainer.save_checkpoint((dir / "ckpts" / ("global_step" + std::to_string(step))).string(),
                            options);
  }
  std::vector<std::string> kept;
  for (const auto& e : fs::directory_iterator(dir / "ckpts"))
    kept.push_back(e.path().filename().string());
  std::sort(kept.begin(), kept.end());
  EXPECT_EQ(kept, (std::vector<std::string>{"global_step3", "global_step4"}));

  // The model-only checkpoint holds masters but no moments; loading restarts the moments.
  rlhf::models::SafetensorsFile model_only(
      (dir / "ckpts/global_step4/rank_00000.safetensors").string());
  EXPECT_TRUE(model_only.contains("units.0.master"));
  EXPECT_FALSE(model_only.contains("units.0.exp_avg"));
  trainer.load_checkpoint((dir / "ckpts/global_step4").string());
  EXPECT_EQ(trainer.steps_done(), 4);
  EXPECT_EQ(trainer.units()[1]->exp_avg().abs().sum().item<double>(), 0.0);
  trainer.load_checkpoint((dir / "ckpts/global_step3").string());
  EXPECT_EQ(trainer.steps_done(), 3);
  EXPECT_GT(trainer.units()[1]->exp_avg().abs().sum().item<double>(), 0.0);

  // A checkpoint from another world size, and a damaged manifest, are input errors naming the file.
  const fs::path manifest = dir / "ckpts/global_step3" / kManifestName;
  std::string text;
  {
    std::ifstream in(manifest);
    text.assign(std::istreambuf_iterator<char>(in), {});
  }
  const auto at = text.find("\"world_size\": 1");
  ASSERT_NE(at, std::string::npos) << text.substr(0, 200);
  std::ofstream(manifest) << std::string(text).replace(at, 15, "\"world_size\": 2");
  try {
    trainer.load_checkpoint((dir / "ckpts/global_step3").string());
    FAIL() << "loaded a 2-rank checkpoint into 1 rank";
  } catch (const rlhf::InputError& e) {
    EXPECT_NE(std::string(e.what()).find(manifest.string()), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("saved by 2 ranks"), std::string::npos) << e.what();
  }
  std::ofstream(manifest) << "{ not json";
  EXPECT_THROW(trainer.load_checkpoint((dir / "ckpts/global_step3").string()), rlhf::InputError);
  EXPECT_EQ(latest_checkpoint((dir / "ckpts").string()), (dir / "ckpts/global_step4").string());
}

// Frozen parameters (a LoRA base) are never updated: whole in the model at stage 1/2; at
// stage 3 sharded like the rest (the model's tensor empty between uses) and gathered for
// the forward and the export.
TEST(TrainerFrozen, FrozenParametersStayWholeUnchangedAndExported) {
  torch::set_num_threads(1);
  const fs::path dir = fresh_dir("frozen");
  auto group = solo_group(dir);
  {
    auto model = rt::tiny_model(false);
    model->embed_tokens->weight.requires_grad_(false);
    const auto before = model->embed_tokens->weight.detach().clone();
    Trainer trainer(rt::parity_config(2, torch::kFloat, 1), *model, *group);
    train(trainer, *model, 2);
    EXPECT_TRUE(torch::equal(model->embed_tokens->weight, before)) << "stage 2 keeps it whole";
  }
  auto model = rt::tiny_model(false);
  model->embed_tokens->weight.requires_grad_(false);  // unit 0 has no trainable parameter left
  const auto before = model->embed_tokens->weight.detach().clone();
  const auto head_before = model->lm_head->weight.detach().clone();
  Trainer trainer(rt::parity_config(3, torch::kFloat, 1), *model, *group);
  EXPECT_EQ(trainer.units()[0]->numel(), 0);
  EXPECT_EQ(trainer.units()[0]->frozen_numel(), before.numel());
  EXPECT_EQ(model->embed_tokens->weight.numel(), 0) << "stage 3 shards frozen weights too";
  train(trainer, *model, 3);
  EXPECT_EQ(model->embed_tokens->weight.numel(), 0);
  trainer.export_hf((dir / "hf").string(), model->config().to_json_text(), torch::kFloat);
  rlhf::models::SafetensorsFile file((dir / "hf/model.safetensors").string());
  EXPECT_TRUE(torch::equal(file.view("model.embed_tokens.weight"), before));
  EXPECT_FALSE(torch::equal(file.view("lm_head.weight"), head_before))
      << "trainable weights must have moved";
  // The exported config names the weights' precision (transformers 5 and 4.x keys).
  trainer.export_hf((dir / "hf16").string(), model->config().to_json_text(), torch::kBFloat16);
  std::ifstream config_file(dir / "hf16/config.json");
  const auto config = nlohmann::json::parse(config_file);
  EXPECT_EQ(config.at("dtype"), "bfloat16");
  EXPECT_EQ(config.at("torch_dtype"), "bfloat16");
  EXPECT_EQ(rlhf::models::SafetensorsFile((dir / "hf16/model.safetensors").string())
                .view("lm_head.weight")
                .scalar_type(),
            torch::kBFloat16);
}

// Token budgets by hand: 7 rows of 5 padded tokens under 12 tokens are [0, 2), [2, 4),
// [4, 6), [6, 7); padding to what 9 rows need adds one empty range; rows of 3, 4, 6, 2 and 9
// tokens group under 8 tokens as [0, 2) (7), [2, 4) (8), [4, 5) (9 > 8 stands alone).
TEST(TokenBudget, RangesAndGroupsByHand) {
  using R = std::vector<rlhf::engine::RowRange>;
  EXPECT_EQ(rlhf::engine::budget_ranges(7, 5, 12), (R{{0, 2}, {2, 4}, {4, 6}, {6, 7}}));
  EXPECT_EQ(rlhf::engine::budget_ranges(7, 5, 12, 9), (R{{0, 2}, {2, 4}, {4, 6}, {6, 7}, {7, 7}}));
  EXPECT_EQ(rlhf::engine::budget_ranges(7, 5, 0), (R{{0, 7}}));
  EXPECT_EQ(rlhf::engine::budget_ranges(3, 50, 12), (R{{0, 1}, {1, 2}, {2, 3}}))
      << "one row at least";
  auto mask = torch::zeros({5, 9}, torch::kLong);
  int64_t lengths[] = {3, 4, 6, 2, 9};
  for (int64_t b = 0; b < 5; ++b) mask[b].narrow(0, 9 - lengths[b], lengths[b]).fill_(1);
  EXPECT_EQ(rlhf::engine::token_groups(mask, 8), (R{{0, 2}, {2, 4}, {4, 5}}));
}

// Packing by hand: rows "p p a a ." and ". p a a a" (p prompt, a action, . padding; A = 3)
// pack to the 4 + 4 tokens end to end; the action at padded column 2 of row 0 is packed
// position 2, predicted at next-token index 1; row 1's actions are packed positions 5-7.
TEST(TokenBudget, PackedRowsByHand) {
  auto seq = torch::tensor({{10, 11, 12, 13, 0}, {0, 20, 21, 22, 23}}, torch::kLong);
  auto mask = torch::tensor({{1, 1, 1, 1, 0}, {0, 1, 1, 1, 1}}, torch::kLong);
  const auto packed = rlhf::engine::pack_rows(seq, mask, 3);
  EXPECT_TRUE(torch::equal(packed.ids, torch::tensor({{10, 11, 12, 13, 20, 21, 22, 23}})));
  EXPECT_TRUE(torch::equal(packed.segments, torch::tensor({{1, 1, 1, 1, 2, 2, 2, 2}})));
  EXPECT_TRUE(torch::equal(packed.action_index, torch::tensor({{1, 2, 0}, {4, 5, 6}})));
  auto action_mask = torch::tensor({{1, 1, 0}, {1, 1, 1}}, torch::kLong);
  auto results = torch::arange(7, torch::kFloat).unsqueeze(0) * 10;  // [1, L - 1]
  EXPECT_TRUE(torch::equal(rlhf::engine::unpack_actions(results, packed, action_mask),
                           torch::tensor({{10.f, 20.f, 0.f}, {40.f, 50.f, 60.f}})));
}

// The model on packed rows computes each sequence as it does padded: per-action log-probs of
// left- and right-padded rows (FP32) equal the packed ones to 1e-5 (attention over the same
// keys through a different mask and batch shape; measured ~1e-7).
TEST(TokenBudget, PackedForwardEqualsPaddedForward) {
  torch::NoGradGuard no_grad;
  auto model = rt::tiny_model(false, false);
  auto seq = rt::micro_batch(0, 0, model->config().vocab_size);                   // [2, 16]
  seq = torch::cat({seq, rt::micro_batch(0, 1, model->config().vocab_size)}, 0);  // [4, 16]
  auto mask = torch::ones_like(seq);
  mask[0].narrow(0, 0, 5).zero_();   // left padding
  mask[1].narrow(0, 13, 3).zero_();  // right padding after the response
  mask[2].narrow(0, 0, 2).zero_();
  mask[2].narrow(0, 14, 2).zero_();
  const int64_t A = 8;
  auto lp = model->next_token_log_probs(model->forward(seq, mask), seq);
  auto padded = lp.slice(1, lp.size(1) - A, lp.size(1));
  auto action_mask = mask.narrow(1, 16 - A, A);
  const auto packed = rlhf::engine::pack_rows(seq, mask, A);
  auto plp = model->next_token_log_probs(model->forward(packed.ids, packed.segments), packed.ids);
  auto got = rlhf::engine::unpack_actions(plp, packed, action_mask);
  auto want = padded.masked_fill(action_mask == 0, 0);
  EXPECT_LE((got - want).abs().max().item<double>(), 1e-5);
  EXPECT_EQ(packed.ids.size(1), mask.sum().item<int64_t>());
}

// Dynamic loss scaling (issue 41.2, engine/loss_scaler.h): GradScaler's rules by hand.
TEST(LossScaler, BacksOffOnOverflowGrowsAfterTheIntervalAndRoundTrips) {
  rlhf::engine::LossScaleConfig c;
  c.enabled = true;
  c.initial = 1024;
  c.growth_interval = 3;
  c.min_scale = 256;
  rlhf::engine::LossScaler s(c);
  EXPECT_EQ(s.scale(), 1024);
  s.update(false);  // overflow: halved, counted
  EXPECT_EQ(s.scale(), 512);
  EXPECT_EQ(s.skipped_steps(), 1);
  s.update(true);
  s.update(true);
  EXPECT_EQ(s.scale(), 512);  // 2 clean steps of 3
  s.update(true);
  EXPECT_EQ(s.scale(), 1024);  // the third doubles it
  s.update(false);
  s.update(false);
  s.update(false);
  EXPECT_EQ(s.scale(), 256);  // never below min_scale
  EXPECT_EQ(s.skipped_steps(), 4);
  rlhf::engine::LossScaler back(c);
  back.load(s.state());
  EXPECT_EQ(back.scale(), 256);
  EXPECT_EQ(back.skipped_steps(), 4);
  // BF16 and FP32: S = 1 whatever happens.
  rlhf::engine::LossScaler off(rlhf::engine::LossScaleConfig{});
  off.update(false);
  EXPECT_EQ(off.scale(), 1.0);
  EXPECT_EQ(off.skipped_steps(), 0);
}

// FP16 compute on the CPU: a scale so large that the scaled FP16 gradients overflow skips
// the step (weights unchanged) and halves the scale until the gradients fit; the first
// applied step's loss is FP32's on the same weights and batch, the run learns, and a
// checkpoint keeps the scale.
TEST(TrainerFp16, OverflowSkipsAndHalvesThenTrainsAndTheScaleIsCheckpointed) {
  torch::set_num_threads(1);
  const fs::path dir = fresh_dir("fp16");
  auto group = solo_group(dir);
  auto config = rt::parity_config(2, torch::kFloat16, 1);
  config.lr_scheduler = rlhf::engine::LrScheduler::kConstant;
  config.loss_scale.initial = std::ldexp(1.0, 40);  // 2^40 x a loss of ~6: inf in FP16
  auto model = rt::tiny_model(false);
  Trainer trainer(config, *model, *group);
  auto step_on = [&](Trainer& t, rlhf::models::CausalLM& m, int64_t batch) {
    return t.train_step([&](int64_t i) {
      return rt::nll_loss(m, rt::micro_batch(batch, i, m.config().vocab_size));
    });
  };
  const auto before = model->parameters()[0].detach().clone();
  std::vector<rlhf::engine::StepMetrics> steps = {step_on(trainer, *model, 0)};
  ASSERT_TRUE(steps[0].skipped);
  EXPECT_EQ(steps[0].loss_scale, std::ldexp(1.0, 40));
  EXPECT_TRUE(torch::equal(model->parameters()[0].detach(), before)) << "a skipped step moved";
  while (steps.back().skipped && steps.size() < 40) steps.push_back(step_on(trainer, *model, 0));
  // The scale settles where the scaled gradients fit FP16 (max 65504), halved per overflow.
  const int64_t skipped = steps.back().skipped_steps;
  ASSERT_FALSE(steps.back().skipped) << "still overflowing after 40 steps";
  EXPECT_GE(skipped, 10);
  EXPECT_EQ(steps[1].loss_scale, std::ldexp(1.0, 39));
  EXPECT_EQ(steps.back().loss_scale, std::ldexp(1.0, 40 - static_cast<int>(skipped)));
  EXPECT_EQ(trainer.steps_done(), 1);
  // Until then every step saw the initial weights: the applied step's loss is FP32's on the
  // same weights and batch within 1e-3 relative (FP16 keeps 11 significant bits; measured
  // below 2e-4; one step's update moves the loss by ~0.1).
  auto fp32_config = rt::parity_config(2, torch::kFloat, 1);
  fp32_config.lr_scheduler = rlhf::engine::LrScheduler::kConstant;
  auto fp32_model = rt::tiny_model(false);
  Trainer fp32(fp32_config, *fp32_model, *group);
  const double fp32_loss = step_on(fp32, *fp32_model, 0).loss;
  EXPECT_NEAR(steps.back().loss, fp32_loss, 1e-3 * fp32_loss);
  // It learns: 20 more steps over 4 batches bring batch 0's loss down by more than 0.5.
  for (int64_t step = 1; step <= 20; ++step) steps.push_back(step_on(trainer, *model, step % 4));
  EXPECT_LT(steps.back().loss, fp32_loss - 0.5) << fp32_loss << " -> " << steps.back().loss;
  // (Growing gradients may overflow again at a scale found at the edge: each halves it.)
  const int64_t total_skipped = steps.back().skipped_steps;
  EXPECT_LE(total_skipped - skipped, 10);

  trainer.save_checkpoint((dir / "ckpt" / "global_step1").string());
  auto again = rt::tiny_model(false);
  Trainer resumed(config, *again, *group);
  resumed.load_checkpoint((dir / "ckpt" / "global_step1").string());
  const auto next = step_on(resumed, *again, 1);
  // The saved scale (after the last step's update), not 2^40 again.
  EXPECT_EQ(next.loss_scale, std::ldexp(1.0, 40 - static_cast<int>(total_skipped)));
  EXPECT_GE(next.skipped_steps, total_skipped);
}
