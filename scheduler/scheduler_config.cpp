// SchedulerConfig from the job spec. Kept apart from scheduler.cpp so programs that build
// a config by hand (tests, benchmarks) do not link the spec.
#include <cmath>
#include <cstdlib>
#include <filesystem>

#include "core/cluster.h"
#include "core/run_dir.h"
#include "scheduler/scheduler.h"

namespace rlhf {
namespace {

std::chrono::milliseconds seconds_key(const JobSpec& spec, const std::string& path) {
  return std::chrono::milliseconds(
      static_cast<int64_t>(std::llround(spec.get_float(path) * 1000.0)));
}

}  // namespace

SchedulerConfig SchedulerConfig::from_spec(const JobSpec& spec, std::string worker_program) {
  SchedulerConfig c;
  c.worker_program = std::move(worker_program);
  c.bind_host = spec.get_string("cluster.interface");
  const PortRange ports = parse_port_range(spec.get_string("cluster.port_range"));
  c.port_low = ports.low;
  c.port_high = ports.high;
  c.launcher = launcher_kind(spec.get_string("cluster.launcher"));
  c.curve = spec.get_bool("cluster.curve");
  if (c.launcher != LauncherKind::kLocal) {
    c.register_timeout = seconds_key(spec, "cluster.join_timeout_s");
    // A launcher that starts workers before rlhf run knows its token hands it to both.
    if (const char* token = std::getenv("RLHF_TOKEN")) c.token = token;
  }
  c.run_dir = run_directory(spec);
  c.heartbeat_interval = seconds_key(spec, "scheduler.heartbeat_interval_s");
  c.worker_timeout = seconds_key(spec, "scheduler.worker_timeout_s");
  c.request_timeout = seconds_key(spec, "scheduler.request_timeout_s");
  c.max_inflight = static_cast<int>(spec.get_int("scheduler.max_inflight"));
  c.max_restarts = static_cast<int>(spec.get_int("fault.max_restarts"));
  c.restart_window = seconds_key(spec, "fault.restart_window_s");
  c.collective_timeout = seconds_key(spec, "fault.collective_timeout_s");
  c.progress_timeout = seconds_key(spec, "fault.step_timeout_s");
  return c;
}

}  // namespace rlhf
