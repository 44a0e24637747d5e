// `rlhf plan SPEC`: where every worker of a job will run (role, rank, node, device, env) and
// the memory each will hold (engine/memory_plan.h); `rlhf plan --check RUN_DIR`: that plan
// beside the peaks the run measured.
#include <cmath>
#include <iomanip>
#include <iostream>
#include <optional>
#include <set>
#include <sstream>

#include "cli/commands.h"
#include "cli/spec_args.h"
#include "cli/table.h"
#include "core/placement.h"
#include "core/text.h"
#include "engine/memory_check.h"
#include "engine/memory_plan.h"
#include "models/param_layout.h"

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

std::string mib(int64_t bytes) {
  return bytes ? format_bytes(static_cast<double>(bytes)) : "-";
}

std::string percent(double ratio) {
  std::ostringstream o;
  o << std::showpos << std::fixed << std::setprecision(1) << 100.0 * ratio << "%";
  return o.str();
}

// Each role's and each device's bytes per phase of the step, and the rollout's KV pool.
void print_phases(const engine::MemoryPlan& plan, std::ostream& out) {
  bool ppo = false;
  for (const auto& r : plan.roles) ppo |= r.input.ppo;
  const auto phases = engine::step_phases(ppo);
  std::vector<std::string> header = {"per rank"};
  header.insert(header.end(), phases.begin(), phases.end());
  header.push_back("nccl");
  header.push_back("sync");
  TextTable roles(header);
  for (const auto& r : plan.roles) {
    std::vector<std::string> row = {r.input.role};
    for (const auto& p : phases)
      row.push_back(mib(r.terms.phases.count(p) ? r.terms.phases.at(p) : 0));
    row.push_back(mib(r.terms.nccl));
    row.push_back(mib(r.terms.sync));
    roles.add(row);
  }
  header[0] = "device";
  header.resize(header.size() - 2);  // nccl and sync are per rank
  TextTable devices(header);
  for (const auto& d : plan.devices) {
    std::vector<std::string> row = {d.node + ":" + std::to_string(d.device_id)};
    for (const auto& p : phases) {
      const int64_t b = d.phases.count(p) ? d.phases.at(p) : 0;
      row.push_back(mib(b) + (p == d.peak_phase ? " *" : ""));
    }
    devices.add(row);
  }
  out << "\nBy phase of the step (what each holds while it runs; sleep mode moves the rollout's\n"
         "weights or the actor's optimizer state to the host where it applies; * the device's\n"
         "peak; nccl: communicator buffers in every phase, sync: the weight sync's buckets):\n"
      << roles.str() << '\n'
      << devices.str();
  for (const auto& r : plan.roles) {
    if (r.input.work != engine::RoleWork::kGenerate) continue;
    out << "rollout KV cache" << (r.input.kv_auto ? " (auto)" : "") << ": " << mib(r.terms.kv_cache)
        << " per rank, " << r.terms.kv_sequences << " sequences of " << r.input.prompt_len << " + "
        << r.input.max_new_tokens << " tokens at once"
        << (r.input.kv_auto
                ? " (what " +
                      std::to_string(static_cast<int>(100 * r.input.gpu_memory_utilization + 0.5)) +
                      "% of the device leaves in the generate phase, up to "
                      "max_num_seqs)"
                : "")
        << '\n';
  }
}

// Per trained role, the collectives one rank runs per optimizer step (the payload of each
// kind, engine/sharded_unit_memory.h) and the bytes it sends for them on its backend; the
// PPO actor's weight sync per step.
void print_collectives(const engine::MemoryPlan& plan, std::ostream& out) {
  TextTable t({"role", "ranks", "backward/step", "all-gather", "reduce-scatter", "all-reduce",
               "calls", "sent per rank", "weight sync"});
  bool any = false, cuda = false;
  for (const auto& r : plan.roles) {
    if (r.input.work != engine::RoleWork::kTrain) continue;
    any = true;
    cuda = r.input.device_kind == DeviceKind::kCuda;
    const auto& c = r.collectives;
    t.add({r.input.role + " (zero " + std::to_string(r.input.zero_stage) + ")",
           std::to_string(r.input.group_size), std::to_string(r.input.backward_calls),
           mib(c.all_gather), mib(c.reduce_scatter), mib(c.all_reduce), std::to_string(c.calls),
           mib(r.collective_wire_bytes), r.sync_bytes > 0 ? mib(r.sync_bytes) : "-"});
  }
  if (!any) return;
  out << "\nCommunication per optimizer step and rank (payload of each collective kind; sent:\n"
         "what one rank sends, and as much it receives, by "
      << (cuda ? "NCCL's ring algorithms" : "Gloo's algorithms here")
      << ";\nweight sync: the actor's weights broadcast to the rollout group per PPO step):\n"
      << t.str();
}

// Each role's model: its type and parameters, and for a mixture of experts those one token
// uses (the rest are experts the router does not pick).
void print_models(const engine::MemoryPlan& plan, std::ostream& out) {
  out << "\nModels:\n";
  for (const auto& r : plan.roles) {
    const models::ModelConfig& m = r.input.model;
    std::ostringstream line;
    line << std::fixed << std::setprecision(2) << "  " << r.input.role << ": " << m.model_type
         << ", " << static_cast<double>(m.num_parameters()) / 1e9 << "B parameters";
    if (m.moe.num_experts > 0)
      line << ", " << static_cast<double>(models::active_parameters(m)) / 1e9
           << "B active per token (" << m.moe.num_experts_per_tok << " of " << m.moe.num_experts
           << " experts per sparse layer)";
    out << line.str() << '\n';
  }
}

void print_memory(const engine::MemoryPlan& plan, std::ostream& out) {
  print_models(plan, out);
  out << "\nMemory per rank (bytes each worker of the role holds, each term at its own peak; the\n"
         "transient terms peak in different phases of a step, so total = the largest phase of\n"
         "the table below; engine = what the trainer's tracker counts, reported as\n"
         "peak_tensor_bytes):\n";
  TextTable roles({"role", "ranks", "weights", "master", "adam", "grads", "gathered", "buffers",
                   ".grad", "activations", "log-probs", "kv-cache", "load", "overhead", "total",
                   "engine"});
  for (const auto& r : plan.roles) {
    const auto& t = r.terms;
    std::string role = r.input.role;
    if (r.input.work == engine::RoleWork::kTrain)
      role += " (zero " + std::to_string(r.input.zero_stage) +
              (r.input.checkpointing ? ", ckpt" : "") + (r.input.adam_offload ? ", offload" : "") +
              ")";
    if (r.input.work == engine::RoleWork::kGenerate && r.input.tensor_parallel > 1)
      role += " (tensor parallel " + std::to_string(r.input.tensor_parallel) + ")";
    roles.add({role, std::to_string(r.input.group_size), mib(t.weights), mib(t.master),
               mib(t.optimizer), mib(t.grads), mib(t.gathered), mib(t.buffers), mib(t.param_grads),
               mib(t.activations), mib(t.log_probs), mib(t.kv_cache), mib(t.load), mib(t.overhead),
               mib(t.device_total()), mib(t.engine_peak)});
  }
  out << roles.str();
  print_phases(plan, out);
  print_collectives(plan, out);
  TextTable devices({"device", "roles", "planned", "peak phase", "capacity", "use", ""});
  for (const auto& d : plan.devices) {
    const double use =
        d.capacity > 0 ? static_cast<double>(d.total) / static_cast<double>(d.capacity) : 0.0;
    std::ostringstream u;
    u << std::fixed << std::setprecision(1) << 100.0 * use << "%";
    devices.add({d.node + ":" + std::to_string(d.device_id), join(d.roles, "+"), mib(d.total),
                 d.peak_phase, mib(d.capacity), u.str(), d.fits() ? "fits" : "OVER BUDGET"});
  }
  out << '\n' << devices.str();
  if (!plan.kv_auto_error.empty())
    out << '\n' << plan.kv_auto_error << " (`rlhf run` refuses it)\n";
  if (!plan.fits()) out << '\n';
  for (const auto& d : plan.devices) {
    if (d.fits()) continue;
    // The role that holds the most in the device's peak phase, and its largest state term.
    const engine::RolePlan* most = nullptr;
    for (const auto& label : d.roles) {
      const auto* r = plan.role(label.substr(0, label.find('[')));
      if (r && (!most || r->terms.phases.at(d.peak_phase) > most->terms.phases.at(d.peak_phase)))
        most = r;
    }
    out << d.node << ":" << d.device_id << " is over budget by " << mib(d.total - d.capacity)
        << " in the " << d.peak_phase << " phase";
    if (most)
      out << ", where " << most->input.role << " holds " << mib(most->terms.phases.at(d.peak_phase))
          << " (its largest term: " << most->terms.dominant().first << ", "
          << mib(most->terms.dominant().second) << ")";
    out << ".\n";
  }
  if (!plan.suggestions.empty()) {
    out << "Changes, each planned again (total: the most over-budget device; a combination is\n"
           "listed first when no single change fits):\n";
    for (const auto& s : plan.suggestions)
      out << "  --set " << s.change << "  ->  " << mib(s.new_total)
          << (s.fits ? "  (fits" : "  (still over")
          << (s.costs_throughput ? "; costs throughput)" : "; keeps throughput)") << '\n';
  }
}

// Per phase, the tracked tensors (the MemoryTracker's bytes) planned and measured.
void print_tensor_phases(const std::vector<engine::MemoryCheckRow>& rows) {
  TextTable ph({"role", "rank", "phase", "planned tensor", "measured tensor", "error"});
  bool any = false;
  for (const auto& r : rows) {
    for (const auto& p : r.tensor_phases) {
      any = true;
      ph.add({r.role, std::to_string(r.rank), p.phase, mib(p.planned),
              p.measured < 0 ? "-" : mib(p.measured), p.measured < 0 ? "-" : percent(p.error())});
    }
  }
  if (!any) return;
  std::cout << "\nBy phase: the tracked tensors' peak over each phase's operations vs the plan's "
               "tracked bytes of that phase\n(model states, gathered units, collective buffers; "
               "the metrics' tensor_phases)\n\n"
            << ph.str();
}

// Trained roles: the collectives' payload per optimizer step, planned and counted in each
// rank's group over its last logged step.
void print_collectives_check(const std::vector<engine::MemoryCheckRow>& rows) {
  TextTable t({"role", "rank", "planned per step", "counted per step", "error",
               "all-to-all (not planned)"});
  bool any = false;
  for (const auto& r : rows) {
    if (r.planned_collectives < 0 || r.measured_collectives < 0) continue;
    any = true;
    const double error = r.measured_collectives > 0
                             ? static_cast<double>(r.planned_collectives - r.measured_collectives) /
                                   static_cast<double>(r.measured_collectives)
                             : 0.0;
    t.add({r.role, std::to_string(r.rank), mib(r.planned_collectives), mib(r.measured_collectives),
           percent(error), r.measured_all_to_all > 0 ? mib(r.measured_all_to_all) : "-"});
  }
  if (!any) return;
  std::cout << "\nCollectives: payload bytes per optimizer step (all-gathers, reduce-scatters, "
               "all-reduces), planned vs counted in the rank's groups; expert parallelism's "
               "all-to-alls apart\n(their bytes follow the routing)\n\n"
            << t.str();
}

int check_run(const std::string& run_dir, bool as_json) {
  const auto rows = engine::check_run_memory(run_dir);
  if (as_json) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& r : rows) {
      nlohmann::json phases = nlohmann::json::array();
      for (const auto& p : r.phases)
        phases.push_back({{"phase", p.phase},
                          {"planned_cuda_allocated", p.planned},
                          {"measured_cuda_allocated", p.measured},
                          {"error", p.error()}});
      nlohmann::json tensor_phases = nlohmann::json::array();
      for (const auto& p : r.tensor_phases)
        tensor_phases.push_back({{"phase", p.phase},
                                 {"planned_tensor", p.planned},
                                 {"measured_tensor", p.measured},
                                 {"error", p.error()}});
      out.push_back({{"role", r.role},
                     {"rank", r.rank},
                     {"device", r.device},
                     {"planned_engine", r.planned_engine},
                     {"measured_tensor", r.measured_tensor},
                     {"tensor_error", r.tensor_error()},
                     {"planned_total", r.planned_total},
                     {"measured_rss", r.measured_rss},
                     {"rss_error", r.rss_error()},
                     {"planned_cuda_allocated", r.planned_cuda},
                     {"measured_cuda_allocated", r.measured_cuda},
                     {"cuda_error", r.cuda_error()},
                     {"planned_collective_bytes_per_step", r.planned_collectives},
                     {"measured_collective_bytes_per_step", r.measured_collectives},
                     {"measured_all_to_all_bytes_per_step", r.measured_all_to_all},
                     {"phases", phases},
                     {"tensor_phases", tensor_phases}});
    }
    std::cout << out.dump(2) << '\n';
    return 0;
  }
  std::cout << run_dir << ": planned vs measured peak memory per role and rank\n"
            << "(tensor: the trainer's tracked tensors, or the weights of an untrained role; "
               "total vs RSS: everything the process holds)\n\n";
  TextTable t({"role", "rank", "device", "planned tensor", "measured tensor", "error",
               "planned total", "peak RSS", "error"});
  for (const auto& r : rows)
    t.add({r.role, std::to_string(r.rank), r.device, mib(r.planned_engine),
           r.measured_tensor < 0 ? "-" : mib(r.measured_tensor),
           r.measured_tensor < 0 ? "-" : percent(r.tensor_error()), mib(r.planned_total),
           r.measured_rss < 0 ? "-" : mib(r.measured_rss),
           r.measured_rss < 0 ? "-" : percent(r.rss_error())});
  std::cout << t.str();
  print_tensor_phases(rows);
  print_collectives_check(rows);
  bool gpu = false;
  for (const auto& r : rows) gpu |= r.measured_cuda >= 0;
  if (gpu) {
    std::cout << "\nGPU roles: the CUDA caching allocator's peak (allocated bytes) vs the plan "
                 "less the CUDA context\n\n";
    TextTable g({"role", "rank", "device", "planned allocated", "measured allocated", "error"});
    for (const auto& r : rows)
      if (r.measured_cuda >= 0)
        g.add({r.role, std::to_string(r.rank), r.device, mib(r.planned_cuda), mib(r.measured_cuda),
               percent(r.cuda_error())});
    std::cout << g.str();
    std::cout << "\nBy phase: the allocator's peak over each phase's operations vs the plan's "
                 "phase less the CUDA context, NCCL and an IPC bucket\n\n";
    TextTable ph({"role", "rank", "phase", "planned allocated", "measured allocated", "error"});
    for (const auto& r : rows)
      for (const auto& p : r.phases)
        ph.add({r.role, std::to_string(r.rank), p.phase, mib(p.planned),
                p.measured < 0 ? "-" : mib(p.measured), p.measured < 0 ? "-" : percent(p.error())});
    std::cout << ph.str();
  }
  return 0;
}

}  // namespace

int cmd_plan(const Argv& argv) {
  const std::vector<OptionSpec> options = {
      set_option(),
      {"--json", false, "print the placement and memory plan as JSON (for scripts)"},
      {"--check", true, "planned vs measured peak memory of a finished run", "RUN_DIR"},
      {"--help", false, "show this help"}};
  Args args(argv, options);
  if (args.flag("--help")) {
    std::cout << "usage: rlhf plan SPEC [--set PATH=VALUE ...] [--json]\n"
                 "       rlhf plan --check RUN_DIR [--json]\n\n"
                 "Shows where every worker of the job will run: one process per device, with\n"
                 "its role, rank in the role group, node, device and environment; then the\n"
                 "memory each role holds per rank (weights, FP32 master, AdamW, gradients,\n"
                 "gathered parameters, activations, log-prob buffers, KV cache, overhead) against\n"
                 "each device's memory, and for an over-budget device the changes that fit.\n"
                 "The memory part reads every role's <model>/config.json. --check compares a\n"
                 "run's plan.json (written by `rlhf run`) with the peaks in its metrics.jsonl.\n\n"
              << format_options(options);
    return 0;
  }
  if (auto run_dir = args.value("--check")) return check_run(*run_dir, args.flag("--json"));
  JobSpec spec = load_spec_arg(args, "plan");
  Placement p = place(spec);
  std::vector<std::string> missing;
  const auto models = engine::load_role_models(spec, missing);
  std::optional<engine::MemoryPlan> memory;
  if (missing.empty()) memory = engine::plan_memory(spec, models);
  if (args.flag("--json")) {
    nlohmann::json j = placement_json(p);
    j["memory"] = memory ? memory->to_json() : nlohmann::json{{"missing", missing}};
    std::cout << j.dump(2) << '\n';
    return 0;
  }
  for (const auto& w : spec.warnings()) std::cerr << "warning: " << w << '\n';
  std::cout << spec.source() << ": " << spec_summary(spec) << "\n";
  for (const auto& n : spec.notes()) std::cout << "note: " << n << '\n';
  std::cout << '\n';
  TextTable nodes({"node", "host", "kind", "devices", "memory/device", "use"});
  for (const auto& n : p.nodes)
    nodes.add({n.name, n.host, device_kind_name(n.kind), std::to_string(n.devices),
               format_bytes(n.memory_gb * (1ull << 30)), device_map(p, n)});
  std::cout << nodes.str() << '\n';
  TextTable workers({"role", "rank", "node", "host", "device", "colocated", "env"});
  for (const auto& w : p.workers) {
    std::string env = "OMP_NUM_THREADS=" + w.env.at("OMP_NUM_THREADS");
    if (w.env.count("CUDA_VISIBLE_DEVICES"))
      env = "CUDA_VISIBLE_DEVICES=" + w.env.at("CUDA_VISIBLE_DEVICES") + " " + env;
    workers.add({role_name(w.role), std::to_string(w.rank) + "/" + std::to_string(w.group_size),
                 w.node, w.host,
                 std::string(device_kind_name(w.device_kind)) + ":" + std::to_string(w.device_id),
                 w.colocated_with.empty() ? "-" : w.colocated_with, env});
  }
  std::cout << workers.str()
            << "\nEach worker also gets RLHF_ROLE, RLHF_RANK, RLHF_WORLD_SIZE, RLHF_NODE and "
               "RLHF_DEVICE as above,\nand RLHF_SCHEDULER, RLHF_TOKEN, RLHF_RUN_DIR when "
               "`rlhf run` starts it.\n";
  if (memory) {
    print_memory(*memory, std::cout);
  } else {
    std::cout << "\nMemory: the plan needs every role's model config; missing:\n";
    for (const auto& m : missing) std::cout << "  " << m << '\n';
  }
  return 0;
}

}  // namespace rlhf::cli
