// Console progress of a job's long phases. A driver names the phase it enters ("step 3/30:
// generating"); role groups count the calls they finish ("rollout generate 3/8"); a ticker
// thread prints one line when a phase has lasted longer than `quiet`, then every `every`,
// so a fast job prints nothing extra and a slow one is never silent. Knows no algorithm.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <ostream>
#include <string>
#include <thread>

namespace rlhf {

class PhaseProgress {
 public:
  using Clock = std::chrono::steady_clock;
  PhaseProgress() = default;
  ~PhaseProgress();  // stops the ticker
  PhaseProgress(const PhaseProgress&) = delete;
  PhaseProgress& operator=(const PhaseProgress&) = delete;

  // Prints to `out` from now on: a phase still running after `quiet` gets a line, then one
  // every `every`; with quiet 0 each phase's line is printed as it begins. The environment
  // variable RLHF_PROGRESS_AFTER_S overrides `quiet` (tests set 0).
  void attach(std::ostream& out, std::chrono::milliseconds quiet = std::chrono::seconds(5),
              std::chrono::milliseconds every = std::chrono::seconds(15));
  // Enters a phase (clears the counts of the previous one); "" leaves every phase.
  void begin(const std::string& phase);
  void end() { begin(""); }
  // `done` of `total` calls of `what` ("rollout generate") finished in the current phase.
  void count(const std::string& what, int64_t done, int64_t total);

 private:
  void tick();
  std::string line_locked(Clock::time_point now) const;

  std::mutex mutex_;
  std::condition_variable wake_;
  std::ostream* out_ = nullptr;
  std::chrono::milliseconds quiet_{5000}, every_{15000};
  std::string phase_;
  Clock::time_point started_{}, next_print_{};
  std::map<std::string, std::pair<int64_t, int64_t>> counts_;
  bool stop_ = false;
  std::thread ticker_;
};

// "0:07", "12:03", "1:02:03": a duration for console lines.
std::string clock_time(double seconds);

// "elapsed 0:07 | eta 1:03" after `done` of `total` steps took `elapsed_s` (ETA: the mean
// step time so far times the steps left; "eta -" before the first step).
std::string elapsed_and_eta(double elapsed_s, int64_t done, int64_t total);

}  // namespace rlhf
