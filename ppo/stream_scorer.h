// Scoring that starts while the rollout still generates (rollout.streaming, issue 42.1): the
// rows of each prompt group the rollout streams back (RoleGroup::scatter's PartHandler) go to
// the scorer groups that may score them now, one ordered lane per group: a lane takes every
// row that arrived while its previous call ran, so its calls grow with the stream instead of
// one per group, and one group never sees two calls at once (a ZeRO-3 scorer's ranks must take
// calls in one order). finish() waits for the lanes and gives each group's reply tensors in the
// step's row order. Private to rlhf_ppo_driver.
#pragma once

#include <torch/types.h>

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/spec.h"
#include "transport/message.h"

namespace rlhf::ppo::job {

class StreamScorer {
 public:
  // A group's call on some rows (their "sequences" and "attention_mask"): its gathered reply
  // and the worker compute on its critical path.
  using Call = std::function<std::pair<Message, double>(const std::vector<NamedTensor>& rows)>;
  // One lane per role of `calls`, for a step of `rows` rows.
  StreamScorer(std::map<Role, Call> calls, int64_t rows);
  // Stops the lanes after their call in progress, and joins them.
  ~StreamScorer();
  StreamScorer(const StreamScorer&) = delete;
  StreamScorer& operator=(const StreamScorer&) = delete;

  // Rows at positions `index` [k] of the step, with their tensors (k rows each).
  void add(const torch::Tensor& index, const std::vector<NamedTensor>& rows);
  // Waits for every lane to score every row added. Per role, its replies' tensors with the
  // step's rows in order (rows never added are zeros), and the sum of its calls' compute in
  // `compute_s` (the largest over roles). Rethrows a lane's failure.
  std::map<Role, Message> finish(double& compute_s);

 private:
  struct Lane;
  void run(Lane& lane);

  int64_t rows_;
  std::mutex mutex_;
  std::condition_variable changed_;
  bool closed_ = false;
  std::vector<std::unique_ptr<Lane>> lanes_;
};

}  // namespace rlhf::ppo::job
