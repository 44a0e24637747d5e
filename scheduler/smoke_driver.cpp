// Smoke driver: ping, info and a bit-exact echo of a mixed-dtype batch through every group.
#include "scheduler/smoke_driver.h"

#include <ATen/ATen.h>

#include <chrono>
#include <iomanip>

#include "scheduler/role_group.h"
#include "scheduler/worker_process.h"
#include "transport/worker_ops.h"

namespace rlhf {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// A batch whose rows differ (so a mix-up of micro batches shows) in several dtypes.
std::vector<NamedTensor> smoke_batch(int64_t rows) {
  at::manual_seed(1234);
  return {{"tokens", at::arange(rows * 16, at::kLong).reshape({rows, 16})},
          {"log_probs", at::randn({rows, 16}, at::kFloat)},
          {"hidden", at::randn({rows, 4, 8}, at::kFloat).to(at::kBFloat16)},
          {"action_mask", at::rand({rows, 16}) > 0.5}};
}

void check_echo(const std::vector<NamedTensor>& sent, const Message& back, Role role) {
  for (const auto& t : sent) {
    const at::Tensor& got = back.tensor(t.name);
    if (got.scalar_type() != t.tensor.scalar_type() || !got.sizes().equals(t.tensor.sizes()) ||
        !at::equal(got, t.tensor))
      throw RuntimeError(std::string("smoke: ") + role_name(role) + " echo of \"" + t.name +
                         "\" did not come back bit-exact");
  }
}

void smoke(Scheduler& scheduler, std::ostream& out, int rounds) {
  out << "smoke driver: " << scheduler.workers().size() << " workers registered at "
      << scheduler.endpoint() << "\n";
  for (Role role : scheduler.roles()) {
    RoleGroup& group = scheduler.group(role);
    auto t0 = Clock::now();
    group.call_all(ops::Ping{});
    const double ping_ms = ms_since(t0);
    for (const auto& answered : group.call_all(ops::Info{})) {
      const ops::InfoReply& info = answered.reply;
      out << "  " << std::left << std::setw(10) << role_name(role) << " rank " << info.rank
          << "  pid " << info.pid << "  device " << info.device << "  peak RSS "
          << info.peak_rss_bytes / (1 << 20) << " MiB\n";
    }
    const auto batch = smoke_batch(4 * group.size() + 1);
    t0 = Clock::now();
    for (int r = 0; r < rounds; ++r) check_echo(batch, group.scatter("echo", batch, 2), role);
    out << "  " << role_name(role) << ": ping all " << group.size() << " ranks " << std::fixed
        << std::setprecision(2) << ping_ms << " ms; echo " << rounds << "x bit-exact in "
        << ms_since(t0) << " ms\n";
  }
  out << "smoke driver: ok\n";
}

}  // namespace

JobDriver smoke_driver(int rounds) {
  return [rounds](Scheduler& scheduler, std::ostream& out) { smoke(scheduler, out, rounds); };
}

}  // namespace rlhf
