#include "scheduler/spec_keys.h"

namespace rlhf::scheduler {

SpecSection spec_section() {
  SpecSection s;
  s.owner = "scheduler";
  s.keys = [](KeyTable& t) {
    t.number("scheduler.heartbeat_interval_s", 1.0, 0, 60, "Seconds between heartbeats.", true);
    t.number("scheduler.worker_timeout_s", 5.0, 0, 3600,
             "A worker silent this long is declared dead and the job stops (time the driver "
             "itself did not run, a stalled machine, is not counted).",
             true);
    t.integer("scheduler.max_inflight", 2, 1, 64, "Requests in flight per worker (back-pressure).");
    t.number("scheduler.request_timeout_s", 1800.0, 0, 86400,
             "Seconds one operation may take before the job fails.", true);
  };
  return s;
}

}  // namespace rlhf::scheduler
