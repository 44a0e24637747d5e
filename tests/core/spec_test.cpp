// Job-spec validation: a table of bad specs, each with the message a user must see, plus
// defaults, overrides, round trips and the generated reference.
#include "core/spec.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/run_dir.h"
#include "core/spec_schema.h"
#include "rewards/spec_keys.h"
#include "test_paths.h"

namespace rlhf {
namespace {

using nlohmann::json;

// A small valid PPO spec every bad case is derived from (by JSON merge patch).
json base_spec() {
  return json::parse(R"({
    "kind": "ppo",
    "cluster": {"nodes": [{"name": "local", "kind": "cpu", "devices": 6, "memory_gb": 4}]},
    "actor": {"model": "m/actor", "devices": [0, 1]},
    "critic": {"model": "m/critic", "devices": [2]},
    "reward": {"model": "m/rm", "devices": [3]},
    "ref": {"devices": [4]},
    "rollout": {"devices": [5], "batch_size": 8, "micro_batch_size": 4, "n_samples_per_prompt": 2,
                "max_new_tokens": 16},
    "data": {"prompt_dataset": "synthetic:letters", "prompt_max_len": 16, "max_len": 32},
    "train": {"batch_size": 8, "micro_batch_size": 2}
  })");
}

std::vector<SpecProblem> problems_of(const std::string& text,
                                     const std::vector<std::string>& overrides = {}) {
  try {
    JobSpec::parse(text, "job.json", overrides);
  } catch (const SpecError& e) {
    return e.problems();
  }
  return {};
}

struct BadCase {
  const char* name;
  std::string patch;     // JSON merge patch on base_spec(), or raw text when `raw` is set
  std::string path;      // the JSON path the problem must name
  std::string fragment;  // what the message must say
  bool raw = false;
  std::vector<std::string> overrides = {};
};

const std::vector<BadCase>& bad_cases() {
  static const std::vector<BadCase> kCases = {
      {"malformed_json", "{\"kind\": \"ppo\",\n  \"train\": {\"batch_size\": 8,}\n}", "",
       "malformed JSON at line 2", true},
      {"not_an_object", "[1, 2, 3]", "", "expected a JSON object at the top level", true},
      {"reference_stage_2", R"({"ref": {"zero_stage": 2}})", "ref.zero_stage",
       "expected 0 (full weights on every ref worker) or 3"},
      {"unknown_top_key", R"({"rollouts": {"batch_size": 8}})", "rollouts",
       "unknown key (did you mean rollout", false},
      {"unknown_nested_key", R"({"rollout": {"n_sample_per_prompt": 4}})",
       "rollout.n_sample_per_prompt", "did you mean rollout.n_samples_per_prompt?"},
      {"unknown_key_far_from_all", R"({"zzzzqqqqxxxx": 1})", "zzzzqqqqxxxx", "unknown key"},
      {"section_not_object", R"({"train": 5})", "train", "expected an object (section train)"},
      {"wrong_type_int", R"({"train": {"batch_size": "eight"}})", "train.batch_size",
       "expected an integer >= 1, found \"eight\""},
      {"fractional_int", R"({"train": {"max_epochs": 1.5}})", "train.max_epochs",
       "expected an integer in [1, 1000], found 1.5"},
      {"wrong_type_bool", R"({"actor": {"gradient_checkpointing": "yes"}})",
       "actor.gradient_checkpointing", "expected true or false"},
      {"out_of_range_low", R"({"rollout": {"n_samples_per_prompt": 0}})",
       "rollout.n_samples_per_prompt", "expected an integer in [1, 4096], found 0"},
      {"out_of_range_exclusive", R"({"rollout": {"top_p": 0}})", "rollout.top_p",
       "expected a number in (0, 1], found 0"},
      {"zero_stage_range", R"({"actor": {"zero_stage": 4}})", "actor.zero_stage",
       "expected an integer in [0, 3], found 4"},
      {"bad_enum_with_hint", R"({"algo": {"advantage": {"estimator": "gea"}}})",
       "algo.advantage.estimator", "(did you mean gae?)"},
      {"bad_rollout_correction", R"({"algo": {"rollout_correction": "tiss"}})",
       "algo.rollout_correction",
       "expected one of none, tis, decoupled, found \"tiss\" (did you mean tis?)"},
      {"rollout_correction_cap_below_one", R"({"algo": {"rollout_correction_cap": 0.5}})",
       "algo.rollout_correction_cap", "expected a number >= 1, found 0.5"},
      {"bad_list_length", R"({"actor": {"adam": {"betas": [0.9]}}})", "actor.adam.betas",
       "expected a list of 2 numbers"},
      {"bad_devices_type", R"({"actor": {"devices": "0,1"}})", "actor.devices",
       "expected a list of device ids or an object"},
      {"negative_device", R"({"actor": {"devices": [-1]}})", "actor.devices",
       "device ids as integers >= 0"},
      {"missing_device", R"({"critic": {"devices": [9]}})", "critic.devices",
       "device 9 does not exist on node \"local\" (it has 6 devices: 0..5)"},
      {"unknown_node", R"({"critic": {"devices": {"gpu7": [0]}}})", "critic.devices",
       "no node named \"gpu7\" in cluster.nodes (nodes: local)"},
      {"overlapping_devices", R"({"critic": {"devices": [1]}})", "critic.devices",
       "device 1 on node \"local\" is also used by actor; role groups must be disjoint"},
      {"duplicate_device", R"({"actor": {"devices": [0, 0]}})", "actor.devices",
       "device 0 is listed twice"},
      {"no_free_device", R"({"ref": {"devices": []}, "reward": {"devices": [3, 4]}})",
       "ref.devices", "no free device left for ref"},
      {"colocate_unused_role",
       R"({"actor": {"colocate_with": "critic"},
           "algo": {"advantage": {"estimator": "reinforce"}}})",
       "actor.colocate_with", "\"critic\" is not used by this job"},
      {"colocate_self", R"({"ref": {"colocate_with": "ref"}})", "ref.colocate_with",
       "cannot colocate with itself"},
      {"colocate_outside_target", R"({"rollout": {"colocate_with": "actor", "devices": [5]}})",
       "rollout.devices", "is not one of actor's devices"},
      {"node_missing_devices",
       R"({"cluster": {"nodes": [{"name": "a", "kind": "cpu", "memory_gb": 4}]}})", "cluster.nodes",
       "cluster.nodes[0].devices: expected an integer >= 1"},
      {"node_unknown_field",
       R"({"cluster": {"nodes": [{"name": "local", "devices": 6, "gpus": 8}]}})", "cluster.nodes",
       "cluster.nodes[0].gpus: unknown node field"},
      {"cuda_node_without_memory",
       R"({"cluster": {"nodes": [{"name": "local", "kind": "cuda", "devices": 6}]}})",
       "cluster.nodes", "memory per GPU in GiB"},
      {"duplicate_node_name",
       R"({"cluster": {"nodes": [{"name": "a", "devices": 6}, {"name": "a", "devices": 2}]},
           "actor": {"devices": {"a": [0, 1]}}})",
       "cluster.nodes", "is already the name of cluster.nodes[0]"},
      {"train_batch_not_divisible",
       R"({"train": {"batch_size": 6, "micro_batch_size": 2}, "rollout": {"batch_size": 6}})",
       "train.batch_size",
       "6 is not divisible by train.micro_batch_size (2) x actor group size (2) = 4"},
      {"rollout_not_multiple_of_train", R"({"rollout": {"batch_size": 6}})", "rollout.batch_size",
       "6 prompts x rollout.n_samples_per_prompt (2) = 12 samples is not a multiple of "
       "train.batch_size (8)"},
      {"micro_larger_than_batch", R"({"train": {"micro_batch_size": 16}})",
       "train.micro_batch_size", "larger than train.batch_size (8)"},
      {"group_estimator_needs_samples",
       R"({"algo": {"advantage": {"estimator": "grpo"}}, "rollout": {"n_samples_per_prompt": 1,
           "batch_size": 8}, "critic": null})",
       "rollout.n_samples_per_prompt", "the grpo estimator compares samples of the same prompt"},
      {"lengths_inconsistent", R"({"data": {"prompt_max_len": 30}})", "data.max_len",
       "32 is shorter than data.prompt_max_len (30) + rollout.max_new_tokens (16) = 46"},
      {"dpo_prompt_fills_max_len",
       R"({"kind": "dpo", "data": {"dataset": "d.jsonl", "prompt_max_len": 32}, "critic": null,
           "reward": null, "rollout": {"devices": []}})",
       "data.prompt_max_len", "leaves no room for a response"},
      {"missing_actor_model", R"({"actor": {"model": ""}})", "actor.model",
       "required for a ppo job"},
      {"missing_reward_source", R"({"reward": {"model": ""}, "critic": {"model": "m/critic"}})",
       "reward", "needs a reward source"},
      {"missing_prompt_dataset", R"({"data": {"prompt_dataset": ""}})", "data.prompt_dataset",
       "required for a ppo job"},
      {"missing_dpo_dataset", R"({"kind": "dpo"})", "data.dataset", "required for a dpo job"},
      {"dual_clip_range", R"({"actor": {"dual_clip": 0.5}})", "actor.dual_clip",
       "expected 0 (off) or a number > 1"},
      {"entropy_bonus_not_applied", R"({"actor": {"entropy_coef": 0.01}})", "actor.entropy_coef",
       "the entropy bonus is not applied yet"},
      {"save_steps_zero", R"({"ckpt": {"save_steps": 0}})", "ckpt.save_steps",
       "expected -1 (only at the end)"},
      {"clip_range_order", R"({"reward": {"clip_range": [5, -5]}})", "reward.clip_range",
       "low < high"},
      {"tensor_parallel_leaves_a_worker_over",
       R"({"cluster": {"nodes": [{"name": "local", "kind": "cpu", "devices": 8, "memory_gb": 4}]},
           "rollout": {"devices": [5, 6, 7], "tensor_parallel_size": 2}})",
       "rollout.tensor_parallel_size",
       "2 does not divide the rollout's 3 workers (rollout.devices): each engine takes 2 "
       "consecutive workers"},
      {"lora_adapters_sync_to_another_base",
       R"({"actor": {"lora": {"rank": 8}}, "rollout": {"model": "/elsewhere/other-model"}})",
       "rollout.lora_sync",
       "adapters needs the rollout to hold the actor's base (rollout.model "
       "/elsewhere/other-model is not actor.model"},
      {"tensor_parallel_size_zero", R"({"rollout": {"tensor_parallel_size": 0}})",
       "rollout.tensor_parallel_size", "expected an integer >= 1, found 0"},
      {"tensor_parallel_engine_across_cuda_nodes",
       R"({"cluster": {"nodes": [{"name": "a", "kind": "cuda", "devices": 8, "memory_gb": 80},
                                 {"name": "b", "kind": "cuda", "devices": 8, "memory_gb": 80}]},
           "rollout": {"devices": {"a": [5, 6, 7], "b": [0]}, "tensor_parallel_size": 2}})",
       "rollout.tensor_parallel_size",
       "engine 1 (rollout workers 2..3) spans nodes \"a\" and \"b\": its ranks all-reduce in "
       "every layer, so list each engine's 2 GPUs on one node"},
      {"set_unknown_key",
       "{}",
       "rollout.n_sample",
       "--set: unknown key",
       false,
       {"rollout.n_sample=4"}},
      {"set_bad_value",
       "{}",
       "rollout.n_samples_per_prompt",
       "--set rollout.n_samples_per_prompt=four: expected an integer",
       false,
       {"rollout.n_samples_per_prompt=four"}},
      // One generation engine: the paged one (issue 40.2); 0 was the contiguous cache.
      {"contiguous_kv_cache", R"({"rollout": {"kv_block_size": 0}})", "rollout.kv_block_size",
       "expected an integer in [1, 4096], found 0"},
      {"multi_turn_without_chat_template", R"({"rollout": {"max_turns": 2}})", "rollout.max_turns",
       "set data.apply_chat_template=true (chatml or llama3)"},
      {"set_without_equals",
       "{}",
       "",
       "--set rollout.batch_size: expected PATH=VALUE",
       false,
       {"rollout.batch_size"}},
      {"env_two_kinds", R"({"env": {"builtin": "calculator", "url": "http://127.0.0.1:9/env"}})",
       "env.url",
       "set at most one of env.builtin, env.python, env.url (found env.builtin and env.url)"},
      {"env_unknown_builtin", R"({"env": {"builtin": "chess"}})", "env.builtin",
       "expected one of \"\", calculator, guess_number, found \"chess\""},
      {"env_python_without_factory", R"({"env": {"python": "env.py"}})", "env.python",
       "expected \"FILE.py:FACTORY\", found \"env.py\""},
      {"env_python_missing_file", R"({"env": {"python": "/nonexistent/rlhf_env.py:make_env"}})",
       "env.python", "no such file: /nonexistent/rlhf_env.py"},
      {"env_url_not_http", R"({"env": {"url": "https://example.com/env"}})", "env.url",
       "expected http://host[:port][/path], found \"https://example.com/env\""},
      {"env_options_not_object", R"({"env": {"builtin": "calculator", "options": [1]}})",
       "env.options", "expected a JSON object, found [1]"},
      {"env_timeout_zero", R"({"env": {"builtin": "calculator", "timeout_s": 0}})", "env.timeout_s",
       "expected a number in (0, 86400], found 0"},
  };
  return kCases;
}

// Shown by GoogleTest (and ctest) instead of the struct's bytes.
void PrintTo(const BadCase& c, std::ostream* os) {
  *os << c.name;
}

class BadSpec : public testing::TestWithParam<BadCase> {};

TEST_P(BadSpec, ReportsPathAndMessage) {
  const BadCase& c = GetParam();
  std::string text;
  if (c.raw) {
    text = c.patch;
  } else {
    json doc = base_spec();
    doc.merge_patch(json::parse(c.patch));
    text = doc.dump();
  }
  auto problems = problems_of(text, c.overrides);
  ASSERT_FALSE(problems.empty()) << "spec was accepted: " << text;
  bool found = false;
  std::string all;
  for (const auto& p : problems) {
    all += "\n  [" + p.path + "] " + p.message;
    if (p.path == c.path && p.message.find(c.fragment) != std::string::npos) found = true;
  }
  EXPECT_TRUE(found) << "wanted [" << c.path << "] ... " << c.fragment << "\ngot:" << all;
}

INSTANTIATE_TEST_SUITE_P(Table, BadSpec, testing::ValuesIn(bad_cases()),
                         [](const testing::TestParamInfo<BadCase>& info) {
                           return info.param.name;
                         });

TEST(Spec, BaseSpecIsValid) {
  EXPECT_TRUE(problems_of(base_spec().dump()).empty());
}

TEST(Spec, ReportsEveryProblemAtOnce) {
  json doc = base_spec();
  doc.merge_patch(json::parse(
      R"({"train": {"batch_size": "x"}, "rollout": {"top_p": 2}, "actor": {"lrr": 1}})"));
  auto problems = problems_of(doc.dump());
  EXPECT_EQ(problems.size(), 3u);
}

TEST(Spec, ErrorTextNamesFileCountAndPaths) {
  try {
    JobSpec::parse(R"({"train": {"batch_size": 0}})", "jobs/x.json");
    FAIL() << "accepted";
  } catch (const SpecError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("jobs/x.json: "), std::string::npos) << what;
    EXPECT_NE(what.find("train.batch_size: expected an integer >= 1, found 0"), std::string::npos)
        << what;
  }
}

TEST(Spec, MissingFileIsOneProblemNamingIt) {
  try {
    JobSpec::load("/nonexistent/job.json");
    FAIL() << "accepted";
  } catch (const SpecError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/job.json: 1 problem"), std::string::npos);
  }
}

TEST(Spec, DefaultsFilledAndModelsInherited) {
  JobSpec s = JobSpec::parse(base_spec().dump(), "job.json");
  EXPECT_EQ(s.get_float("algo.advantage.lambd"), 0.95);
  EXPECT_EQ(s.get_string("ref.model"), "m/actor");
  EXPECT_EQ(s.get_string("rollout.model"), "m/actor");
  EXPECT_EQ(s.get_int("actor.zero_stage"), 2);
  EXPECT_EQ(s.get_float_list("reward.clip_range"), (std::vector<double>{-10, 10}));
}

TEST(Spec, OverridesAreTypedAndWin) {
  JobSpec s = JobSpec::parse(
      base_spec().dump(), "job.json",
      {"rollout.n_samples_per_prompt=4", "actor.adam.lr=1e-5", "actor.gradient_checkpointing=false",
       "algo.kl.estimator=k3", "actor.adam.betas=0.8,0.9", "ref.devices=[4]"});
  EXPECT_EQ(s.get_int("rollout.n_samples_per_prompt"), 4);
  EXPECT_DOUBLE_EQ(s.get_float("actor.adam.lr"), 1e-5);
  EXPECT_FALSE(s.get_bool("actor.gradient_checkpointing"));
  EXPECT_EQ(s.get_string("algo.kl.estimator"), "k3");
  EXPECT_EQ(s.get_float_list("actor.adam.betas"), (std::vector<double>{0.8, 0.9}));
}

TEST(Spec, OverrideCanCreateARuleViolation) {
  // 8 prompts x 3 samples = 24 is not a multiple of train.batch_size 16.
  auto problems =
      problems_of(base_spec().dump(), {"rollout.n_samples_per_prompt=3", "train.batch_size=16"});
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_EQ(problems[0].path, "rollout.batch_size");
}

TEST(Spec, RoundTripIsUnchanged) {
  for (const char* example :
       {"ppo_tiny.json", "grpo_tiny.json", "dpo_tiny.json", "ppo_8gpu.json"}) {
    JobSpec first = JobSpec::load(std::string(RLHF_SOURCE_DIR) + "/examples/" + example);
    JobSpec second = JobSpec::parse(first.json().dump(2), "printed");
    EXPECT_EQ(first.json(), second.json()) << example;
    JobSpec third = JobSpec::parse(first.minimal_json().dump(), "minimal");
    EXPECT_EQ(first.json(), third.json()) << example;
  }
}

TEST(Spec, UsedRolesFollowKindAndAlgorithm) {
  auto roles = [](const std::string& patch) {
    json doc = base_spec();
    doc.merge_patch(json::parse(patch));
    std::vector<std::string> names;
    for (Role r : JobSpec::parse(doc.dump(), "job.json").used_roles())
      names.push_back(role_name(r));
    return names;
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(roles("{}"), (V{"actor", "critic", "reward", "ref", "rollout"}));
  EXPECT_EQ(roles(R"({"algo": {"advantage": {"estimator": "rloo"}}})"),
            (V{"actor", "reward", "ref", "rollout"}));
  EXPECT_EQ(roles(R"({"reward": {"rule": "letters"}, "algo": {"kl": {"init_coef": 0}}})"),
            (V{"actor", "critic", "rollout"}));
  EXPECT_EQ(roles(R"({"kind": "dpo", "data": {"dataset": "d"}})"), (V{"actor", "ref"}));
  EXPECT_EQ(
      roles(R"({"kind": "dpo", "data": {"dataset": "d"}, "algo": {"dpo": {"loss": "simpo"}}})"),
      (V{"actor"}));
  EXPECT_EQ(
      roles(R"({"kind": "dpo", "data": {"dataset": "d"}, "algo": {"dpo": {"loss": "orpo"}}})"),
      (V{"actor"}));
  EXPECT_EQ(roles(R"({"kind": "dpo", "data": {"dataset": "d"}, "algo": {"dpo": {"loss": "kto"}}})"),
            (V{"actor", "ref"}));
  EXPECT_EQ(roles(R"({"kind": "rm", "data": {"dataset": "d"}})"), (V{"reward"}));
}

TEST(Spec, SimpoAndOrpoWarnThatReferenceIsUnused) {
  for (std::string loss : {"simpo", "orpo"}) {
    json doc = base_spec();
    doc.merge_patch(
        json::parse(R"({"kind": "dpo", "data": {"dataset": "d"}, "algo": {"dpo": {"loss": ")" +
                    loss + R"("}}})"));
    JobSpec s = JobSpec::parse(doc.dump(), "job.json");
    bool warned = false;
    for (const auto& w : s.warnings())
      if (w.find("ref is configured but not used") != std::string::npos &&
          w.find(loss + " needs no reference") != std::string::npos)
        warned = true;
    EXPECT_TRUE(warned) << loss;
  }
}

// Issue 42.2: algo.async_steps is a deprecated alias. Its 1 is today's one-step run,
// algo.max_staleness 1 without partial rollouts, with a warning naming the new keys; an
// explicit rollout.partial_rollout stays; beside a different max_staleness it is refused
// naming both. In-flight updates are refused under tensor parallelism, naming the key.
TEST(Spec, AsyncStepsIsADeprecatedMaxStaleness) {
  auto parse = [](const std::string& patch, const std::vector<std::string>& overrides = {}) {
    json doc = base_spec();
    doc.merge_patch(json::parse(patch));
    return JobSpec::parse(doc.dump(), "job.json", overrides);
  };
  JobSpec plain = parse("{}");
  EXPECT_EQ(plain.get_int("algo.max_staleness"), 0);
  EXPECT_TRUE(plain.get_bool("rollout.partial_rollout"));
  JobSpec old = parse(R"({"algo": {"async_steps": 1}})");
  EXPECT_EQ(old.get_int("algo.max_staleness"), 1);
  EXPECT_FALSE(old.get_bool("rollout.partial_rollout"));
  ASSERT_EQ(old.warnings().size(), 1u);
  EXPECT_EQ(old.warnings()[0],
            "algo.async_steps is deprecated: it now sets algo.max_staleness 1 with "
            "rollout.partial_rollout false (write those keys instead)");
  JobSpec partial = parse(R"({"algo": {"async_steps": 1}, "rollout": {"partial_rollout": true}})");
  EXPECT_TRUE(partial.get_bool("rollout.partial_rollout"));
  EXPECT_EQ(parse("{}", {"algo.max_staleness=4"}).get_int("algo.max_staleness"), 4);
  // k >= 2 without a rollout correction learns slowly (measured): a warning names the fix.
  EXPECT_TRUE(parse("{}", {"algo.max_staleness=1"}).warnings().empty());
  const auto stale = parse("{}", {"algo.max_staleness=4"}).warnings();
  ASSERT_EQ(stale.size(), 1u);
  EXPECT_NE(stale[0].find("algo.max_staleness 4 with algo.rollout_correction none"),
            std::string::npos)
      << stale[0];
  EXPECT_NE(stale[0].find("algo.rollout_correction decoupled"), std::string::npos) << stale[0];
  EXPECT_TRUE(parse("{}", {"algo.max_staleness=4", "algo.rollout_correction=decoupled"})
                  .warnings()
                  .empty());

  auto conflict = problems_of(base_spec().dump(), {"algo.async_steps=1", "algo.max_staleness=2"});
  ASSERT_EQ(conflict.size(), 1u);
  EXPECT_EQ(conflict[0].path, "algo.async_steps");
  EXPECT_EQ(conflict[0].message,
            "is deprecated and says 1 while algo.max_staleness says 2: keep algo.max_staleness");
  json tp = base_spec();
  tp.merge_patch(json::parse(R"({
      "cluster": {"nodes": [{"name": "local", "kind": "cpu", "devices": 8, "memory_gb": 4}]},
      "rollout": {"devices": [5, 6], "tensor_parallel_size": 2}})"));
  auto refused = problems_of(tp.dump(), {"algo.max_staleness=1"});
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_EQ(refused[0].path, "rollout.partial_rollout");
  EXPECT_NE(refused[0].message.find("not supported with rollout.tensor_parallel_size 2"),
            std::string::npos)
      << refused[0].message;
  EXPECT_TRUE(
      problems_of(tp.dump(), {"algo.max_staleness=1", "rollout.partial_rollout=false"}).empty());
}

// Issue 42.1: rollout.streaming is off by default, and refused, naming it, where its scorers
// would share what generation uses (a colocated rollout). With dynamic sampling it is
// accepted: the filter runs on each group as it arrives (sampling.cpp).
TEST(Spec, StreamingNeedsScorersOfTheirOwn) {
  EXPECT_FALSE(JobSpec::parse(base_spec().dump(), "job.json").get_bool("rollout.streaming"));
  auto dapo =
      problems_of(base_spec().dump(), {"rollout.streaming=true", "algo.dynamic_sampling=true",
                                       "reward.model=", "reward.rule=letters"});
  EXPECT_TRUE(dapo.empty()) << dapo[0].path << ": " << dapo[0].message;
  json coloc = base_spec();
  coloc.merge_patch(json::parse(R"({"rollout": {"devices": [], "colocate_with": "actor"}})"));
  auto shared = problems_of(coloc.dump(), {"rollout.streaming=true"});
  ASSERT_EQ(shared.size(), 1u);
  EXPECT_EQ(shared[0].path, "rollout.streaming");
  EXPECT_NE(shared[0].message.find("not with rollout.colocate_with actor"), std::string::npos)
      << shared[0].message;
}

// rollout.tensor_parallel_size: engines of t consecutive rollout workers. On cuda nodes each
// engine stays on one node (its ranks all-reduce every layer); cpu slots of two nodes may form
// one engine (the tests' hand-joined jobs). A colocated TP rollout is warned that its weight
// sync cannot take CUDA IPC.
TEST(Spec, TensorParallelEnginesArePlacedAndChecked) {
  auto parse = [](const std::string& patch) {
    json doc = base_spec();
    doc.merge_patch(json::parse(patch));
    return JobSpec::parse(doc.dump(), "job.json");
  };
  JobSpec one_node = parse(R"({
      "cluster": {"nodes": [{"name": "a", "kind": "cuda", "devices": 8, "memory_gb": 80},
                            {"name": "b", "kind": "cuda", "devices": 8, "memory_gb": 80}]},
      "rollout": {"devices": {"a": [5, 6], "b": [0, 1]}, "tensor_parallel_size": 2}})");
  EXPECT_EQ(one_node.get_int("rollout.tensor_parallel_size"), 2);
  EXPECT_TRUE(one_node.warnings().empty());
  EXPECT_EQ(parse("{}").get_int("rollout.tensor_parallel_size"), 1);
  EXPECT_NO_THROW(parse(R"({
      "cluster": {"nodes": [{"name": "a", "kind": "cpu", "devices": 6, "memory_gb": 4},
                            {"name": "b", "kind": "cpu", "devices": 6, "memory_gb": 4}]},
      "rollout": {"devices": {"a": [5], "b": [0]}, "tensor_parallel_size": 2}})"));
  JobSpec colocated = parse(R"({
      "cluster": {"nodes": [{"name": "a", "kind": "cuda", "devices": 8, "memory_gb": 80}]},
      "rollout": {"devices": [], "colocate_with": "actor", "tensor_parallel_size": 2}})");
  ASSERT_EQ(colocated.warnings().size(), 1u);
  EXPECT_EQ(colocated.warnings()[0],
            "rollout.tensor_parallel_size 2 with rollout.colocate_with: the weight sync goes over "
            "NCCL or Gloo, not CUDA IPC (IPC hands one whole model to one GPU)");
  // Unused by offline jobs: no rule applies.
  EXPECT_NO_THROW(parse(R"({"kind": "dpo", "data": {"dataset": "d"}, "critic": {"devices": []},
      "reward": {"devices": []}, "rollout": {"devices": [], "tensor_parallel_size": 3}})"));
}

// A model's max_position_embeddings (times a linear RoPE factor) bounds the sequences a job
// builds; `rlhf run` refuses before starting workers, `rlhf validate` warns.
TEST(Spec, LengthsBeyondTheModelsPositionsAreNamed) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(RLHF_BINARY_DIR) / "tests/core/short_model";
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << R"({"max_position_embeddings": 24})";
  json spec = base_spec();
  spec["actor"]["model"] = dir.string();
  // prompt 16 + response 16 = 32 > 24.
  auto problems = lengths_beyond_models(JobSpec::parse(spec.dump(), "job.json"));
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_EQ(problems[0].path, "data.prompt_max_len + rollout.max_new_tokens");
  EXPECT_NE(problems[0].message.find("32 tokens exceed actor.model"), std::string::npos)
      << problems[0].message;
  EXPECT_NE(problems[0].message.find("max_position_embeddings 24"), std::string::npos);
  // 16 + 8 = 24 fits exactly.
  EXPECT_TRUE(
      lengths_beyond_models(JobSpec::parse(spec.dump(), "job.json", {"rollout.max_new_tokens=8"}))
          .empty());
  // Linear RoPE scaling by 2 doubles the limit to 48.
  std::ofstream(dir / "config.json")
      << R"({"max_position_embeddings": 24, "rope_scaling": {"type": "linear", "factor": 2.0}})";
  EXPECT_TRUE(lengths_beyond_models(JobSpec::parse(spec.dump(), "job.json")).empty());
  // The problem is among the inputs `rlhf run` refuses.
  std::ofstream(dir / "config.json") << R"({"max_position_embeddings": 24})";
  problems = missing_inputs(JobSpec::parse(spec.dump(), "job.json"));
  EXPECT_TRUE(std::any_of(problems.begin(), problems.end(), [](const SpecProblem& p) {
    return p.path == "data.prompt_max_len + rollout.max_new_tokens";
  }));
}

// A fresh run keeps an earlier run's metrics, plan and checkpoints under previous-K.
TEST(RunDir, FreshRunSetsAsideTheEarlierRunsOutputs) {
  namespace fs = std::filesystem;
  const fs::path parent = fs::path(RLHF_BINARY_DIR) / "tests/core/run_dirs";
  fs::remove_all(parent);
  const JobSpec spec = JobSpec::parse(base_spec().dump(), "job.json",
                                      {"logger.run_dir=" + parent.string(), "name=job"});
  EXPECT_EQ(run_directory(spec), (parent / "job").string());
  EXPECT_EQ(checkpoint_directory(spec), (parent / "job/ckpt").string());
  EXPECT_FALSE(set_aside_previous_run(spec).has_value()) << "nothing to keep yet";
  const fs::path run = parent / "job";
  fs::create_directories(run / "ckpt/actor");
  std::ofstream(run / "metrics.jsonl") << "{\"step\": 1}\n";
  std::ofstream(run / "plan.json") << "{}";
  const auto kept = set_aside_previous_run(spec);
  ASSERT_TRUE(kept.has_value());
  EXPECT_EQ(*kept, (run / "previous-1").string());
  EXPECT_TRUE(fs::exists(run / "previous-1/metrics.jsonl"));
  EXPECT_TRUE(fs::exists(run / "previous-1/plan.json"));
  EXPECT_TRUE(fs::exists(run / "previous-1/ckpt/actor"));
  EXPECT_FALSE(fs::exists(run / "metrics.jsonl"));
  std::ofstream(run / "metrics.jsonl") << "{\"step\": 2}\n";
  EXPECT_EQ(set_aside_previous_run(spec).value_or(""), (run / "previous-2").string());
  EXPECT_TRUE(fs::exists(run / "previous-1/metrics.jsonl")) << "earlier copies stay";
  // An exported model is kept too; a ckpt.path outside the run directory is renamed beside
  // itself (a move into the run directory could cross filesystems).
  fs::create_directories(run / "export/actor");
  const fs::path outside = parent / "shared-ckpt";
  fs::create_directories(outside / "actor");
  const JobSpec custom = JobSpec::parse(
      base_spec().dump(), "job.json",
      {"logger.run_dir=" + parent.string(), "name=job", "ckpt.path=" + outside.string()});
  EXPECT_EQ(set_aside_previous_run(custom).value_or(""), (run / "previous-3").string());
  EXPECT_TRUE(fs::exists(run / "previous-3/export/actor"));
  EXPECT_TRUE(fs::exists(parent / "shared-ckpt-previous-3/actor"));
  EXPECT_FALSE(fs::exists(outside));
}

TEST(Spec, CommentsAreAllowed) {
  EXPECT_TRUE(problems_of("// a job\n" + base_spec().dump()).empty());
}

TEST(SpecSchema, EveryDefaultPassesItsOwnCheck) {
  for (const auto& k : spec_keys()) EXPECT_EQ(k.check(k.default_value), "") << k.path;
}

TEST(SpecSchema, EveryKeyIsDocumented) {
  for (const auto& k : spec_keys()) EXPECT_GT(k.doc.size(), 10u) << k.path;
}

TEST(SpecSchema, CommittedReferenceMatchesTheTable) {
  std::ifstream in(std::string(RLHF_SOURCE_DIR) + "/docs/job-spec.md");
  ASSERT_TRUE(in) << "docs/job-spec.md missing";
  std::stringstream buf;
  buf << in.rdbuf();
  EXPECT_EQ(buf.str(), spec_markdown()) << "docs/job-spec.md is stale: regenerate with "
                                           "build/cli/rlhf spec --markdown > docs/job-spec.md";
}

}  // namespace
}  // namespace rlhf

namespace rlhf {
namespace {

JobSpec patched(const std::string& patch) {
  json doc = base_spec();
  doc.merge_patch(json::parse(patch));
  return JobSpec::parse(doc.dump(), "job.json");
}

// dtype "auto": bf16 on cuda nodes, and on CPUs only with AMX-BF16 units (read here from
// /proc/cpuinfo as the rule does: AVX512-BF16 alone computed BF16 slower than FP32); a dtype
// the user gave is kept; the choice is noted.
TEST(Spec, AutoDtypeFollowsTheNodeAndTheCpu) {
  std::ifstream in("/proc/cpuinfo");
  std::string text((std::istreambuf_iterator<char>(in)), {});
  const bool units = text.find(" amx_bf16") != std::string::npos;
  const JobSpec cpu = patched(R"({"ref": {"dtype": "bf16"}})");
  EXPECT_EQ(cpu.get_string("actor.dtype"), units ? "bf16" : "fp32");
  EXPECT_EQ(cpu.get_string("ref.dtype"), "bf16");
  ASSERT_EQ(cpu.notes().size(), 1u);
  EXPECT_NE(cpu.notes()[0].find("compute dtype (auto): actor "), std::string::npos);
  EXPECT_EQ(cpu.notes()[0].find("ref "), std::string::npos) << cpu.notes()[0];
  const JobSpec gpu = patched(
      R"({"cluster": {"nodes": [{"name": "g", "kind": "cuda", "devices": 6, "memory_gb": 80}]}})");
  for (const char* role : {"actor", "critic", "reward", "ref", "rollout"})
    EXPECT_EQ(gpu.get_string(std::string(role) + ".dtype"), "bf16") << role;
}

TEST(Spec, RewardSourcesExpandShorthandsAndDecideTheRewardGroup) {
  // reward.model alone is the source; beside a rule it is only the critic's default.
  auto names = [](const JobSpec& s) {
    std::vector<std::string> out;
    for (const auto& src : rewards::reward_sources(s.json())) out.push_back(src["name"]);
    return out;
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(names(patched("{}")), V{"model"});
  const JobSpec rule = patched(R"({"reward": {"rule": "math", "python": "r.py:f"}})");
  EXPECT_EQ(names(rule), (V{"math", "f"}));
  EXPECT_FALSE(rule.uses(Role::kReward));
  // A list: weights, default names, repeats suffixed; a model entry starts the reward group.
  const JobSpec list = patched(R"({"reward": {"model": "", "sources": [
      {"rule": "math"}, {"rule": "math", "weight": 0.5}, {"model": "m/rm2", "name": "rm"},
      {"remote_url": "http://127.0.0.1:1/"}]}})");
  EXPECT_EQ(names(list), (V{"math", "math_2", "rm", "remote"}));
  EXPECT_DOUBLE_EQ(rewards::reward_sources(list.json())[1]["weight"].get<double>(), 0.5);
  EXPECT_TRUE(list.uses(Role::kReward));
  EXPECT_EQ(list.get_string("reward.model"), "m/rm2");
  // One problem per mistake, naming the entry.
  auto problems = [](const std::string& patch) {
    try {
      patched(patch);
    } catch (const SpecError& e) {
      std::string all;
      for (const auto& p : e.problems()) all += p.path + ": " + p.message + "\n";
      return all;
    }
    return std::string();
  };
  EXPECT_NE(problems(R"({"reward": {"sources": [{"rule": "math", "python": "a.py:f"}]}})")
                .find("reward.sources[0]: expected exactly one of"),
            std::string::npos);
  EXPECT_NE(problems(R"({"reward": {"rule": "math", "sources": [{"rule": "math"}]}})")
                .find("reward.rule: set either reward.sources or the single-source keys"),
            std::string::npos);
  EXPECT_NE(
      problems(R"({"reward": {"python": "rewards:f"}})").find("expected \"FILE.py:FUNCTION\""),
      std::string::npos);
  EXPECT_NE(problems(R"({"reward": {"sources": [{"model": "a"}, {"model": "a"}]}})")
                .find("at most one reward model source"),
            std::string::npos);
}

}  // namespace
}  // namespace rlhf
