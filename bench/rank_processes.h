// Multi-process benchmarks (one process per rank, this benchmark's own binary in a child
// mode): start them all, wait for every one, and read the JSON each wrote to its file.
#pragma once

#include <spawn.h>
#include <sys/wait.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

extern char** environ;

namespace rlhf::bench {

// argvs[r] (argv[0] the program) for rank r, which writes its JSON to outputs[r]. Throws
// naming `what` and the rank when one cannot start or exits non-zero.
inline std::vector<nlohmann::json> run_rank_processes(std::vector<std::vector<std::string>> argvs,
                                                      const std::vector<std::string>& outputs,
                                                      const std::string& what) {
  std::vector<pid_t> pids;
  for (auto& args : argvs) {
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = 0;
    if (posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ) != 0)
      throw std::runtime_error("cannot start " + args[0]);
    pids.push_back(pid);
  }
  for (size_t r = 0; r < pids.size(); ++r) {
    int status = 0;
    waitpid(pids[r], &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
      throw std::runtime_error(what + " rank " + std::to_string(r) + " failed");
  }
  std::vector<nlohmann::json> out;
  for (const auto& path : outputs) {
    std::ifstream in(path);
    out.push_back(nlohmann::json::parse(in));
  }
  return out;
}

}  // namespace rlhf::bench
