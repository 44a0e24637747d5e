// How long each worker has had work in hand: a worker is busy from the moment a request is
// submitted to it while it had none until its last outstanding request is answered (the
// union of its requests' intervals; a worker serves its requests one at a time, so this is
// its occupancy, the transport of the request and reply included). Drivers difference two
// readings to get a step's busy and idle seconds per worker, and read each worker's busy
// intervals of a window (the lanes of a step's timeline).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <utility>
#include <vector>

namespace rlhf {

class BusyClock {
 public:
  using Clock = std::chrono::steady_clock;
  using Interval = std::pair<Clock::time_point, Clock::time_point>;
  // Finished intervals kept per worker until a window reads past them: a job that never reads
  // them (no timeline) keeps the latest ones only.
  static constexpr size_t kMaxIntervals = 4096;

  explicit BusyClock(size_t workers = 0) : workers_(workers) {}
  void resize(size_t workers) { workers_.resize(workers); }

  void started(size_t worker, Clock::time_point now) {
    Worker& w = workers_.at(worker);
    if (w.outstanding++ == 0) w.since = now;
  }
  void finished(size_t worker, Clock::time_point now) {
    Worker& w = workers_.at(worker);
    if (w.outstanding == 0) return;  // an answer to nothing outstanding: not counted
    if (--w.outstanding == 0) {
      w.closed += std::chrono::duration<double>(now - w.since).count();
      if (w.intervals.size() == kMaxIntervals) w.intervals.erase(w.intervals.begin());
      w.intervals.emplace_back(w.since, now);
    }
  }
  // Each worker's busy seconds from its first request up to `now` (an open interval counted
  // up to `now`).
  // Each worker's busy intervals that end after `since`, clipped to [since, now], as seconds
  // from `since` (an open one ends at `now`); intervals that ended before `since` are dropped
  // for good (windows are read in order).
  std::vector<std::vector<std::pair<double, double>>> intervals(Clock::time_point since,
                                                                Clock::time_point now) {
    std::vector<std::vector<std::pair<double, double>>> out(workers_.size());
    auto offset = [since](Clock::time_point t) {
      return std::max(0.0, std::chrono::duration<double>(t - since).count());
    };
    for (size_t i = 0; i < workers_.size(); ++i) {
      Worker& w = workers_[i];
      std::vector<Interval> kept;
      for (const auto& [from, to] : w.intervals) {
        if (to <= since) continue;
        out[i].emplace_back(offset(from), offset(to));
        kept.emplace_back(from, to);
      }
      w.intervals = std::move(kept);
      if (w.outstanding > 0) out[i].emplace_back(offset(w.since), offset(now));
    }
    return out;
  }
  std::vector<double> seconds(Clock::time_point now) const {
    std::vector<double> out;
    out.reserve(workers_.size());
    for (const Worker& w : workers_)
      out.push_back(w.closed +
                    (w.outstanding > 0 ? std::chrono::duration<double>(now - w.since).count() : 0));
    return out;
  }

 private:
  struct Worker {
    int outstanding = 0;
    Clock::time_point since;          // when `outstanding` last rose from 0
    double closed = 0;                // seconds of finished busy intervals
    std::vector<Interval> intervals;  // finished ones not yet read past (intervals())
  };
  std::vector<Worker> workers_;
};

}  // namespace rlhf
