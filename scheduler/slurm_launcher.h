// Slurm: the allocation's hosts from SLURM_JOB_NODELIST (the compressed hostlist syntax,
// "node[01-03,7],gpu-a") and the `srun` step that runs one worker on one of them. The step
// is a child of `rlhf run`: its exit is the worker's death (the scheduler reports it), and
// killing it ends the remote task. No other Slurm API is used (no libslurm).
#pragma once

#include <string>
#include <vector>

#include "core/placement.h"

namespace rlhf {

// Expands a Slurm hostlist: "node[01-03,7]" -> node01 node02 node03 node7 (zero padding
// kept as written), "a,b[1-2]" -> a b1 b2, "rack[1-2]-gpu[0-1]" -> four hosts. Throws
// InputError naming the text and what is wrong (an unclosed bracket, a reversed range).
std::vector<std::string> expand_hostlist(const std::string& text);

struct SlurmStep {
  std::string program;            // "srun"
  std::vector<std::string> args;  // everything after it
};

// The step that runs `worker` on its host: srun --nodes=1 --ntasks=1 -w HOST --overlap
// --kill-on-bad-exit=1 --job-name=rlhf-ROLE-RANK --export=ALL RLHF worker --connect ENDPOINT
// --role ROLE --rank RANK. The token and CURVE key travel in the environment (--export=ALL),
// never on a command line others can read in ps.
SlurmStep slurm_step(const WorkerPlacement& worker, const std::string& rlhf_program,
                     const std::string& endpoint);

// The allocation's hosts (SLURM_JOB_NODELIST expanded); InputError when it is not set
// (not inside sbatch/salloc) or malformed.
std::vector<std::string> slurm_allocation_hosts();

}  // namespace rlhf
