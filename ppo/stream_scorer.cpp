// Scoring lanes of a streaming rollout. See stream_scorer.h.
#include "ppo/stream_scorer.h"

#include <algorithm>
#include <utility>

namespace rlhf::ppo::job {

struct StreamScorer::Lane {
  Role role;
  Call call;
  // Rows waiting for the lane: their positions and tensors, chunk by chunk.
  std::vector<torch::Tensor> index;
  std::vector<std::vector<NamedTensor>> rows;
  // What it scored: per call, the positions and the reply.
  std::vector<std::pair<torch::Tensor, Message>> done;
  double compute_s = 0;
  bool busy = false;
  std::exception_ptr error;
  std::thread thread;
};

StreamScorer::StreamScorer(std::map<Role, Call> calls, int64_t rows) : rows_(rows) {
  for (auto& [role, call] : calls) {
    auto lane = std::make_unique<Lane>();
    lane->role = role;
    lane->call = std::move(call);
    lanes_.push_back(std::move(lane));
  }
  for (auto& lane : lanes_) lane->thread = std::thread([this, l = lane.get()] { run(*l); });
}

StreamScorer::~StreamScorer() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    closed_ = true;
  }
  changed_.notify_all();
  for (auto& lane : lanes_)
    if (lane->thread.joinable()) lane->thread.join();
}

void StreamScorer::add(const torch::Tensor& index, const std::vector<NamedTensor>& rows) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& lane : lanes_) {
      lane->index.push_back(index);
      lane->rows.push_back(rows);
    }
  }
  changed_.notify_all();
}

namespace {

// Whether two chunks' tensors have the same sizes past their rows.
bool same_widths(const std::vector<NamedTensor>& a, const std::vector<NamedTensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t t = 0; t < a.size(); ++t)
    if (a[t].tensor.sizes().slice(1) != b[t].tensor.sizes().slice(1)) return false;
  return true;
}

}  // namespace

void StreamScorer::run(Lane& lane) {
  while (true) {
    std::vector<torch::Tensor> index;
    std::vector<std::vector<NamedTensor>> chunks;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      changed_.wait(lock, [&] { return closed_ || !lane.index.empty(); });
      if (closed_) return;  // finish() has taken what was scored; the rest is not wanted
      if (lane.error) {     // a failed lane scores nothing more; finish() rethrows
        lane.index.clear();
        lane.rows.clear();
        continue;
      }
      index = std::exchange(lane.index, {});
      chunks = std::exchange(lane.rows, {});
      lane.busy = true;
    }
    try {
      // Every row that came while the last call ran, in one call per run of chunks of one
      // width (refill batches of dynamic sampling have their own prompt lengths).
      for (size_t begin = 0, end = 0; begin < chunks.size(); begin = end) {
        end = begin + 1;
        while (end < chunks.size() && same_widths(chunks[end], chunks[begin])) ++end;
        std::vector<NamedTensor> rows;
        for (size_t t = 0; t < chunks[begin].size(); ++t) {
          std::vector<torch::Tensor> parts;
          for (size_t c = begin; c < end; ++c) parts.push_back(chunks[c][t].tensor);
          rows.push_back({chunks[begin][t].name, torch::cat(parts, 0)});
        }
        auto [reply, compute] = lane.call(rows);
        const auto rows_of = std::vector<torch::Tensor>(index.begin() + begin, index.begin() + end);
        std::lock_guard<std::mutex> lock(mutex_);
        lane.done.emplace_back(torch::cat(rows_of, 0), std::move(reply));
        lane.compute_s += compute;
      }
      std::lock_guard<std::mutex> lock(mutex_);
      lane.busy = false;
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      lane.error = std::current_exception();
      lane.busy = false;
    }
    changed_.notify_all();
  }
}

std::map<Role, Message> StreamScorer::finish(double& compute_s) {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] {
      for (const auto& lane : lanes_)
        if (!lane->error && (lane->busy || !lane->index.empty())) return false;
      return true;
    });
    for (const auto& lane : lanes_)
      if (lane->error) std::rethrow_exception(lane->error);
  }
  std::map<Role, Message> out;
  compute_s = 0;
  for (const auto& lane : lanes_) {
    compute_s = std::max(compute_s, lane->compute_s);
    Message& m = out[lane->role];
    if (lane->done.empty()) continue;
    for (const auto& t : lane->done.front().second.tensors) {
      const torch::Tensor& first = t.tensor;
      std::vector<int64_t> shape(first.sizes().begin(), first.sizes().end());
      shape[0] = rows_;
      torch::Tensor all = torch::zeros(shape, first.options());
      for (const auto& [index, reply] : lane->done) all.index_copy_(0, index, reply.tensor(t.name));
      m.add(t.name, all);
    }
  }
  return out;
}

}  // namespace rlhf::ppo::job
