// The built-in smoke driver `rlhf run` uses until the PPO/DPO drivers exist: pings every
// role group, asks each worker for its info, and pushes a batch of several dtypes through
// each group's scatter/gather (`echo`), checking it returns bit-exact. A driver is just
// a function of the started Scheduler; the PPO driver takes this one's place.
#pragma once

#include <functional>
#include <ostream>

#include "scheduler/scheduler.h"

namespace rlhf {

// Runs against a started scheduler and prints a summary to `out`; throws RuntimeError when
// something comes back wrong, WorkerFailure/JobInterrupted when the job fails.
using JobDriver = std::function<void(Scheduler& scheduler, std::ostream& out)>;

// `rounds` repeats of the echo check (a soak test of the transport).
JobDriver smoke_driver(int rounds);

}  // namespace rlhf
