// Process memory as Linux and malloc report it, for the benchmarks that measure memory:
// resident set now, its high-water mark, resetting that mark (clear_refs 5), the bytes malloc
// has handed out, and running a measurement in a child process whose malloc returns freed
// blocks to the OS at once.
#pragma once

#include <malloc.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

namespace rlhf::bench {

// Resident set size in bytes (/proc/self/statm).
inline double rss_bytes() {
  std::ifstream statm("/proc/self/statm");
  long pages_total = 0, pages_resident = 0;
  statm >> pages_total >> pages_resident;
  return static_cast<double>(pages_resident) * static_cast<double>(::sysconf(_SC_PAGESIZE));
}

// Bytes malloc has handed out and not had back (mallinfo2: arenas + mmap'd blocks), every
// thread's arena included. Unlike the resident set it leaves out mapped files (a checkpoint's
// pages) and freed memory malloc keeps: the measured size of what the process holds.
inline double heap_bytes() {
  const struct mallinfo2 info = ::mallinfo2();
  return static_cast<double>(info.uordblks + info.hblkhd);
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

// Runs `measure` (returning `count` doubles) in a forked child whose malloc mmaps every
// block >= 64 KiB, so freed memory leaves the process at once and VmHWM sees each peak
// rather than a heap that only grows; the parent gets the doubles through a pipe. nullopt,
// with a line on stderr, when the child fails.
template <typename F>
std::optional<std::vector<double>> measure_in_child(size_t count, F measure) {
  int fds[2];
  if (::pipe(fds) != 0) {
    std::perror("pipe");
    return std::nullopt;
  }
  std::fflush(stdout);
  const pid_t pid = ::fork();
  if (pid < 0) {
    std::perror("fork");
    return std::nullopt;
  }
  if (pid == 0) {
    ::close(fds[0]);
    if (::mallopt(M_MMAP_THRESHOLD, 64 * 1024) != 1 || ::mallopt(M_TRIM_THRESHOLD, 64 * 1024) != 1)
      ::_exit(3);
    const std::vector<double> out = measure();
    const auto bytes = static_cast<ssize_t>(out.size() * sizeof(double));
    if (out.size() != count || ::write(fds[1], out.data(), static_cast<size_t>(bytes)) != bytes)
      ::_exit(5);
    ::_exit(0);
  }
  ::close(fds[1]);
  std::vector<double> got(count);
  size_t done = 0;
  const size_t want = count * sizeof(double);
  for (ssize_t n; done < want && (n = ::read(fds[0], reinterpret_cast<char*>(got.data()) + done,
                                             want - done)) > 0;)
    done += static_cast<size_t>(n);
  ::close(fds[0]);
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid || done != want || !WIFEXITED(status) ||
      WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "measurement child failed (status %d)\n", status);
    return std::nullopt;
  }
  return got;
}

}  // namespace rlhf::bench
