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
    // Fault tolerance (docs/architecture.md "Reliability"): what is recovered, how often.
    t.integer("fault.max_restarts", 3, 0, 1000,
              "Restarts allowed per role within fault.restart_window_s: a lost rollout, ref, "
              "reward, teacher or judge worker is relaunched on its device and its unfinished "
              "micro batches run again; a lost actor or critic rank restarts every worker from "
              "the newest complete checkpoint (ckpt.save_steps). 0: a lost worker stops the job.");
    t.number("fault.restart_window_s", 3600.0, 1, 7 * 86400,
             "The window fault.max_restarts counts in (seconds).");
    t.number("fault.collective_timeout_s", 300.0, 1, 86400,
             "A collective (Gloo, NCCL) that does not finish in this many seconds fails its "
             "rank, as a death of the rank that hung would.");
    t.number("fault.step_timeout_s", 1800.0, 0, 7 * 86400,
             "With requests in flight and none answered for this many seconds, every worker's "
             "current operation is written to the console and the job is treated as hung (a "
             "lost worker: restarted as fault.max_restarts allows). 0: never.");
  };
  return s;
}

}  // namespace rlhf::scheduler
