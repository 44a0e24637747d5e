// The producer of algo.max_staleness k > 0. See rollout_pipeline.h.
#include "ppo/rollout_pipeline.h"

#include <utility>

namespace rlhf::ppo::job {

RolloutPipeline::RolloutPipeline(Draw draw, int64_t first, int64_t last, int64_t max_staleness,
                                 bool partial)
    : draw_(std::move(draw)),
      first_(first),
      last_(last),
      k_(max_staleness),
      partial_(partial),
      thread_([this] { produce(); }) {}

RolloutPipeline::~RolloutPipeline() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

void RolloutPipeline::produce() {
  for (int64_t step = first_; step <= last_; ++step) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      // The bound: the rollout holds version first + versions_, step trains version step.
      changed_.wait(lock, [&] { return stop_ || (versions_ >= step - first_ - k_ && !holding_); });
      if (stop_) return;
      generating_ = true;
    }
    try {
      Rollout r = draw_(step);
      std::lock_guard<std::mutex> lock(mutex_);
      generating_ = false;
      ready_.emplace(step, std::move(r));
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      generating_ = false;
      error_ = std::current_exception();
      changed_.notify_all();
      return;
    }
    changed_.notify_all();
  }
}

Rollout RolloutPipeline::take(int64_t step) {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [&] { return error_ || ready_.count(step) > 0; });
  if (ready_.count(step) == 0) std::rethrow_exception(error_);
  Rollout r = std::move(ready_.at(step));
  ready_.erase(step);
  return r;
}

void RolloutPipeline::before_sync() {
  if (!partial_) pause();
}

void RolloutPipeline::synced() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++versions_;
    holding_ = false;
  }
  changed_.notify_all();
}

void RolloutPipeline::pause() {
  std::unique_lock<std::mutex> lock(mutex_);
  holding_ = true;
  changed_.wait(lock, [&] { return !generating_ || error_; });
}

void RolloutPipeline::resume() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    holding_ = false;
  }
  changed_.notify_all();
}

}  // namespace rlhf::ppo::job
