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
// --kill-on-bad-exit=1 --job-name=rlhf-ROLE-RANK GPUS --export=ALL COMMAND, where COMMAND is
// RLHF worker --connect ENDPOINT --role ROLE --rank RANK. The token and CURVE key travel in
// the environment (--export=ALL), never on a command line others can read in ps.
//
// GPUS: a cpu worker asks for none (--gres=none: by default a step gets every GPU of the
// job). A cuda worker asks for all `node_gpus` GPUs of its node (--gres=gpu:N; --overlap
// lets every step on the node share them, so colocated roles meet on one GPU), and COMMAND
// is wrapped in `sh -c` that keeps entry DEVICE_ID of the CUDA_VISIBLE_DEVICES Slurm sets for
// the step (global ids, or 0..N-1 under cgroup ConstrainDevices: the entry is the same GPU
// either way) and execs the worker, which sees that one GPU as cuda:0. Slurm replaces the
// CUDA_VISIBLE_DEVICES placement exported, and --gpu-bind is ignored for a one-task step,
// so the pick happens inside the step. A step whose list is shorter fails naming it.
// `node_gpus` is the node's cluster.nodes `devices` (unused for cpu workers); RuntimeError
// when the worker's device id is not below it.
SlurmStep slurm_step(const WorkerPlacement& worker, int node_gpus, const std::string& rlhf_program,
                     const std::string& endpoint);

// The `sh -c` script a cuda worker's step runs: $1 is the device id, the rest the command.
extern const char* const kSlurmGpuSelectScript;

// The allocation's hosts (SLURM_JOB_NODELIST expanded); InputError when it is not set
// (not inside sbatch/salloc) or malformed.
std::vector<std::string> slurm_allocation_hosts();

}  // namespace rlhf
