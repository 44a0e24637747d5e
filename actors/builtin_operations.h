// Operations every worker serves whatever its role: `ping` (liveness through the whole
// request path), `echo` (returns its tensors unchanged: the bit-exactness check) and
// `info` (pid, role, rank, device, peak RSS). Model operations live with their roles.
#pragma once

#include "actors/operation_registry.h"

namespace rlhf {

void add_builtin_operations(OperationRegistry& registry);

}  // namespace rlhf
