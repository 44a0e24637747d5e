// Launcher names.
#include "scheduler/launcher.h"

#include "core/errors.h"

namespace rlhf {

LauncherKind launcher_kind(const std::string& name) {
  if (name == "local") return LauncherKind::kLocal;
  if (name == "manual") return LauncherKind::kManual;
  if (name == "slurm") return LauncherKind::kSlurm;
  throw InputError("cluster.launcher \"" + name + "\": expected local, manual or slurm");
}

const char* launcher_name(LauncherKind kind) {
  switch (kind) {
    case LauncherKind::kManual:
      return "manual";
    case LauncherKind::kSlurm:
      return "slurm";
    default:
      return "local";
  }
}

}  // namespace rlhf
