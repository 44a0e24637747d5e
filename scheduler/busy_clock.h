// How long each worker has had work in hand: a worker is busy from the moment a request is
// submitted to it while it had none until its last outstanding request is answered (the
// union of its requests' intervals; a worker serves its requests one at a time, so this is
// its occupancy, the transport of the request and reply included). Drivers difference two
// readings to get a step's busy and idle seconds per worker.
#pragma once

#include <chrono>
#include <cstddef>
#include <vector>

namespace rlhf {

class BusyClock {
 public:
  using Clock = std::chrono::steady_clock;

  explicit BusyClock(size_t workers = 0) : workers_(workers) {}
  void resize(size_t workers) { workers_.resize(workers); }

  void started(size_t worker, Clock::time_point now) {
    Worker& w = workers_.at(worker);
    if (w.outstanding++ == 0) w.since = now;
  }
  void finished(size_t worker, Clock::time_point now) {
    Worker& w = workers_.at(worker);
    if (w.outstanding == 0) return;  // an answer to nothing outstanding: not counted
    if (--w.outstanding == 0) w.closed += std::chrono::duration<double>(now - w.since).count();
  }
  // Each worker's busy seconds from its first request up to `now` (an open interval counted
  // up to `now`).
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
    Clock::time_point since;  // when `outstanding` last rose from 0
    double closed = 0;        // seconds of finished busy intervals
  };
  std::vector<Worker> workers_;
};

}  // namespace rlhf
