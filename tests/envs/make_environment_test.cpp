// make_environment and EnvironmentConfig::from_spec: the env.* keys of a job spec to one of
// the three kinds, with the key named when the choice is wrong.
#include <gtest/gtest.h>

#include "core/errors.h"
#include "core/spec.h"
#include "envs/environment.h"
#include "tests/envs/process_checks.h"

namespace rlhf::envs {
namespace {

using nlohmann::json;
using testing::message_of;

const char* kSpec = R"({
  "kind": "ppo",
  "cluster": {"nodes": [{"name": "local", "kind": "cpu", "devices": 5, "memory_gb": 4}]},
  "actor": {"model": "m/actor", "devices": [0]},
  "critic": {"model": "m/critic", "devices": [1]},
  "reward": {"model": "m/rm", "devices": [2]},
  "ref": {"devices": [3]},
  "rollout": {"batch_size": 8, "micro_batch_size": 4, "n_samples_per_prompt": 2,
              "max_new_tokens": 16},
  "data": {"prompt_dataset": "synthetic:letters", "prompt_max_len": 16, "max_len": 32},
  "train": {"batch_size": 8, "micro_batch_size": 2},
  "env": {"builtin": "guess_number", "timeout_s": 5, "options": {"low": 3, "high": 3}}
})";

TEST(MakeEnvironment, FromTheJobSpec) {
  const JobSpec spec = JobSpec::parse(kSpec, "job.json");
  const EnvironmentConfig c = EnvironmentConfig::from_spec(spec);
  EXPECT_TRUE(c.enabled());
  EXPECT_EQ(c.builtin, "guess_number");
  EXPECT_EQ(c.timeout_s, 5);
  EXPECT_EQ(c.python_workers, 2);
  EXPECT_EQ(c.python_interpreter, "python3");
  EXPECT_EQ(c.options, json({{"low", 3}, {"high", 3}}));
  auto env = make_environment(c);
  EXPECT_EQ(env->name(), "builtin:guess_number");
  env->reset(0, json::object());
  env->step(0, "3");  // the only number in [3, 3]
  const auto ready = env->poll(0);
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].second.reward, 1);

  // The default spec has no environment.
  json plain = json::parse(kSpec);
  plain.erase("env");
  EXPECT_FALSE(EnvironmentConfig::from_spec(JobSpec::parse(plain.dump(), "job.json")).enabled());
}

TEST(MakeEnvironment, ExactlyOneKind) {
  EnvironmentConfig c;
  EXPECT_EQ(message_of<InputError>([&] { make_environment(c); }),
            "env: expected exactly one of env.builtin, env.python, env.url, found none");
  c.builtin = "calculator";
  c.url = "http://127.0.0.1:1/";
  EXPECT_EQ(message_of<InputError>([&] { make_environment(c); }),
            "env: expected exactly one of env.builtin, env.python, env.url, found 2");
}

}  // namespace
}  // namespace rlhf::envs
