#include "scheduler/progress.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <sstream>

namespace rlhf {

PhaseProgress::~PhaseProgress() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (ticker_.joinable()) ticker_.join();
}

void PhaseProgress::attach(std::ostream& out, std::chrono::milliseconds quiet,
                           std::chrono::milliseconds every) {
  if (const char* env = std::getenv("RLHF_PROGRESS_AFTER_S")) {
    char* end = nullptr;
    const double s = std::strtod(env, &end);
    if (end != env && s >= 0) quiet = std::chrono::milliseconds(static_cast<int64_t>(s * 1000));
  }
  std::lock_guard<std::mutex> lock(mutex_);
  out_ = &out;
  quiet_ = quiet;
  every_ = every;
  if (!ticker_.joinable()) ticker_ = std::thread([this] { tick(); });
}

void PhaseProgress::begin(const std::string& phase) {
  std::lock_guard<std::mutex> lock(mutex_);
  phase_ = phase;
  counts_.clear();
  started_ = Clock::now();
  next_print_ = started_ + quiet_;
  if (out_ && !phase.empty() && quiet_.count() == 0) {
    *out_ << line_locked(started_) << std::endl;
    next_print_ = started_ + every_;
  }
}

void PhaseProgress::count(const std::string& what, int64_t done, int64_t total) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!phase_.empty()) counts_[what] = {done, total};
}

std::string PhaseProgress::line_locked(Clock::time_point now) const {
  std::ostringstream line;
  line << "  ... " << phase_ << " ("
       << clock_time(std::chrono::duration<double>(now - started_).count());
  for (const auto& [what, n] : counts_) line << ", " << what << " " << n.first << "/" << n.second;
  line << ")";
  return line.str();
}

void PhaseProgress::tick() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    wake_.wait_for(lock, std::chrono::milliseconds(250));
    if (stop_ || !out_ || phase_.empty()) continue;
    const auto now = Clock::now();
    if (now < next_print_) continue;
    *out_ << line_locked(now) << std::endl;
    next_print_ = now + every_;
  }
}

std::string clock_time(double seconds) {
  const auto total = static_cast<int64_t>(std::llround(std::max(0.0, seconds)));
  const int64_t h = total / 3600, m = total / 60 % 60, s = total % 60;
  std::ostringstream out;
  if (h > 0) out << h << ':' << (m < 10 ? "0" : "");
  out << m << ':' << (s < 10 ? "0" : "") << s;
  return out.str();
}

std::string elapsed_and_eta(double elapsed_s, int64_t done, int64_t total) {
  std::string out = "elapsed " + clock_time(elapsed_s) + " | eta ";
  if (done <= 0) return out + "-";
  return out + clock_time(elapsed_s / static_cast<double>(done) *
                          static_cast<double>(std::max<int64_t>(0, total - done)));
}

}  // namespace rlhf
