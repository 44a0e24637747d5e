// The scheduler settings the tests that start real workers share: a fresh run directory,
// the real `rlhf` binary as the worker program, a quick heartbeat, and start and request
// limits generous enough for torch-linked processes on 2 busy cores.
#pragma once

#include <chrono>
#include <string>

#include "actors/wire_version.h"
#include "scheduler/scheduler.h"
#include "tests/support/processes.h"

namespace rlhf::testing {

inline SchedulerConfig scheduler_config(const std::string& name) {
  using namespace std::chrono_literals;
  SchedulerConfig c;
  c.run_dir = fresh_run_dir(name);
  c.worker_program = RLHF_CLI_PATH;
  c.wire_version = wire_version();  // the rlhf binary's: built from the same sources
  c.heartbeat_interval = 200ms;
  c.worker_timeout = 2000ms;
  c.register_timeout = 60s;  // a torch-linked process can take seconds to start
  c.request_timeout = 60s;
  return c;
}

}  // namespace rlhf::testing
