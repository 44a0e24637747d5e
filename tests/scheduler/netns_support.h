// Test support for tests that put processes in network namespaces: a pair of namespaces
// joined by a veth pair (deleted with the object), a spawned process with its output in files,
// and a shell command run to completion. Needs root and iproute2's `ip`; NamespacePair says
// which is missing instead of throwing, so tests can skip naming it.
#pragma once

#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "tests/support/processes.h"

namespace rlhf::netns {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::poll_until;

constexpr const char* kNamespacePrefix = "rlhft-";
constexpr const char* kFirstAddress = "10.77.0.1";
constexpr const char* kSecondAddress = "10.77.0.2";

inline std::string quoted(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

// Runs `args` through the shell, waiting for it.
inline CommandResult command(const std::vector<std::string>& args) {
  std::string line;
  for (const auto& a : args) line += quoted(a) + " ";
  const std::string out = testing::fresh_run_dir("netns-cmd") + "/out.txt";
  const int status = std::system((line + "> " + quoted(out) + " 2>&1").c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, testing::read_file(out)};
}

// Namespaces left by an earlier test process that died before its destructors ran.
inline void delete_stale_namespaces() {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator("/var/run/netns", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(kNamespacePrefix, 0) != 0) continue;
    const int pid = std::atoi(name.c_str() + std::string(kNamespacePrefix).size());
    if (pid > 0 && !testing::pid_alive(pid)) command({"ip", "netns", "del", name});
  }
}

// Two network namespaces, "first" (10.77.0.1/24) and "second" (10.77.0.2/24), joined by a
// veth pair created inside them (it never exists in the host's namespace). Deleting the
// namespaces deletes the pair. `missing` says why they could not be made (then none exist).
class NamespacePair {
 public:
  NamespacePair() {
    if (::geteuid() != 0) {
      missing_ = "root (euid " + std::to_string(::geteuid()) + "): `ip netns add` needs it";
      return;
    }
    if (command({"ip", "-V"}).exit_code != 0) {
      missing_ = "the `ip` command (iproute2)";
      return;
    }
    delete_stale_namespaces();
    static int serial = 0;
    const std::string id = std::to_string(::getpid()) + "-" + std::to_string(serial++);
    driver_ = kNamespacePrefix + id + "-d";
    workers_ = kNamespacePrefix + id + "-w";
    veth_driver_ = "rv" + id + "d";
    veth_workers_ = "rv" + id + "w";
    for (const auto& ns : {driver_, workers_}) {
      const auto r = command({"ip", "netns", "add", ns});
      if (r.exit_code != 0) {
        missing_ = "network namespaces: `ip netns add " + ns + "` failed: " + r.output;
        return;
      }
      created_.push_back(ns);
    }
    const auto veth = command({"ip", "link", "add", veth_driver_, "netns", driver_, "type", "veth",
                               "peer", "name", veth_workers_, "netns", workers_});
    if (veth.exit_code != 0) {
      missing_ = "veth pairs: `ip link add ... type veth` failed: " + veth.output;
      return;
    }
    for (const auto& [ns, dev, address] : {std::tuple{driver_, veth_driver_, kFirstAddress},
                                           std::tuple{workers_, veth_workers_, kSecondAddress}}) {
      for (const std::vector<std::string>& step :
           {std::vector<std::string>{"ip", "-n", ns, "addr", "add", std::string(address) + "/24",
                                     "dev", dev},
            std::vector<std::string>{"ip", "-n", ns, "link", "set", dev, "up"},
            std::vector<std::string>{"ip", "-n", ns, "link", "set", "lo", "up"}}) {
        const auto r = command(step);
        if (r.exit_code != 0) {
          std::string line;
          for (const auto& a : step) line += a + " ";
          failed_ = "`" + line + "` failed: " + r.output;
          return;
        }
      }
    }
  }
  ~NamespacePair() {
    for (const auto& ns : created_) {
      const auto r = command({"ip", "netns", "del", ns});
      if (r.exit_code != 0)
        ADD_FAILURE() << "could not delete namespace " << ns << ": " << r.output;
    }
  }
  NamespacePair(const NamespacePair&) = delete;
  NamespacePair& operator=(const NamespacePair&) = delete;

  // What this machine lacks for the test ("" when the pair exists).
  const std::string& missing() const { return missing_; }
  // A step of the set-up that failed once namespaces could be made ("" when none did).
  const std::string& failed() const { return failed_; }
  const std::string& first() const { return driver_; }
  const std::string& second() const { return workers_; }
  // Bytes the second's end of the veth received so far (-1 when unreadable).
  long long bytes_into_second() const {
    const auto r =
        command({"ip", "-n", workers_, "-s", "-j", "link", "show", "dev", veth_workers_});
    if (r.exit_code != 0) return -1;
    const auto links = json::parse(r.output, nullptr, false);
    if (!links.is_array() || links.empty()) return -1;
    return links[0].at("stats64").at("rx").at("bytes").get<long long>();
  }

 private:
  std::string missing_, failed_;
  std::string driver_, workers_, veth_driver_, veth_workers_;
  std::vector<std::string> created_;
};

// `argv` (argv[0] looked up in PATH) with `env` added to this process's environment and its
// output in files under `dir`; killed if still running when destroyed. Wrappers that exec
// what they wrap (`ip netns exec`, `nsenter`, `unshare` without --fork, `sh -c 'exec ...'`)
// keep the pid, so it is the wrapped program's.
class Process {
 public:
  Process(std::vector<std::string> argv, const std::map<std::string, std::string>& env,
          const std::string& dir)
      : out_(dir + "/stdout.txt"), err_(dir + "/stderr.txt") {
    fs::create_directories(dir);
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
  ~Process() {
    if (pid_ > 0 && !status_) {
      ::kill(pid_, SIGKILL);
      int s;
      waitpid(pid_, &s, 0);
    }
  }
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

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
  std::string out() const { return testing::read_file(out_); }
  std::string err() const { return testing::read_file(err_); }

 private:
  pid_t pid_ = -1;
  std::optional<int> status_;
  std::string out_, err_;
};

}  // namespace rlhf::netns
