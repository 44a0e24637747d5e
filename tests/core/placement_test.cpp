// Placement: workers per device, ranks, nodes, colocation, automatic devices, environment.
#include "core/placement.h"

#include <gtest/gtest.h>

namespace rlhf {
namespace {

using nlohmann::json;

JobSpec spec_of(const std::string& patch) {
  json doc = json::parse(R"({
    "cluster": {"nodes": [{"name": "a", "host": "10.0.0.1", "kind": "cuda", "devices": 4,
        "memory_gb": 80},
                          {"name": "b", "host": "10.0.0.2", "kind": "cuda", "devices": 4,
                              "memory_gb": 80}]},
    "actor": {"model": "m", "devices": {"a": [0, 1], "b": [0, 1]}},
    "critic": {"model": "c", "devices": {"a": [2]}},
    "reward": {"model": "r", "devices": {"a": [3]}},
    "ref": {"devices": {"b": [2]}},
    "rollout": {"devices": {"b": [3]}, "batch_size": 16},
    "data": {"prompt_dataset": "synthetic:x", "prompt_max_len": 8, "max_len": 1040},
    "train": {"batch_size": 16, "micro_batch_size": 2}
  })");
  doc.merge_patch(json::parse(patch));
  return JobSpec::parse(doc.dump(), "job.json");
}

TEST(Placement, OneWorkerPerDeviceAcrossNodes) {
  Placement p = place(spec_of("{}"));
  ASSERT_EQ(p.workers.size(), 8u);
  auto actor = p.group(Role::kActor);
  ASSERT_EQ(actor.size(), 4u);
  // Ranks follow node order, then the listed order of ids.
  const char* nodes[] = {"a", "a", "b", "b"};
  const char* hosts[] = {"10.0.0.1", "10.0.0.1", "10.0.0.2", "10.0.0.2"};
  const int ids[] = {0, 1, 0, 1};
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(actor[r].rank, r);
    EXPECT_EQ(actor[r].group_size, 4);
    EXPECT_EQ(actor[r].node, nodes[r]);
    EXPECT_EQ(actor[r].host, hosts[r]);
    EXPECT_EQ(actor[r].device_id, ids[r]);
    EXPECT_EQ(actor[r].torch_device(), "cuda:0");
  }
  EXPECT_EQ(p.group_size(Role::kCritic), 1);
  EXPECT_EQ(p.group(Role::kRollout)[0].node, "b");
}

TEST(Placement, EnvironmentPerWorker) {
  Placement p = place(spec_of(R"({"cluster": {"threads_per_worker": 3}})"));
  const WorkerPlacement w = p.group(Role::kActor)[3];
  EXPECT_EQ(w.env.at(kEnvRole), "actor");
  EXPECT_EQ(w.env.at(kEnvRank), "3");
  EXPECT_EQ(w.env.at(kEnvWorldSize), "4");
  EXPECT_EQ(w.env.at(kEnvNode), "b");
  EXPECT_EQ(w.env.at(kEnvDevice), "cuda:1");
  EXPECT_EQ(w.env.at("CUDA_VISIBLE_DEVICES"), "1");
  EXPECT_EQ(w.env.at("OMP_NUM_THREADS"), "3");
  EXPECT_EQ(w.label(), "actor[3]");
  EXPECT_EQ(w.env.count(kEnvCpuAffinity), 0u) << "no cpu_affinity: any core";
}

// Issue 42.5: <role>.cpu_affinity pins every worker of the role to the listed cores.
TEST(Placement, CpuAffinityReachesEveryWorkerOfTheRole) {
  Placement p =
      place(spec_of(R"({"actor": {"cpu_affinity": [2, 3]}, "rollout": {"cpu_affinity": [0]}})"));
  for (const auto& w : p.group(Role::kActor)) EXPECT_EQ(w.env.at(kEnvCpuAffinity), "2,3");
  EXPECT_EQ(p.group(Role::kRollout)[0].env.at(kEnvCpuAffinity), "0");
}

TEST(Placement, CpuSlotsGetNoCudaVisibleDevices) {
  Placement p = place(spec_of(
      R"({"cluster": {"nodes": [{"name": "a", "devices": 8}, {"name": "b", "devices": 8}]}})"));
  for (const auto& w : p.workers) {
    EXPECT_EQ(w.env.count("CUDA_VISIBLE_DEVICES"), 0u) << w.label();
    EXPECT_EQ(w.torch_device(), "cpu");
    EXPECT_EQ(w.env.at(kEnvDevice), "cpu:" + std::to_string(w.device_id));
  }
}

TEST(Placement, ColocatedRoleSharesTargetDevices) {
  Placement p = place(spec_of(R"({"rollout": {"devices": [], "colocate_with": "actor"}})"));
  auto rollout = p.group(Role::kRollout);
  auto actor = p.group(Role::kActor);
  ASSERT_EQ(rollout.size(), actor.size());
  for (size_t i = 0; i < rollout.size(); ++i) {
    EXPECT_EQ(rollout[i].node, actor[i].node);
    EXPECT_EQ(rollout[i].device_id, actor[i].device_id);
    EXPECT_EQ(rollout[i].colocated_with, "actor");
  }
}

TEST(Placement, AutomaticDevicesTakeFreeSlotsInRoleOrder) {
  // Nothing named: each used role gets the next free device of the default 8-slot cpu node.
  JobSpec s = JobSpec::parse(R"({"actor": {"model": "m"}, "reward": {"rule": "letters"},
      "algo": {"advantage": {"estimator": "reinforce"}},
      "rollout": {"batch_size": 16}, "train": {"batch_size": 16},
      "data": {"prompt_dataset": "synthetic:x"}})",
                             "job.json");
  Placement p = place(s);
  ASSERT_EQ(p.workers.size(), 3u);  // actor, ref, rollout
  EXPECT_EQ(p.group(Role::kActor)[0].device_id, 0);
  EXPECT_EQ(p.group(Role::kRef)[0].device_id, 1);
  EXPECT_EQ(p.group(Role::kRollout)[0].device_id, 2);
  // The resolved spec records the choice, so printing and re-reading it places the same way.
  EXPECT_EQ(s.at("ref.devices"), json::parse("[1]"));
}

TEST(Placement, ExplicitDevicesAreReservedBeforeAutomaticOnes) {
  JobSpec s = JobSpec::parse(R"({"actor": {"model": "m"}, "reward": {"rule": "letters"},
      "algo": {"advantage": {"estimator": "reinforce"}}, "rollout": {"devices": [0],
          "batch_size": 16},
      "train": {"batch_size": 16}, "data": {"prompt_dataset": "synthetic:x"}})",
                             "job.json");
  Placement p = place(s);
  EXPECT_EQ(p.group(Role::kRollout)[0].device_id, 0);
  EXPECT_EQ(p.group(Role::kActor)[0].device_id, 1);
  EXPECT_EQ(p.group(Role::kRef)[0].device_id, 2);
}

}  // namespace
}  // namespace rlhf
