// How `rlhf run` gets its workers started (cluster.launcher): itself on this host (local),
// by whoever runs `rlhf worker --connect` (manual, any launcher: Kubernetes, mpirun, pdsh),
// or as Slurm job steps inside an allocation (slurm_launcher.h). The scheduler supervises
// all three the same way: heartbeats, and the processes it started itself.
#pragma once

#include <string>

namespace rlhf {

enum class LauncherKind { kLocal, kManual, kSlurm };

// "local", "manual" or "slurm"; InputError naming cluster.launcher otherwise.
LauncherKind launcher_kind(const std::string& name);
const char* launcher_name(LauncherKind kind);

}  // namespace rlhf
