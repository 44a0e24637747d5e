// Cluster settings that are more than one key's type and range: the port range of the
// job's endpoints (cluster.port_range) and the cross-field checks of cluster.* keys
// (launcher, hosts, ports). Launching itself lives in scheduler/.
#pragma once

#include <cstdint>
#include <string>

namespace rlhf {

// "LOW-HIGH" (inclusive) or "" for any free port (both 0).
struct PortRange {
  uint16_t low = 0, high = 0;
  bool any() const { return low == 0 && high == 0; }
};
// Throws InputError naming cluster.port_range unless `text` is "" or "LOW-HIGH" with
// 1024 <= LOW < HIGH <= 65535 (two ports at least: the worker endpoint and the store).
PortRange parse_port_range(const std::string& text);

class SpecCheck;
// cluster.port_range, cluster.launcher and the nodes' hosts (run by check_cross_fields).
void check_cluster(SpecCheck& v);

}  // namespace rlhf
