// Slurm hostlists and srun steps.
#include "scheduler/slurm_launcher.h"

#include <cstdlib>

#include "core/errors.h"

namespace rlhf {
namespace {

// Splits at commas outside brackets.
std::vector<std::string> split_top_level(const std::string& text) {
  std::vector<std::string> parts;
  std::string current;
  int depth = 0;
  for (char c : text) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (c == ',' && depth == 0) {
      parts.push_back(current);
      current.clear();
    } else {
      current += c;
    }
  }
  parts.push_back(current);
  return parts;
}

bool all_digits(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  return true;
}

// "01-03,7" -> 01 02 03 7.
std::vector<std::string> expand_ranges(const std::string& ranges, const std::string& whole) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= ranges.size()) {
    size_t comma = ranges.find(',', start);
    if (comma == std::string::npos) comma = ranges.size();
    const std::string item = ranges.substr(start, comma - start);
    const size_t dash = item.find('-');
    const std::string lo = item.substr(0, dash);
    const std::string hi = dash == std::string::npos ? lo : item.substr(dash + 1);
    if (!all_digits(lo) || !all_digits(hi))
      throw InputError("hostlist \"" + whole + "\": \"" + item +
                       "\" is not a number or a range N-M");
    const long a = std::stol(lo), b = std::stol(hi);
    if (b < a) throw InputError("hostlist \"" + whole + "\": range " + item + " runs backwards");
    if (b - a > 100000) throw InputError("hostlist \"" + whole + "\": range " + item + " too long");
    for (long v = a; v <= b; ++v) {
      std::string digits = std::to_string(v);
      if (digits.size() < lo.size()) digits.insert(0, lo.size() - digits.size(), '0');
      out.push_back(digits);
    }
    start = comma + 1;
  }
  return out;
}

// One hostlist item, possibly with several bracket groups.
void expand_item(const std::string& item, const std::string& whole, std::vector<std::string>& out) {
  const size_t open = item.find('[');
  if (open == std::string::npos) {
    if (item.find(']') != std::string::npos)
      throw InputError("hostlist \"" + whole + "\": \"]\" without \"[\"");
    out.push_back(item);
    return;
  }
  const size_t close = item.find(']', open);
  if (close == std::string::npos) throw InputError("hostlist \"" + whole + "\": unclosed \"[\"");
  const std::string prefix = item.substr(0, open);
  const std::string rest = item.substr(close + 1);
  for (const auto& middle : expand_ranges(item.substr(open + 1, close - open - 1), whole))
    expand_item(prefix + middle + rest, whole, out);
}

}  // namespace

std::vector<std::string> expand_hostlist(const std::string& text) {
  std::vector<std::string> hosts;
  for (const auto& item : split_top_level(text)) {
    if (item.empty()) throw InputError("hostlist \"" + text + "\": an empty host name");
    expand_item(item, text, hosts);
  }
  return hosts;
}

// POSIX sh: splits Slurm's list at commas, keeps entry $1, execs the rest. `set -f`: no
// globbing of the entries.
const char* const kSlurmGpuSelectScript =
    "set -f; id=$1; shift; n=0; IFS=,; "
    "for d in $CUDA_VISIBLE_DEVICES; do "
    "if [ \"$n\" -eq \"$id\" ]; then export CUDA_VISIBLE_DEVICES=\"$d\"; exec \"$@\"; fi; "
    "n=$((n+1)); done; "
    "echo \"rlhf: this worker is placed on GPU $id of its node, but its Slurm step sees "
    "CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES: allocate the job every GPU its node lists in "
    "cluster.nodes (e.g. sbatch --gpus-per-node=N)\" >&2; exit 1";

SlurmStep slurm_step(const WorkerPlacement& worker, int node_gpus, const std::string& rlhf_program,
                     const std::string& endpoint) {
  const std::string role = role_name(worker.role);
  const std::string rank = std::to_string(worker.rank);
  SlurmStep step{"srun",
                 {"--nodes=1", "--ntasks=1", "-w", worker.host, "--overlap", "--kill-on-bad-exit=1",
                  "--job-name=rlhf-" + role + "-" + rank}};
  auto& args = step.args;
  if (worker.device_kind == DeviceKind::kCuda) {
    if (worker.device_id < 0 || worker.device_id >= node_gpus)
      throw RuntimeError("worker " + worker.label() + " is placed on GPU " +
                         std::to_string(worker.device_id) + " of node " + worker.node +
                         ", which has " + std::to_string(node_gpus));
    args.insert(args.end(),
                {"--gres=gpu:" + std::to_string(node_gpus), "--export=ALL", "sh", "-c",
                 kSlurmGpuSelectScript, "rlhf-gpu-select", std::to_string(worker.device_id)});
  } else {
    args.insert(args.end(), {"--gres=none", "--export=ALL"});
  }
  args.insert(args.end(),
              {rlhf_program, "worker", "--connect", endpoint, "--role", role, "--rank", rank});
  return step;
}

std::vector<std::string> slurm_allocation_hosts() {
  const char* list = std::getenv("SLURM_JOB_NODELIST");
  if (!list || !*list)
    throw InputError(
        "cluster.launcher is \"slurm\" but SLURM_JOB_NODELIST is not set: run inside an "
        "allocation (sbatch or salloc)");
  return expand_hostlist(list);
}

}  // namespace rlhf
