// Worker process for the engine's multi-process tests: one rank of a real Gloo group
// training the tiny job through the Trainer; writes what it measured as JSON to OUT.
// Usage:
//   rlhf_engine_worker parity RANK SIZE STORE OUT
//     every (dtype, stage) run of parity_config for kSteps steps: losses, grad norms, lrs,
//     memory after the first step, the units' trained elements and the last step's
//     collectives
//   rlhf_engine_worker lora RANK SIZE STORE OUT DIR
//     the tiny model with adapters (tiny_lora_model) at stages 2 and 3 (tied, without
//     checkpointing, BF16): losses, grad norms, memory, the adapters' final values, the
//     frozen elements left in the model, the last step's collectives; exports the FP32
//     stage-3 run to DIR/export
//   rlhf_engine_worker cuda_parity RANK SIZE STORE OUT
//     every rank on cuda:0 (Gloo with CUDA tensors: NCCL refuses two ranks on one GPU):
//     fp32 and bf16 stage 3 for kSteps steps: losses and grad norms
//   rlhf_engine_worker ckpt RANK SIZE STORE OUT ROOT FIRST LAST [pause_at=K] [export]
//     stage 3 FP32: resumes from ROOT's latest checkpoint when FIRST > 1, trains steps
//     FIRST..LAST saving ROOT/global_stepK after each; with pause_at=K, rank 1 writes
//     ROOT/paused and sleeps inside the save of step K (the test kills it there); with
//     export, exports to ROOT/hf and reports the export memory and an eval loss.
//   rlhf_engine_worker sharded_load RANK SIZE STORE OUT DIR TIED_DIR
//     the parity runs of FP32 stages 1-3 (and tied stage 3) with every rank reading its own
//     shard of the checkpoint at DIR (TIED_DIR) into a deferred model: losses, grad norms,
//     the tracked peak of the load and the states it left
//   rlhf_engine_worker memory RANK SIZE STORE OUT DIR
//     stage 3 BF16 on DIR (a large model): tracked and measured memory of the sharded load
//     and of one training step of one sequence of 32 tokens
//   rlhf_engine_worker infer RANK SIZE STORE OUT DIR ROWS
//     ZeRO-3 inference (engine::ShardedInference) over the group on DIR: rank r computes
//     rows [r * ROWS, (r + 1) * ROWS + r) of the shared test batch (ranks differ in batch
//     size): action log-probs (LM head) or values (value head), and its memory
#include <malloc.h>
#include <sys/resource.h>
#include <torch/torch.h>
#include <unistd.h>

#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>

#include "engine/sharded_inference.h"
#include "engine/trainer.h"
#include "models/pretrained.h"
#include "tests/engine/tiny_job.h"
#include "tests/support/collective.h"
#include "transport/collective_group.h"

using namespace rlhf;
using nlohmann::json;

namespace {

json memory_json(const engine::MemoryReport& m) {
  return {{"params", m.params}, {"master", m.master},     {"optimizer", m.optimizer},
          {"grads", m.grads},   {"gathered", m.gathered}, {"peak", m.peak}};
}

int64_t trainable_params(models::CausalLM& model) {
  int64_t n = 0;
  for (const auto& p : model.parameters()) n += p.numel();
  return n;
}

// Trains one step of the tiny job on this rank's share of the global batch.
engine::StepMetrics train_one(engine::Trainer& trainer, models::CausalLM& model, int64_t step) {
  const int64_t accum = trainer.config().grad_accum_steps;
  return trainer.train_step([&](int64_t i) {
    auto tokens = testing::micro_batch(step, trainer.rank() * accum + i, model.config().vocab_size);
    return testing::nll_loss(model, tokens.to(trainer.config().device));
  });
}

json cuda_parity(transport::CollectiveGroup& group) {
  json out;
  const torch::Device cuda(torch::kCUDA, 0);
  for (auto [tag, dtype] :
       {std::pair{"fp32", torch::kFloat}, std::pair{"bf16", torch::kBFloat16}}) {
    auto model = testing::tiny_model(false);
    model->to(cuda);
    auto config = testing::parity_config(3, dtype, group.size());
    config.device = cuda;
    engine::Trainer trainer(config, *model, group);
    json losses = json::array(), norms = json::array();
    for (int64_t step = 0; step < testing::kSteps; ++step) {
      auto m = train_one(trainer, *model, step);
      losses.push_back(m.loss);
      norms.push_back(m.grad_norm);
    }
    out[tag] = {{"losses", losses}, {"grad_norms", norms}};
  }
  return out;
}

// One parity run's settings.
struct Run {
  std::string name;
  torch::Dtype dtype;
  int stage;
  bool tied = false;
  bool checkpointing = true;
};

// kSteps steps of `run` on `model`: per step the loss, grad norm and lr, the memory after the
// first step, the units' trained elements and what the planner's collective check needs.
json train_run(engine::Trainer& trainer, models::CausalLM& model, const Run& run) {
  json losses = json::array(), norms = json::array(), lrs = json::array(), memory;
  for (int64_t step = 0; step < testing::kSteps; ++step) {
    auto m = train_one(trainer, model, step);
    losses.push_back(m.loss);
    norms.push_back(m.grad_norm);
    lrs.push_back(m.lr);
    if (step == 0) memory = memory_json(m.memory);
  }
  json units = json::array();
  for (const auto& unit : trainer.units()) units.push_back(unit->numel());
  return {{"losses", losses},
          {"grad_norms", norms},
          {"lrs", lrs},
          {"memory", memory},
          {"units", units},
          {"tied", run.tied},
          {"backward_calls", trainer.config().grad_accum_steps},
          {"checkpointing", run.checkpointing},
          {"last_step_collectives", trainer.last_step_traffic()}};
}

json parity(transport::CollectiveGroup& group) {
  json out;
  std::vector<Run> runs;
  for (auto [tag, dtype] :
       {std::pair{"fp32", torch::kFloat}, std::pair{"bf16", torch::kBFloat16}}) {
    for (int stage = 1; stage <= 3; ++stage)
      runs.push_back({tag + std::string("_stage") + std::to_string(stage), dtype, stage});
  }
  runs.push_back({"fp32_stage3_tied", torch::kFloat, 3, true});
  runs.push_back({"fp32_stage3_no_checkpointing", torch::kFloat, 3, false, false});
  for (const auto& run : runs) {
    auto model = testing::tiny_model(run.tied, run.checkpointing);
    const int64_t n_params = trainable_params(*model);
    auto config = testing::parity_config(run.stage, run.dtype, group.size());
    config.tied_embeddings = run.tied;
    engine::Trainer trainer(config, *model, group);
    out[run.name] = train_run(trainer, *model, run);
    out[run.name]["num_params"] = n_params;
  }
  return out;
}

// Issue 41.1: LoRA over a frozen base, whole (stage 2) or sharded (stage 3), for kSteps
// steps; the adapters' final values by name (FP32), the frozen elements the model holds
// between steps, and rank 0's HF export of the stage-3 run (base and adapters) at DIR/export.
json lora_parity(transport::CollectiveGroup& group, const std::string& dir) {
  json out;
  const std::vector<Run> runs = {{"fp32_stage2", torch::kFloat, 2},
                                 {"fp32_stage3", torch::kFloat, 3},
                                 {"fp32_stage3_tied", torch::kFloat, 3, true},
                                 {"fp32_stage3_no_checkpointing", torch::kFloat, 3, false, false},
                                 {"bf16_stage3", torch::kBFloat16, 3}};
  for (const auto& run : runs) {
    auto model = testing::tiny_lora_model(run.tied, run.checkpointing);
    auto config = testing::parity_config(run.stage, run.dtype, group.size());
    config.tied_embeddings = run.tied;
    engine::Trainer trainer(config, *model, group);
    json result = train_run(trainer, *model, run);
    int64_t frozen_held = 0;
    for (const auto& p : model->parameters())
      if (!p.requires_grad()) frozen_held += p.numel();
    json frozen = json::array(), adapters = json::object();
    for (const auto& unit : trainer.units()) frozen.push_back(unit->frozen_numel());
    for (const auto& [name, t] : trainer.gather_trainable()) {
      auto flat = t.to(torch::kDouble).contiguous();
      adapters[name] =
          std::vector<double>(flat.data_ptr<double>(), flat.data_ptr<double>() + flat.numel());
    }
    if (run.name == "fp32_stage3")
      trainer.export_hf(dir + "/export", model->config().to_json_text(), torch::kFloat);
    result.update({{"frozen_units", frozen}, {"frozen_held", frozen_held}, {"adapters", adapters}});
    out[run.name] = std::move(result);
  }
  return out;
}

json checkpoint_run(transport::CollectiveGroup& group, const std::vector<std::string>& args) {
  const std::string root = args.at(0);
  const int64_t first = std::stoll(args.at(1)), last = std::stoll(args.at(2));
  int64_t pause_at = -1;
  bool do_export = false;
  for (size_t i = 3; i < args.size(); ++i) {
    if (args[i].rfind("pause_at=", 0) == 0) pause_at = std::stoll(args[i].substr(9));
    if (args[i] == "export") do_export = true;
  }
  auto model = testing::tiny_model(false);
  engine::Trainer trainer(testing::parity_config(3, torch::kFloat, group.size()), *model, group);
  json out;
  if (first > 1) {
    auto latest = engine::latest_checkpoint(root);
    if (!latest) throw std::runtime_error("no checkpoint under " + root);
    trainer.load_checkpoint(*latest);
    out["resumed_from"] = *latest;
    out["resumed_step"] = trainer.steps_done();
  }
  json losses = json::object();
  for (int64_t step = first; step <= last; ++step) {
    auto m = train_one(trainer, *model, step - 1);
    losses[std::to_string(step)] = m.loss;
    engine::CheckpointOptions options;
    if (step == pause_at && group.rank() == 1) {
      options.before_commit = [&] {
        std::ofstream(root + "/paused") << "rank 1 paused in save of step " << step << '\n';
        while (true) std::this_thread::sleep_for(std::chrono::seconds(1));  // killed here
      };
    }
    trainer.save_checkpoint(root + "/global_step" + std::to_string(step), options);
  }
  out["losses"] = losses;
  if (do_export) {
    trainer.export_hf(root + "/hf", model->config().to_json_text(), torch::kFloat);
    auto em = trainer.last_export_memory();
    out["export"] = {{"peak_engine_bytes", em.peak_engine_bytes},
                     {"peak_heap_growth", em.peak_heap_growth},
                     {"largest_unit_bytes", em.largest_unit_bytes}};
    torch::NoGradGuard no_grad;
    out["eval_loss"] =
        testing::nll_loss(*model, testing::micro_batch(99, 0, model->config().vocab_size))
            .item<double>();
  }
  return out;
}

int64_t heap_in_use() {
  struct mallinfo2 info = mallinfo2();
  return static_cast<int64_t>(info.uordblks + info.hblkhd);
}

int64_t peak_rss() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;
}

json sharded_load(transport::CollectiveGroup& group, const std::string& dir,
                  const std::string& tied_dir) {
  json out;
  for (int stage = 1; stage <= 3; ++stage) {
    for (bool tied : {false, true}) {
      if (tied && stage != 3) continue;
      const models::PretrainedSource source(tied ? tied_dir : dir);
      models::CausalLM model(source.config(), models::Materialize::kDeferred);
      model.set_checkpointing(models::Checkpointing::kPerLayer);
      auto config = testing::parity_config(stage, torch::kFloat, group.size());
      config.tied_embeddings = tied;
      engine::Trainer trainer(config, model, group, &source);
      const auto loaded = trainer.memory_report();
      int64_t largest_param = 0;
      for (const auto& [name, shape] : model.parameter_shapes()) {
        int64_t n = 1;
        for (int64_t d : shape) n *= d;
        largest_param = std::max(largest_param, n);
      }
      json losses = json::array(), norms = json::array();
      for (int64_t step = 0; step < testing::kSteps; ++step) {
        auto m = train_one(trainer, model, step);
        losses.push_back(m.loss);
        norms.push_back(m.grad_norm);
      }
      out["fp32_stage" + std::to_string(stage) + (tied ? "_tied" : "")] = {
          {"losses", losses},
          {"grad_norms", norms},
          {"load_peak", loaded.peak},
          {"load_states", loaded.model_states()},
          {"largest_param_bytes", largest_param * 4}};
    }
  }
  return out;
}

json memory_run(transport::CollectiveGroup& group, const std::string& dir) {
  const int64_t heap0 = heap_in_use(), rss0 = peak_rss();
  const models::PretrainedSource source(dir);
  models::CausalLM model(source.config(), models::Materialize::kDeferred);
  model.set_checkpointing(models::Checkpointing::kPerLayer);
  engine::TrainerConfig config;
  config.zero_stage = engine::ZeroStage::kParameters;
  config.compute_dtype = torch::kBFloat16;
  config.tied_embeddings = model.config().tie_word_embeddings;
  config.grad_accum_steps = 1;
  engine::Trainer trainer(config, model, group, &source);
  const auto loaded = trainer.memory_report();
  json out = {{"load_peak", loaded.peak},
              {"load_states", loaded.model_states()},
              {"load_heap_growth", heap_in_use() - heap0},
              {"load_rss_growth", peak_rss() - rss0},
              {"num_params", model.config().num_parameters()}};
  int64_t largest_unit = 0;
  for (const auto& unit : trainer.units())
    largest_unit = std::max(largest_unit, unit->padded_numel());
  out["largest_unit_numel"] = largest_unit;
  const int64_t vocab = model.config().vocab_size;
  auto m = trainer.train_step([&](int64_t) {
    auto gen = at::detail::createCPUGenerator(7);
    auto tokens = torch::randint(vocab, {1, 32}, gen, torch::kLong);
    return testing::nll_loss(model, tokens);
  });
  out["step_peak"] = m.memory.peak;
  out["step_states"] = m.memory.model_states();
  out["loss"] = m.loss;
  return out;
}

json sharded_infer(transport::CollectiveGroup& group, const std::string& dir, int64_t rows) {
  const models::PretrainedSource source(dir);
  models::CausalLM model(source.config(), models::Materialize::kDeferred);
  engine::ShardedInference sharded(model, group, source, source.dtype(), torch::kCPU,
                                   model.config().tie_word_embeddings);
  torch::NoGradGuard no_grad;
  const int r = group.rank();
  auto tokens = testing::micro_batch(0, 0, model.config().vocab_size);  // [2, 16]
  tokens = torch::cat({tokens, testing::micro_batch(0, 1, model.config().vocab_size)}, 0)
               .slice(0, r * rows, (r + 1) * rows + r);
  auto mask = torch::ones_like(tokens);
  mask.index_put_({0, torch::indexing::Slice(0, 3)}, 0);  // left padding on the first row
  sharded.reset_peak();
  auto hidden = model.forward(tokens, mask);
  torch::Tensor result = model.config().head == models::HeadKind::kValue
                             ? model.values(hidden)
                             : model.next_token_log_probs(hidden, tokens);
  result = result.to(torch::kFloat64).contiguous();
  const auto memory = sharded.memory_report();
  return {{"rows", tokens.size(0)},
          {"values", std::vector<double>(result.data_ptr<double>(),
                                         result.data_ptr<double>() + result.numel())},
          {"shard_bytes", sharded.shard_bytes()},
          {"peak", memory.peak},
          {"params_left", model.embed_tokens->weight.numel()}};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 6) {
    std::cerr << "usage: rlhf_engine_worker "
                 "(parity|lora|cuda_parity|ckpt|sharded_load|memory|infer) RANK "
                 "SIZE STORE OUT [ARGS...]\n";
    return 2;
  }
  try {
    torch::set_num_threads(1);
    auto group =
        test::join_group(argv[4], std::stoi(argv[2]), std::stoi(argv[3]), std::chrono::seconds(60));
    const std::string mode = argv[1];
    const std::vector<std::string> args(argv + 6, argv + argc);
    json out = mode == "parity"         ? parity(*group)
               : mode == "lora"         ? lora_parity(*group, args.at(0))
               : mode == "cuda_parity"  ? cuda_parity(*group)
               : mode == "sharded_load" ? sharded_load(*group, args.at(0), args.at(1))
               : mode == "memory"       ? memory_run(*group, args.at(0))
               : mode == "infer"        ? sharded_infer(*group, args.at(0), std::stoll(args.at(1)))
                                        : checkpoint_run(*group, args);
    std::ofstream(argv[5]) << out.dump(1);
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "engine worker rank " << argv[2] << ": " << e.what() << '\n';
    return 1;
  }
}
