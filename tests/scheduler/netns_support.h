// Test support for tests that put processes in network namespaces: a pair of namespaces
// joined by a veth pair (deleted with the object), a spawned process with its output in files,
// and a shell command run to completion. Needs root and iproute2's `ip`; NamespacePair says
// which is missing instead of throwing, so tests can skip naming it.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>
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

using Process = testing::SpawnedProcess;

}  // namespace rlhf::netns
