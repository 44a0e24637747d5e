// Multi-process benchmarks (one process per rank, this benchmark's own binary in a child
// mode): start them, wait for every one, and read the JSON each wrote to its file. The one
// way bench/ programs start their children (posix_spawn of a fresh process: nothing of the
// parent's threads or torch state is inherited, as a bare fork would).
#pragma once

#include <spawn.h>
#include <sys/types.h>
#include <sys/wait.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

extern char** environ;

namespace rlhf::bench {

// Starts `args` (args[0] the program, a path) with this environment; returns its pid. Throws
// std::runtime_error naming the program when it cannot start.
inline pid_t start_process(std::vector<std::string> args) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  if (posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ) != 0)
    throw std::runtime_error("cannot start " + args.at(0));
  return pid;
}

// Waits for `pid`; throws std::runtime_error "<what> failed" unless it exited with status 0.
inline void wait_process(pid_t pid, const std::string& what) {
  int status = 0;
  if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw std::runtime_error(what + " failed");
}

// argvs[r] (argv[0] the program) for rank r, which writes its JSON to outputs[r]. Throws
// naming `what` and the rank when one cannot start or exits non-zero.
inline std::vector<nlohmann::json> run_rank_processes(std::vector<std::vector<std::string>> argvs,
                                                      const std::vector<std::string>& outputs,
                                                      const std::string& what) {
  std::vector<pid_t> pids;
  for (auto& args : argvs) pids.push_back(start_process(args));
  for (size_t r = 0; r < pids.size(); ++r)
    wait_process(pids[r], what + " rank " + std::to_string(r));
  std::vector<nlohmann::json> out;
  for (const auto& path : outputs) {
    std::ifstream in(path);
    out.push_back(nlohmann::json::parse(in));
  }
  return out;
}

}  // namespace rlhf::bench
