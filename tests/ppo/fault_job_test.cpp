// Issue 45: jobs that survive their workers. grpo_tiny for 60 steps while a seeded killer
// sends SIGKILL to rollout, ref and actor workers and SIGSTOP to a rollout worker: the run
// finishes every step, metrics.jsonl holds each step once, every step's reward equals an
// undisturbed run's with the same seed (the lost micro batches are generated again with their
// rows' own sampling streams, and a restart resumes exactly from its checkpoint), every
// restart is in restarts.jsonl and the step records with its cause, TensorBoard shows each
// step once, and no process is left.
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <thread>

#include "tests/ppo/ppo_job.h"
#include "tests/support/processes.h"

namespace rlhf::ppo::job_test {
namespace {

using namespace std::chrono_literals;

class FaultJob : public PpoJob {
 protected:
  // grpo_tiny on 4 devices with two rollout engines, a checkpoint every 5 steps, restarts
  // enough for the killer and a 2 s heartbeat timeout.
  Result grpo(const std::string& name, int64_t steps) {
    return run(
        name,
        {"--set", R"(cluster.nodes=[{"name":"local","kind":"cpu","devices":4,"memory_gb":4}])",
         "--set", "rollout.devices=[2,3]", "--set", "rollout.micro_batch_size=4", "--set",
         "train.max_steps=" + std::to_string(steps), "--set", "ckpt.save_steps=5", "--set",
         "fault.max_restarts=20", "--set", "scheduler.worker_timeout_s=2", "--set",
         "logger.dashboard_port=0", "--set", "logger.tensorboard=true"},
        "examples/grpo_tiny.json");
  }
};

// Sends its signals on a seeded schedule, one every 5 to 10 steps of the run's metrics.jsonl
// (steps, not seconds: a tiny step takes 0.1 s here and more on a busy CI machine), to the
// workers listed in RUN/workers.json (re-read before each, so a relaunched worker is a target
// too) until stopped; remembers every pid.
class Killer {
 public:
  Killer(fs::path run, unsigned seed) : run_(std::move(run)), rng_(seed) {
    thread_ = std::thread([this] { loop(); });
  }
  ~Killer() { stop(); }
  void stop() {
    done_ = true;
    if (thread_.joinable()) thread_.join();
  }
  std::set<int> pids() const { return pids_; }
  std::map<std::string, int> sent() const { return sent_; }

 private:
  void loop() {
    // Each kind at least once, in this order, then again.
    const std::vector<std::pair<std::string, int>> plan = {
        {"rollout", SIGKILL}, {"ref", SIGKILL}, {"actor", SIGKILL}, {"rollout", SIGSTOP}};
    std::uniform_int_distribution<size_t> gap(5, 10);
    size_t at = gap(rng_);
    for (size_t k = 0; !done_; ++k, at += gap(rng_)) {
      while (!done_ && steps() < at) std::this_thread::sleep_for(20ms);
      if (done_) break;
      const auto& [role, signo] = plan[k % plan.size()];
      std::vector<int> candidates;
      for (const auto& w : listed()) {
        pids_.insert(w.at("pid").get<int>());
        if (w.at("role") == role) candidates.push_back(w.at("pid").get<int>());
      }
      if (candidates.empty()) continue;
      const int pid =
          candidates[std::uniform_int_distribution<size_t>(0, candidates.size() - 1)(rng_)];
      if (::kill(pid, signo) == 0) ++sent_[role + (signo == SIGKILL ? " SIGKILL" : " SIGSTOP")];
    }
    for (const auto& w : listed()) pids_.insert(w.at("pid").get<int>());
  }
  size_t steps() const {  // records in metrics.jsonl (a restart drops those it runs again)
    const std::string text = test::slurp((run_ / "metrics.jsonl").string());
    return static_cast<size_t>(std::count(text.begin(), text.end(), '\n'));
  }
  std::vector<json> listed() const {
    const std::string text = test::slurp((run_ / "workers.json").string());
    if (text.empty()) return {};
    try {
      return json::parse(text).get<std::vector<json>>();
    } catch (const std::exception&) {  // being rewritten
      return {};
    }
  }

  fs::path run_;
  std::mt19937 rng_;
  std::atomic<bool> done_{false};
  std::set<int> pids_;
  std::map<std::string, int> sent_;
  std::thread thread_;
};

std::map<int64_t, json> by_step(const std::vector<json>& records) {
  std::map<int64_t, json> out;
  for (const auto& r : records)
    if (r.contains("reward_mean")) {
      EXPECT_FALSE(out.count(r.at("step").get<int64_t>())) << "step " << r.at("step") << " twice";
      out[r.at("step").get<int64_t>()] = r;
    }
  return out;
}

TEST_F(FaultJob, GrpoSurvivesKilledAndStoppedWorkersAndTrainsAsAnUndisturbedRun) {
  constexpr int64_t kSteps = 60;
  const Result calm = grpo("calm", kSteps);
  ASSERT_EQ(calm.exit_code, 0) << calm.err;
  Killer killer(run_dir("chaos"), 45);
  const Result chaos = grpo("chaos", kSteps);
  killer.stop();
  ASSERT_EQ(chaos.exit_code, 0) << chaos.out << chaos.err;
  const auto want = by_step(read_metrics(run_dir("calm") / "metrics.jsonl"));
  const auto got = by_step(read_metrics(run_dir("chaos") / "metrics.jsonl"));
  ASSERT_EQ(got.size(), static_cast<size_t>(kSteps)) << "every step once";
  for (const auto& [step, record] : want)
    EXPECT_EQ(got.at(step).at("reward_mean"), record.at("reward_mean")) << "step " << step;
  // Every restart with its cause: each relaunched worker and each restart of the job.
  std::map<std::string, int> worker_restarts;
  int job_restarts = 0, stopped = 0;
  for (const auto& r : test::read_jsonl((run_dir("chaos") / "restarts.jsonl").string())) {
    if (r.at("kind") == "job") {
      ++job_restarts;
      EXPECT_GE(r.at("resume_step").get<int64_t>(), 0);
      continue;
    }
    ++worker_restarts[r.at("role").get<std::string>()];
    const std::string cause = r.at("cause");
    stopped += cause.rfind("stopped answering", 0) == 0;
    EXPECT_TRUE(cause == "killed by signal 9 (SIGKILL)" || cause.rfind("stopped answering", 0) == 0)
        << cause;
  }
  const auto sent = killer.sent();
  std::cout << "[ measured ] signals sent:";
  for (const auto& [what, n] : sent) std::cout << " " << what << " x" << n;
  std::cout << "; workers relaunched:";
  for (const auto& [role, n] : worker_restarts) std::cout << " " << role << " x" << n;
  std::cout << "; job restarts " << job_restarts << std::endl;
  EXPECT_GE(sent.count("actor SIGKILL"), 1u) << "the run ended before the killer's plan";
  EXPECT_GE(job_restarts, 1) << "a killed actor restarts the job from its checkpoint";
  EXPECT_GE(worker_restarts["rollout"] + worker_restarts["ref"], 1);
  EXPECT_GE(stopped, 1) << "the stopped rollout worker is killed and relaunched";
  // The last step record counts them as restarts.jsonl does.
  const json counts = got.rbegin()->second.at("restarts");
  EXPECT_EQ(counts.at("job").get<int>(), job_restarts);
  for (const auto& [role, n] : worker_restarts)
    EXPECT_EQ(counts.at("worker").value(role, 0), n) << role;
  EXPECT_NE(chaos.err.find("rlhf run: fault: "), std::string::npos);
  // TensorBoard's own reader (tests/cli/read_tensorboard.py) sees each step once, too.
  const fs::path board = run_dir("chaos") / "board.json";
  const std::string read = std::string("'") + RLHF_PYTHON + "' '" + RLHF_SOURCE_DIR +
                           "/tests/cli/read_tensorboard.py' '" +
                           (run_dir("chaos") / "tensorboard").string() + "' > '" + board.string() +
                           "'";
  ASSERT_EQ(std::system(read.c_str()), 0) << read;
  std::vector<int64_t> board_steps;
  const json read_back = json::parse(test::slurp(board.string()));
  for (const auto& point : read_back.at("scalars").at("reward_mean"))
    board_steps.push_back(point[0].get<int64_t>());
  std::vector<int64_t> each_once(kSteps);
  std::iota(each_once.begin(), each_once.end(), 1);
  EXPECT_EQ(board_steps, each_once);
  // No process of the run is left, the stopped one included.
  for (int pid : killer.pids())
    EXPECT_TRUE(testing::poll_until([&] { return !testing::pid_alive(pid); }, 5s)) << pid;
}

}  // namespace
}  // namespace rlhf::ppo::job_test
