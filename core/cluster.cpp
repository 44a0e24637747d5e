// cluster.* rules: port range syntax and bounds.
#include "core/cluster.h"

#include <netdb.h>
#include <sys/socket.h>

#include <cstdlib>

#include "core/errors.h"
#include "core/spec_check.h"

namespace rlhf {
namespace {

long parse_port(const std::string& text, const std::string& whole) {
  char* end = nullptr;
  const long p = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || p < 1024 || p > 65535)
    throw InputError("cluster.port_range: \"" + whole +
                     "\": ports must be whole numbers in 1024-65535 (\"LOW-HIGH\", or \"\" for "
                     "any free port)");
  return p;
}

bool is_loopback(const std::string& host) {
  return host == "127.0.0.1" || host == "localhost" || host == "::1";
}

bool resolves(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0) return false;
  ::freeaddrinfo(found);
  return true;
}

}  // namespace

PortRange parse_port_range(const std::string& text) {
  if (text.empty()) return {};
  const auto dash = text.find('-');
  if (dash == std::string::npos)
    throw InputError("cluster.port_range: \"" + text +
                     "\": expected \"LOW-HIGH\" (two ports at least), or \"\" for any free port");
  const long low = parse_port(text.substr(0, dash), text);
  const long high = parse_port(text.substr(dash + 1), text);
  if (high <= low)
    throw InputError("cluster.port_range: \"" + text +
                     "\": HIGH must be above LOW (the worker endpoint and the rendezvous store "
                     "take one port each)");
  return {static_cast<uint16_t>(low), static_cast<uint16_t>(high)};
}

void check_cluster(SpecCheck& v) {
  if (v.ok({"cluster.port_range"})) {
    try {
      parse_port_range(v.at("cluster.port_range").get<std::string>());
    } catch (const InputError& e) {
      const std::string what = e.what();
      v.problem("cluster.port_range", what.substr(what.find(':') + 2));
    }
  }
  if (!v.ok({"cluster.launcher", "cluster.nodes", "cluster.interface"})) return;
  const std::string launcher = v.at("cluster.launcher").get<std::string>();
  if (launcher == "local") return;  // placement already keeps local jobs on this host
  if (launcher == "slurm") {
    const char* list = std::getenv("SLURM_JOB_NODELIST");
    if (!list || !*list)
      v.problem("cluster.launcher",
                "\"slurm\" needs a Slurm allocation: SLURM_JOB_NODELIST is not set (run inside "
                "sbatch or salloc)");
  }
  // Hosts that do not resolve here would fail only when their workers try to meet.
  bool remote = false;
  const auto& nodes = v.at("cluster.nodes");
  for (size_t i = 0; i < nodes.size(); ++i) {
    const std::string host = nodes[i].value("host", std::string());
    remote = remote || !is_loopback(host);
    if (!resolves(host))
      v.problem("cluster.nodes",
                "[" + std::to_string(i) + "].host: \"" + host + "\" does not resolve on this host");
  }
  const std::string interface = v.at("cluster.interface").get<std::string>();
  if (remote && is_loopback(interface))
    v.problem("cluster.interface", "\"" + interface +
                                       "\" is loopback, but workers on other hosts must reach the "
                                       "scheduler: name this host's address on their network");
}

}  // namespace rlhf
