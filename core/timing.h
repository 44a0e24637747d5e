// Wall-clock intervals on the steady clock, the one every phase time, ETA and benchmark
// figure is measured with (never the system clock, which can jump).
#pragma once

#include <chrono>

namespace rlhf {

// Seconds from `start` to now on the steady clock.
inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace rlhf
