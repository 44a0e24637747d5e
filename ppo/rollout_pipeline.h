// The asynchronous pipeline of algo.max_staleness k > 0 (issue 42.2): a producer thread
// draws the steps' samples in step order while the driver scores, trains and syncs, and
// never runs more than k weight versions ahead of the step that trains them. Step s trains
// the policy of version s - first (the versions the actor synced in this run, counted from
// the weights it started with); step s's samples start once the rollout holds version
// >= s - first - k, so their oldest token is at most k versions stale (later tokens are
// newer with in-flight updates). The rollout waits only when going on would break the
// bound. With k = 1 this is the one-step schedule (step s + 1 is generated with the weights
// before step s's update, while step s scores and trains).
//
// Without partial rollouts a weight sync waits for the generate call in progress to end and
// holds the next one (before_sync, synced); with them the sync goes at once and the rollout
// applies it between two decode steps (rollout/worker_ops.h, Generate::in_flight_updates).
// Private to rlhf_ppo_driver.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "ppo/rollout_data.h"

namespace rlhf::ppo::job {

class RolloutPipeline {
 public:
  using Draw = std::function<Rollout(int64_t step)>;
  // Draws steps first..last with `draw` (ExperienceMaker::sample) on its own thread.
  RolloutPipeline(Draw draw, int64_t first, int64_t last, int64_t max_staleness, bool partial);
  // Stops drawing after the call in progress (whose role-group call ends or fails with the
  // job) and joins.
  ~RolloutPipeline();
  RolloutPipeline(const RolloutPipeline&) = delete;
  RolloutPipeline& operator=(const RolloutPipeline&) = delete;

  // The samples of `step` (steps are taken in order), waiting for them; rethrows the
  // producer's failure.
  Rollout take(int64_t step);
  // Around each weight sync: before_sync (without partial rollouts: waits for the generate
  // call in progress and holds the next), synced (one version more on the rollout).
  void before_sync();
  void synced();
  // Around calls of the driver's own to the rollout group (held-out evaluation): waits for the
  // generate call in progress and holds the next until resume(), so no engine takes two
  // callers' requests in different orders (a tensor-parallel engine's ranks must agree).
  void pause();
  void resume();

 private:
  void produce();

  Draw draw_;
  const int64_t first_, last_, k_;
  const bool partial_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<int64_t, Rollout> ready_;
  std::exception_ptr error_;
  int64_t versions_ = 0;     // syncs since the start
  bool generating_ = false;  // a draw is in progress
  bool holding_ = false;     // a sync without partial rollouts, or pause(), holds the next draw
  bool stop_ = false;
  std::thread thread_;  // last: starts once the rest is set
};

}  // namespace rlhf::ppo::job
