// The one phase policy the ppo driver and the memory planner both read.
#include "engine/phase_policy.h"

#include <gtest/gtest.h>

namespace rlhf::engine {
namespace {

PhaseSettings colocated() {
  PhaseSettings s;
  s.rollout_colocated_with_actor = true;
  s.actor_offload_optimizer_while_generating = true;
  return s;
}

TEST(PhasePolicy, OnlyAColocatedGpuRolloutThatAlternatesGivesWay) {
  const PhasePolicy gpu = phase_policy(colocated(), /*rollout_on_gpu=*/true);
  EXPECT_TRUE(gpu.takes_turns);
  EXPECT_TRUE(gpu.rollout_sleeps);
  EXPECT_TRUE(gpu.actor_offloads_optimizer);
  // Host memory is the same memory on cpu nodes: nothing moves.
  const PhasePolicy cpu = phase_policy(colocated(), /*rollout_on_gpu=*/false);
  EXPECT_FALSE(cpu.takes_turns || cpu.rollout_sleeps || cpu.actor_offloads_optimizer);
  // With async steps the two run at once: nothing can give way.
  PhaseSettings async = colocated();
  async.async = true;
  const PhasePolicy overlap = phase_policy(async, true);
  EXPECT_FALSE(overlap.takes_turns || overlap.rollout_sleeps || overlap.actor_offloads_optimizer);
  // GPUs of their own: no turns.
  PhaseSettings apart = colocated();
  apart.rollout_colocated_with_actor = false;
  EXPECT_FALSE(phase_policy(apart, true).takes_turns);
}

TEST(PhasePolicy, EachOffloadFollowsItsOwnKey) {
  PhaseSettings s = colocated();
  s.rollout_offload_while_training = false;
  EXPECT_FALSE(phase_policy(s, true).rollout_sleeps);
  EXPECT_TRUE(phase_policy(s, true).actor_offloads_optimizer);
  s = colocated();
  s.actor_adam_offload = true;  // the states live on the host for good: nothing to move
  EXPECT_FALSE(phase_policy(s, true).actor_offloads_optimizer);
  EXPECT_TRUE(phase_policy(s, true).rollout_sleeps);
  s = colocated();
  s.actor_offload_optimizer_while_generating = false;
  EXPECT_FALSE(phase_policy(s, true).actor_offloads_optimizer);
}

}  // namespace
}  // namespace rlhf::engine
