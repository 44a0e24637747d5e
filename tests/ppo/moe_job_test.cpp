// A mixture of experts end to end (issue 43.6): examples/grpo_moe_tiny.json, GRPO on the
// letters task with a tiny Qwen3-MoE (`rlhf init-model --preset tiny-moe`) as actor (two
// workers with expert parallelism 2), reference and rollout, learns as grpo_tiny's dense model
// does, with and without routing replay, and its HF export, one tensor per expert as
// published (streamed from both workers' experts), loads in transformers with rlhf's logits.
#include <gtest/gtest.h>

#include <filesystem>
#include <set>

#include "models/causal_lm.h"
#include "models/pretrained.h"
#include "models/safetensors.h"
#include "test_paths.h"
#include "tests/ppo/ppo_job.h"

namespace rlhf::ppo::job_test {
namespace {

using test::expect_learned;

// rlhf's and transformers' FP32 logits of the same export: max |difference| 1e-4, the bound
// of tests/models/hf_parity_test.cpp (summation order only, ~1e-6 measured).
constexpr double kExportTolerance = 1e-4;

TEST_F(PpoJob, GrpoOnATinyMixtureOfExpertsLearnsAndItsExportLoadsInTransformers) {
  const fs::path model = dir_ / "tiny-moe";
  ASSERT_EQ(rlhf({"init-model", "--preset", "tiny-moe", "--out", model.string()}).exit_code, 0);
  Result r = rlhf({"run", "examples/grpo_moe_tiny.json", "--set", "actor.model=" + model.string(),
                   "--set", "logger.run_dir=" + (dir_ / "runs").string(), "--set", "name=moe"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const auto m = read_metrics(run_dir("moe") / "metrics.jsonl");
  ASSERT_EQ(m.size(), 30u);
  // The letters task's criterion (tests/support/learning.h): +0.1 reward from the first 5
  // steps to the last 5; grpo_tiny's dense model gains ~0.37 over the same 30 steps (this
  // job 0.38 measured, 0.114 -> 0.494).
  expect_learned(m);
  // Expert parallelism ran: each actor rank exchanged tokens by all-to-all, and everything
  // else the ranks' groups carried is what the planner said.
  for (const auto& rank : m.back()["memory"]["actor"]) {
    EXPECT_GT(rank["step_collectives"]["all_to_all"].get<int64_t>(), 0) << rank.dump();
    EXPECT_EQ(rank["peak_tensor_bytes"], rank["planned_tensor_bytes"]) << rank.dump();
  }

  // The export holds every expert as its own tensor, named as Qwen3-MoE checkpoints are.
  const fs::path exported = run_dir("moe") / "export" / "actor";
  models::CheckpointReader file(exported.string());
  const auto names = file.names();
  const std::set<std::string> saved(names.begin(), names.end());
  EXPECT_TRUE(saved.count("model.layers.1.mlp.experts.7.down_proj.weight"));
  EXPECT_TRUE(saved.count("model.layers.0.mlp.gate.weight"));

  // transformers' logits of the export against rlhf's (both FP32).
  torch::NoGradGuard no_grad;
  const auto ids = torch::randint(0, 256, {2, 12}, torch::kInt64);
  const auto mask = torch::ones_like(ids);
  const std::string inputs = (dir_ / "inputs.safetensors").string();
  const std::string hf_out = (dir_ / "hf_logits.safetensors").string();
  models::save_safetensors(inputs, {{"input_ids", ids}, {"attention_mask", mask}});
  const std::string error = test::run_python_reference(
      std::string(RLHF_SOURCE_DIR) + "/tests/models/hf_reference.py",
      "logits --model " + test::shell_quote(exported.string()) + " --inputs " +
          test::shell_quote(inputs) + " --out " + test::shell_quote(hf_out),
      (dir_ / "hf_logits.log").string(), "run scripts/setup to install transformers");
  ASSERT_TRUE(error.empty()) << error;
  models::LoadOptions options;
  options.dtype = torch::kFloat32;
  auto lm = models::load_pretrained(exported.string(), options);
  const auto logits = lm->logits(lm->forward(ids, mask));
  const auto hf_logits = models::SafetensorsFile(hf_out).view("logits");
  const double diff = (logits - hf_logits).abs().max().item<double>();
  std::cout << "[ measured ] tiny MoE export, rlhf vs transformers logits: max abs error " << diff
            << std::endl;
  EXPECT_LE(diff, kExportTolerance);
}

TEST_F(PpoJob, MixtureOfExpertsTrainsWithZero3OverTwoRanksAsPlanned) {
  // Without expert parallelism experts are parameters like any other to ZeRO: sharded over
  // the actor's 2 ranks, gathered a layer at a time, an expert no token of a micro batch
  // reached gets a zero gradient. With it (EP 2, ZeRO-1 and 3) each rank holds its 4 experts
  // of a layer as their own unit. Each rank's tracked tensor peak equals the plan's (the
  // planner counts the experts as the trainer shards them), and so do the bytes of every
  // collective but the all-to-alls, whose bytes follow the routing (counted, not planned).
  const fs::path model = dir_ / "tiny-moe";
  ASSERT_EQ(rlhf({"init-model", "--preset", "tiny-moe", "--out", model.string()}).exit_code, 0);
  for (const std::string ep : {"1", "2"})
    for (const std::string stage : {"3", "1"}) {
      if (ep == "1" && stage == "1") continue;
      const std::string name = "moe_ep" + ep + "_z" + stage;
      Result r =
          rlhf({"run", "examples/grpo_moe_tiny.json", "--set", "actor.model=" + model.string(),
                "--set", "logger.run_dir=" + (dir_ / "runs").string(), "--set", "name=" + name,
                "--set", "actor.expert_parallel_size=" + ep, "--set", "actor.zero_stage=" + stage,
                "--set", "train.max_steps=3"});
      ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
      const auto m = read_metrics(run_dir(name) / "metrics.jsonl");
      ASSERT_EQ(m.size(), 3u);
      for (const auto& step : m) {
        EXPECT_GT(step["grad_norm"].get<double>(), 0.0);
        const auto& ranks = step["memory"]["actor"];
        ASSERT_EQ(ranks.size(), 2u);
        for (auto rank : ranks) {
          EXPECT_EQ(rank["peak_tensor_bytes"], rank["planned_tensor_bytes"]) << name << rank.dump();
          auto counted = rank["step_collectives"], planned = rank["planned_step_collectives"];
          EXPECT_EQ(counted["all_to_all"].get<int64_t>() > 0, ep == "2") << name;
          for (auto* t : {&counted, &planned}) (*t).erase("all_to_all"), (*t).erase("calls");
          EXPECT_EQ(counted, planned) << name;
        }
      }
    }
}

TEST_F(PpoJob, RoutingReplayRunsTheRolloutsExpertsInTheActorsForwards) {
  // BF16 actor, reference and rollout (the rollout fuses its projections and decodes with a KV
  // cache, so a few tokens route otherwise in the actor). With algo.routing_replay the actor's
  // old-log-prob forward runs the rollout's experts for every token it routed: differ_share 0
  // at every step (the routers' own choice is logged beside it); its training forwards replay
  // them through packed rows, checkpointed recomputes and ZeRO-3's padding parts over 2 ranks
  // (expert-parallel: the padding parts join the all-to-alls).
  // With algo.routing_stats alone nothing is replayed: the two shares are the same figure.
  const fs::path model = dir_ / "tiny-moe";
  ASSERT_EQ(rlhf({"init-model", "--preset", "tiny-moe", "--out", model.string()}).exit_code, 0);
  const std::vector<std::string> common = {"--set", "actor.model=" + model.string(),
                                           "--set", "logger.run_dir=" + (dir_ / "runs").string(),
                                           "--set", "actor.dtype=bf16",
                                           "--set", "ref.dtype=bf16",
                                           "--set", "rollout.dtype=bf16",
                                           "--set", "train.max_steps=3"};
  auto run = [&](const std::string& name, std::vector<std::string> extra) {
    std::vector<std::string> args = {"run", "examples/grpo_moe_tiny.json", "--set", "name=" + name};
    args.insert(args.end(), common.begin(), common.end());
    args.insert(args.end(), extra.begin(), extra.end());
    Result r = rlhf(args);
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    return read_metrics(run_dir(name) / "metrics.jsonl");
  };
  const auto replayed = run(
      "replay", {"--set", "algo.routing_replay=true", "--set", "train.packing_samples=true",
                 "--set", "train.max_tokens_per_micro_batch=96", "--set", "actor.zero_stage=3"});
  ASSERT_EQ(replayed.size(), 3u);
  for (const auto& step : replayed) {
    ASSERT_TRUE(step.contains("routing")) << step.dump();
    EXPECT_EQ(step["routing"]["differ_share"].get<double>(), 0.0);
    EXPECT_GE(step["routing"]["router_differ_share"].get<double>(), 0.0);
    EXPECT_GT(step["grad_norm"].get<double>(), 0.0);
  }
  const auto measured = run("stats", {"--set", "algo.routing_stats=true"});
  ASSERT_EQ(measured.size(), 3u);
  for (const auto& step : measured) {
    ASSERT_TRUE(step.contains("routing")) << step.dump();
    EXPECT_EQ(step["routing"]["differ_share"], step["routing"]["router_differ_share"]);
    std::cout << "[ measured ] step " << step["step"] << " without replay: differ_share "
              << step["routing"]["differ_share"] << ", rollout_mismatch.kl "
              << step["rollout_mismatch"]["kl"] << std::endl;
  }
  // Without either key no routes travel and none are logged.
  const auto plain = run("plain", {});
  ASSERT_EQ(plain.size(), 3u);
  EXPECT_FALSE(plain[0].contains("routing"));
}

TEST_F(PpoJob, TheLoadBalancingLossKeepsTheRoutersBalanced) {
  // actor.aux_loss_coef adds transformers' load-balancing loss (its value and router gradient
  // match transformers', hf_parity_test.cpp) to the actor's loss, logged as aux_loss. Its
  // floor is top_k = 2 (every expert picked and weighted equally). Measured over 12 steps:
  // with a coefficient of 1e-9 (logged, no pull) GRPO drifts the routers from 2.007 to 2.07;
  // with 0.1 they stay within 2.02. Asserted: the last 4 steps' mean at 0.1 is below the
  // unbalanced run's by at least 0.02, and no value is under the floor.
  const fs::path model = dir_ / "tiny-moe";
  ASSERT_EQ(rlhf({"init-model", "--preset", "tiny-moe", "--out", model.string()}).exit_code, 0);
  auto last_mean = [&](const std::string& coef) {
    const std::string name = "aux" + coef;
    Result r = rlhf({"run", "examples/grpo_moe_tiny.json", "--set", "actor.model=" + model.string(),
                     "--set", "logger.run_dir=" + (dir_ / "runs").string(), "--set", "name=" + name,
                     "--set", "train.max_steps=12", "--set", "actor.aux_loss_coef=" + coef});
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    const auto m = read_metrics(run_dir(name) / "metrics.jsonl");
    EXPECT_EQ(m.size(), 12u);
    double sum = 0;
    for (size_t i = 0; i < m.size(); ++i) {
      const double aux = m[i]["aux_loss"].get<double>();
      EXPECT_GE(aux, 2.0 - 1e-6) << "step " << i + 1;
      if (i + 4 >= m.size()) sum += aux;
    }
    std::cout << "[ measured ] aux_loss_coef " << coef << ": the last 4 steps' load-balancing "
              << "loss " << sum / 4 << std::endl;
    return sum / 4;
  };
  const double unbalanced = last_mean("1e-9"), balanced = last_mean("0.1");
  EXPECT_LT(balanced, unbalanced - 0.02);
}

TEST_F(PpoJob, MixtureOfExpertsRolloutWithTensorParallelism) {
  // The rollout as one engine of tensor parallel size 2 (each expert split as a dense MLP,
  // models/tensor_parallel.h): the weight sync sends each rank its slices of every expert,
  // and the engine samples from the actor's weights: its log-probs of the sampled tokens equal
  // the actor's within 1e-4 (FP32; the row-parallel sums add in another order). Routing
  // replay records the routes the TP engine chose: 0 tokens differ in the actor's forward.
  // Then a LoRA actor (adapters on every expert) syncs only its adapters, sliced per rank.
  const fs::path model = dir_ / "tiny-moe";
  ASSERT_EQ(rlhf({"init-model", "--preset", "tiny-moe", "--out", model.string()}).exit_code, 0);
  auto run = [&](const std::string& name, std::vector<std::string> extra) {
    std::vector<std::string> args = {
        "run",   "examples/grpo_moe_tiny.json",
        "--set", "actor.model=" + model.string(),
        "--set", "logger.run_dir=" + (dir_ / "runs").string(),
        "--set", "name=" + name,
        "--set", R"(cluster.nodes=[{"name":"local","kind":"cpu","devices":4,"memory_gb":4}])",
        "--set", "actor.devices=[0]",
        "--set", "actor.expert_parallel_size=1",
        "--set", "ref.devices=[1]",
        "--set", "rollout.devices=[2,3]",
        "--set", "rollout.tensor_parallel_size=2",
        "--set", "train.max_steps=3"};
    args.insert(args.end(), extra.begin(), extra.end());
    Result r = rlhf(args);
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    EXPECT_NE(r.out.find("ppo: loading rollout (2 workers: 1 engine of tensor parallel size 2)"),
              std::string::npos)
        << r.out;
    const auto m = read_metrics(run_dir(name) / "metrics.jsonl");
    EXPECT_EQ(m.size(), 3u);
    for (const auto& step : m) {
      EXPECT_LT(step["rollout_logprob_diff"]["max"].get<double>(), 1e-4) << step.dump();
      EXPECT_EQ(step["memory"]["rollout"].size(), 2u);
    }
    return m;
  };
  const auto full = run("moe_tp", {"--set", "algo.routing_replay=true"});
  for (const auto& step : full) EXPECT_EQ(step["routing"]["differ_share"].get<double>(), 0.0);
  const auto lora =
      run("moe_tp_lora", {"--set", "actor.lora.rank=8", "--set", "actor.adam.lr=5e-3"});
  ASSERT_FALSE(full.empty() || lora.empty());
  std::cout << "[ measured ] weight sync per step: " << full[0]["weight_sync"]["bytes"]
            << " bytes (the model), " << lora[0]["weight_sync"]["bytes"] << " (adapters)"
            << std::endl;
  EXPECT_LT(lora[0]["weight_sync"]["bytes"].get<int64_t>(),
            full[0]["weight_sync"]["bytes"].get<int64_t>() / 2);
}

TEST_F(PpoJob, ExpertParallelismWithRoutingReplayLearns) {
  // The example with algo.routing_replay: the rollout's experts in every actor forward, split
  // over the two EP ranks; no token routes otherwise and the job learns as without replay
  // (measured 0.113 -> 0.492).
  const fs::path model = dir_ / "tiny-moe";
  ASSERT_EQ(rlhf({"init-model", "--preset", "tiny-moe", "--out", model.string()}).exit_code, 0);
  Result r = rlhf({"run", "examples/grpo_moe_tiny.json", "--set", "actor.model=" + model.string(),
                   "--set", "logger.run_dir=" + (dir_ / "runs").string(), "--set", "name=ep_replay",
                   "--set", "algo.routing_replay=true"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const auto m = read_metrics(run_dir("ep_replay") / "metrics.jsonl");
  ASSERT_EQ(m.size(), 30u);
  for (const auto& step : m) EXPECT_EQ(step["routing"]["differ_share"].get<double>(), 0.0);
  expect_learned(m);
}

TEST_F(PpoJob, ExpertParallelismInDpoAndForACritic) {
  // The other trained roles take the key alike: a DPO actor, and a PPO critic built from the
  // MoE checkpoint with a fresh value head, each on 2 ranks with EP 2 for 3 steps. Each rank
  // exchanged tokens by all-to-all and its tracked peak equals the plan's.
  const fs::path model = dir_ / "tiny-moe";
  ASSERT_EQ(rlhf({"init-model", "--preset", "tiny-moe", "--out", model.string()}).exit_code, 0);
  const std::string runs = "logger.run_dir=" + (dir_ / "runs").string();
  Result dpo = rlhf({"run", "examples/dpo_tiny.json", "--set", "name=dpo_ep", "--set", runs,
                     "--set", "actor.model=" + model.string(), "--set",
                     R"(cluster.nodes=[{"name":"local","kind":"cpu","devices":3,"memory_gb":4}])",
                     "--set", "actor.devices=[0,1]", "--set", "ref.devices=[2]", "--set",
                     "actor.expert_parallel_size=2", "--set", "train.max_steps=3"});
  ASSERT_EQ(dpo.exit_code, 0) << dpo.out << dpo.err;
  Result ppo =
      rlhf({"run",   "examples/ppo_tiny.json",
            "--set", "name=critic_ep",
            "--set", runs,
            "--set", "actor.model=" + model.string(),
            "--set", "critic.model=" + model.string(),
            "--set", R"(cluster.nodes=[{"name":"local","kind":"cpu","devices":6,"memory_gb":4}])",
            "--set", "critic.devices=[1,2]",
            "--set", "ref.devices=[3]",
            "--set", "rollout.devices=[4]",
            "--set", "critic.expert_parallel_size=2",
            "--set", "train.max_steps=3"});
  ASSERT_EQ(ppo.exit_code, 0) << ppo.out << ppo.err;
  for (const auto& [name, role] :
       {std::pair<std::string, std::string>{"dpo_ep", "actor"}, {"critic_ep", "critic"}}) {
    int logged = 0;
    for (const auto& step : read_metrics(run_dir(name) / "metrics.jsonl")) {
      if (!step.contains("memory")) continue;  // DPO's evaluation records
      ++logged;
      ASSERT_EQ(step["memory"][role].size(), 2u) << name;
      for (const auto& rank : step["memory"][role]) {
        EXPECT_GT(rank["step_collectives"]["all_to_all"].get<int64_t>(), 0) << name;
        EXPECT_EQ(rank["peak_tensor_bytes"], rank["planned_tensor_bytes"]) << name;
      }
    }
    EXPECT_GT(logged, 0) << name;
  }
}

TEST_F(PpoJob, BadExpertParallelismIsRefusedByNameBeforeAnyWorkerStarts) {
  const fs::path model = dir_ / "tiny-moe";
  ASSERT_EQ(rlhf({"init-model", "--preset", "tiny-moe", "--out", model.string()}).exit_code, 0);
  const std::string five = R"(cluster.nodes=[{"name":"local","kind":"cpu","devices":5}])";
  const std::vector<std::string> three = {five,
                                          "actor.devices=[0,1,2]",
                                          "ref.devices=[3]",
                                          "rollout.devices=[4]",
                                          "train.batch_size=48",
                                          "rollout.batch_size=6",
                                          "rollout.micro_batch_size=6"};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), three.begin(), three.end());
    return more;
  };
  struct Case {
    std::vector<std::string> sets;
    std::string example, message;
  };
  const std::vector<Case> cases = {
      // 8 experts over 3 ranks.
      {with({"actor.expert_parallel_size=3"}), "examples/grpo_moe_tiny.json",
       "expert_parallel_size 3 does not divide the model's 8 experts"},
      // 2 over 3 workers.
      {with({}), "examples/grpo_moe_tiny.json", "2 does not divide the actor's 3 workers"},
      {{"actor.lora.rank=8"}, "examples/grpo_moe_tiny.json", "not with actor.lora"},
      // A dense model has no experts to split.
      {{R"(cluster.nodes=[{"name":"local","kind":"cpu","devices":4}])", "actor.devices=[0,1]",
        "ref.devices=[2]", "rollout.devices=[3]", "actor.expert_parallel_size=2"},
       "examples/grpo_tiny.json",
       "has no mixture-of-experts layer"}};
  for (const auto& c : cases) {
    std::vector<std::string> args = {"run",   c.example,
                                     "--set", "name=bad_ep",
                                     "--set", "logger.run_dir=" + (dir_ / "runs").string()};
    const fs::path actor = c.example == "examples/grpo_tiny.json" ? dir_ / "tiny" : model;
    args.insert(args.end(), {"--set", "actor.model=" + actor.string()});
    for (const auto& set : c.sets) args.insert(args.end(), {"--set", set});
    Result r = rlhf(args);
    EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
    EXPECT_NE(r.err.find("actor.expert_parallel_size"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << r.err;
    EXPECT_EQ(r.out.find("loading actor"), std::string::npos) << r.out;
  }
}

TEST_F(PpoJob, RoutingReplayOfADenseActorIsRefusedByNameBeforeAnyWorkerStarts) {
  for (const char* key : {"algo.routing_replay", "algo.routing_stats"}) {
    Result r = run("dense", {"--set", std::string(key) + "=true"}, "examples/grpo_tiny.json");
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.err.find(key), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("has no mixture-of-experts layers"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("loading actor"), std::string::npos) << r.err;
    EXPECT_EQ(r.out.find("loading actor"), std::string::npos) << r.out;
  }
}

}  // namespace
}  // namespace rlhf::ppo::job_test
