// Helpers for integration tests that start real processes: hand-built placements, a
// spawned `rlhf` command with its output in files, liveness by pid, and polling with a
// deadline (never a fixed sleep as synchronization).
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/placement.h"
#include "test_paths.h"

extern char** environ;

namespace rlhf::testing {

using Clock = std::chrono::steady_clock;

// Polls `done` every 10 ms until it holds or `limit` passes; returns whether it held.
inline bool poll_until(const std::function<bool()>& done, std::chrono::milliseconds limit) {
  const auto deadline = Clock::now() + limit;
  while (!done()) {
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

// True while `pid` is a live process (a zombie counts as gone: it runs nothing).
inline bool pid_alive(int pid) {
  if (pid <= 0 || ::kill(pid, 0) != 0) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string all((std::istreambuf_iterator<char>(stat)), {});
  const auto close = all.rfind(')');
  return close == std::string::npos || close + 2 >= all.size() || all[close + 2] != 'Z';
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A fresh directory for one test's run.
inline std::string fresh_run_dir(const std::string& name) {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::path(RLHF_BINARY_DIR) / "test-runs" / (name + "-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

// One worker per (role, size) group on a single local cpu node, environment as place() makes it.
inline Placement local_placement(const std::vector<std::pair<Role, int>>& groups) {
  Placement p;
  int device = 0;
  for (const auto& [role, size] : groups) {
    for (int rank = 0; rank < size; ++rank, ++device) {
      WorkerPlacement w;
      w.role = role;
      w.rank = rank;
      w.group_size = size;
      w.node = "local";
      w.host = "127.0.0.1";
      w.device_id = device;
      w.env = {{kEnvRole, role_name(role)},
               {kEnvRank, std::to_string(rank)},
               {kEnvWorldSize, std::to_string(size)},
               {kEnvDevice, "cpu:" + std::to_string(device)},
               {kEnvNode, "local"},
               {"OMP_NUM_THREADS", "1"}};
      p.workers.push_back(w);
    }
  }
  p.nodes.push_back(NodeSpec{"local", "127.0.0.1", DeviceKind::kCpu, device, 1.0});
  return p;
}

// `argv` (argv[0] looked up in PATH) with `env` added to this process's environment and its
// output in files under `dir` (stdout.txt, stderr.txt); killed if still running when
// destroyed. Wrappers that exec what they wrap (`ip netns exec`, `nsenter`, `unshare`
// without --fork, `sh -c 'exec ...'`) keep the pid, so it is the wrapped program's.
class SpawnedProcess {
 public:
  SpawnedProcess(std::vector<std::string> argv, const std::map<std::string, std::string>& env,
                 const std::string& dir)
      : out_(dir + "/stdout.txt"), err_(dir + "/stderr.txt") {
    std::filesystem::create_directories(dir);
    std::vector<std::string> envs;
    for (char** e = environ; *e; ++e) {
      const std::string kv = *e;
      if (!env.count(kv.substr(0, kv.find('=')))) envs.push_back(kv);
    }
    for (const auto& [k, v] : env) envs.push_back(k + "=" + v);
    std::vector<char*> raw_argv, raw_env;
    for (auto& a : argv) raw_argv.push_back(a.data());
    raw_argv.push_back(nullptr);
    for (auto& e : envs) raw_env.push_back(e.data());
    raw_env.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, out_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&actions, 2, err_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (posix_spawnp(&pid_, argv[0].c_str(), &actions, nullptr, raw_argv.data(), raw_env.data()) !=
        0)
      pid_ = -1;
    posix_spawn_file_actions_destroy(&actions);
  }
  ~SpawnedProcess() {
    if (pid_ > 0 && !status_) {
      ::kill(pid_, SIGKILL);
      int s;
      waitpid(pid_, &s, 0);
    }
  }
  SpawnedProcess(const SpawnedProcess&) = delete;
  SpawnedProcess& operator=(const SpawnedProcess&) = delete;

  int pid() const { return pid_; }
  // The waitpid status if it exited within `limit`, nullopt otherwise.
  std::optional<int> wait(std::chrono::milliseconds limit) {
    poll_until(
        [&] {
          int s = 0;
          if (!status_ && pid_ > 0 && waitpid(pid_, &s, WNOHANG) == pid_) status_ = s;
          return status_.has_value();
        },
        limit);
    return status_;
  }
  std::string out() const { return read_file(out_); }
  std::string err() const { return read_file(err_); }

 private:
  pid_t pid_ = -1;
  std::optional<int> status_;
  std::string out_, err_;
};

// `rlhf ARGS...` as a SpawnedProcess.
class RlhfProcess : public SpawnedProcess {
 public:
  RlhfProcess(const std::vector<std::string>& args, const std::string& dir)
      : SpawnedProcess(with_cli(args), {}, dir) {}

 private:
  static std::vector<std::string> with_cli(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {RLHF_CLI_PATH};
    argv.insert(argv.end(), args.begin(), args.end());
    return argv;
  }
};

}  // namespace rlhf::testing
