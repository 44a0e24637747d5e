// Process checks for tests of code that starts processes (pyhost pools, environments, jobs):
// this process's children and liveness by pid, read from /proc rather than trusting the code's
// own account.
#pragma once

#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

namespace rlhf::test {

inline std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Processes whose parent is this one, zombies included (an unreaped child still counts).
inline std::set<pid_t> children_of_this_process() {
  std::set<pid_t> children;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string stat = read_text(entry.path() / "stat");  // pid (comm) state ppid ...
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(stat.substr(close + 1));
    std::string state;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (ppid == ::getpid()) children.insert(static_cast<pid_t>(std::stoi(name)));
  }
  return children;
}

// True while `pid` runs (a zombie runs nothing and counts as gone).
inline bool pid_alive(pid_t pid) {
  if (pid <= 0 || ::kill(pid, 0) != 0) return false;
  const std::string stat = read_text("/proc/" + std::to_string(pid) + "/stat");
  const size_t close = stat.rfind(')');
  return close == std::string::npos || close + 2 >= stat.size() || stat[close + 2] != 'Z';
}

}  // namespace rlhf::test
