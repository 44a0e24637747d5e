#include "cli/spec_args.h"

#include <algorithm>

#include "core/placement.h"
#include "core/text.h"

namespace rlhf::cli {

OptionSpec set_option() {
  return {"--set", true,
          "override a spec key, e.g. --set rollout.n_samples_per_prompt=8 (repeatable)",
          "PATH=VALUE"};
}

JobSpec load_spec_arg(const Args& args, const std::string& command) {
  if (args.positionals().size() != 1)
    throw InputError("expected one job spec file: rlhf " + command +
                     " SPEC [--set PATH=VALUE ...]");
  return JobSpec::load(args.positionals()[0], args.values("--set"));
}

std::string spec_summary(const JobSpec& spec) {
  Placement p = place(spec);
  std::string out = std::string(job_kind_name(spec.kind())) + " job";
  if (spec.kind() == JobKind::kPpo)
    out += " (estimator " + spec.get_string("algo.advantage.estimator") + ")";
  else if (spec.kind() == JobKind::kDpo)
    out += " (loss " + spec.get_string("algo.dpo.loss") + ")";
  std::vector<std::string> groups;
  std::vector<std::string> nodes_used;
  for (Role r : spec.used_roles()) {
    groups.push_back(std::string(role_name(r)) + " " + std::to_string(p.group_size(r)));
    const int64_t tp = r == Role::kRollout ? spec.get_int("rollout.tensor_parallel_size") : 1;
    if (tp > 1)
      groups.back() += " as " + std::to_string(p.group_size(r) / tp) + " engine" +
                       (p.group_size(r) / tp == 1 ? "" : "s") + " of tensor parallel size " +
                       std::to_string(tp);
  }
  for (const auto& w : p.workers)
    if (std::find(nodes_used.begin(), nodes_used.end(), w.node) == nodes_used.end())
      nodes_used.push_back(w.node);
  out += ": " + std::to_string(p.workers.size()) +
         (p.workers.size() == 1 ? " worker" : " workers") + " on " +
         std::to_string(nodes_used.size()) + (nodes_used.size() == 1 ? " node" : " nodes") + " (" +
         join(groups, ", ") + ")";
  if (spec.kind() == JobKind::kPpo)
    out += "; " + std::to_string(spec.get_int("rollout.batch_size")) + " prompts x " +
           std::to_string(spec.get_int("rollout.n_samples_per_prompt")) + " samples per step";
  out += "; train batch " + std::to_string(spec.get_int("train.batch_size")) + " (micro " +
         std::to_string(spec.get_int("train.micro_batch_size")) + ")";
  return out;
}

}  // namespace rlhf::cli
