// Process memory as Linux reports it, for the benchmarks that measure activation memory:
// resident set now, its high-water mark, and resetting that mark (clear_refs 5).
#pragma once

#include <unistd.h>

#include <fstream>
#include <string>

namespace rlhf::bench {

// Resident set size in bytes (/proc/self/statm).
inline double rss_bytes() {
  std::ifstream statm("/proc/self/statm");
  long pages_total = 0, pages_resident = 0;
  statm >> pages_total >> pages_resident;
  return static_cast<double>(pages_resident) * static_cast<double>(::sysconf(_SC_PAGESIZE));
}

// Peak resident set since start or the last reset_hwm() (VmHWM), in bytes; -1 if unknown.
inline double hwm_bytes() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) * 1024.0;
  return -1;
}

// Resets VmHWM to the current RSS; false when the kernel refuses.
inline bool reset_hwm() {
  std::ofstream clear("/proc/self/clear_refs");
  clear << "5";
  clear.flush();
  return static_cast<bool>(clear);
}

}  // namespace rlhf::bench
