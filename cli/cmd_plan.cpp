// `rlhf plan SPEC`: where every worker of a job will run (role, rank, node, device, env).
#include <iostream>
#include <set>

#include "cli/commands.h"
#include "cli/spec_args.h"
#include "cli/table.h"
#include "core/placement.h"
#include "core/text.h"

namespace rlhf::cli {
namespace {

// Per node: which role holds each device ("0 actor, 1 critic, 2-7 free").
std::string device_map(const Placement& p, const NodeSpec& node) {
  std::vector<std::string> owner(node.devices, "free");
  for (const auto& w : p.workers) {
    if (w.node != node.name) continue;
    std::string& o = owner[w.device_id];
    o = (o == "free") ? role_name(w.role) : o + "+" + role_name(w.role);
  }
  std::vector<std::string> parts;
  for (int i = 0; i < node.devices;) {
    int j = i;
    while (j + 1 < node.devices && owner[j + 1] == owner[i]) ++j;
    parts.push_back((i == j ? std::to_string(i) : std::to_string(i) + "-" + std::to_string(j)) +
                    " " + owner[i]);
    i = j + 1;
  }
  return join(parts, ", ");
}

nlohmann::json placement_json(const Placement& p) {
  nlohmann::json workers = nlohmann::json::array();
  for (const auto& w : p.workers)
    workers.push_back({{"role", role_name(w.role)},
                       {"rank", w.rank},
                       {"group_size", w.group_size},
                       {"node", w.node},
                       {"host", w.host},
                       {"device", std::string(device_kind_name(w.device_kind)) + ":" +
                                      std::to_string(w.device_id)},
                       {"colocated_with", w.colocated_with},
                       {"env", w.env}});
  return {{"workers", workers}};
}

}  // namespace

int cmd_plan(const Argv& argv) {
  const std::vector<OptionSpec> options = {
      set_option(),
      {"--json", false, "print the placement as JSON (for scripts)"},
      {"--help", false, "show this help"}};
  Args args(argv, options);
  if (args.flag("--help")) {
    std::cout << "usage: rlhf plan SPEC [--set PATH=VALUE ...] [--json]\n\n"
                 "Shows where every worker of the job will run: one process per device, with\n"
                 "its role, rank in the role group, node, device and environment.\n\n"
              << format_options(options);
    return 0;
  }
  JobSpec spec = load_spec_arg(args, "plan");
  Placement p = place(spec);
  if (args.flag("--json")) {
    std::cout << placement_json(p).dump(2) << '\n';
    return 0;
  }
  for (const auto& w : spec.warnings()) std::cerr << "warning: " << w << '\n';
  std::cout << spec.source() << ": " << spec_summary(spec) << "\n\n";
  TextTable nodes({"node", "host", "kind", "devices", "memory/device", "use"});
  for (const auto& n : p.nodes)
    nodes.add({n.name, n.host, device_kind_name(n.kind), std::to_string(n.devices),
               format_bytes(n.memory_gb * (1ull << 30)), device_map(p, n)});
  std::cout << nodes.str() << '\n';
  TextTable workers({"role", "rank", "node", "host", "device", "colocated", "env"});
  for (const auto& w : p.workers) {
    std::string env = "OMP_NUM_THREADS=" + w.env.at("OMP_NUM_THREADS");
    if (w.env.count("CUDA_VISIBLE_DEVICES")) env = "CUDA_VISIBLE_DEVICES=" + w.env.at("CUDA_VISIBLE_DEVICES") + " " + env;
    workers.add({role_name(w.role), std::to_string(w.rank) + "/" + std::to_string(w.group_size),
                 w.node, w.host, std::string(device_kind_name(w.device_kind)) + ":" + std::to_string(w.device_id),
                 w.colocated_with.empty() ? "-" : w.colocated_with, env});
  }
  std::cout << workers.str()
            << "\nEach worker also gets RLHF_ROLE, RLHF_RANK, RLHF_WORLD_SIZE, RLHF_NODE and "
               "RLHF_DEVICE as above,\nand RLHF_SCHEDULER, RLHF_TOKEN, RLHF_RUN_DIR when "
               "`rlhf run` starts it.\n";
  return 0;
}

}  // namespace rlhf::cli
