// Checkpoints of a PPO-family job: each trained role saves its own shards (actor, critic)
// and the driver's state (prompts consumed, KL coefficient) is written last, which marks the
// step's checkpoint complete; `--resume` loads the newest complete one. The HF export of the
// trained actor at the end of a run.
#include <filesystem>
#include <future>

#include "core/errors.h"
#include "engine/driver_state.h"
#include "models/pretrained.h"
#include "ppo/ppo_job.h"
#include "scheduler/role_group.h"
#include "scheduler/scheduler.h"

namespace rlhf::ppo::job {

namespace fs = std::filesystem;
using nlohmann::json;

void PpoJob::save(Scheduler& s, int64_t step, int64_t prompts_consumed, std::ostream& out) {
  const std::string tag = "global_step" + std::to_string(step);
  const auto t0 = Clock::now();
  out << "ppo: saving the checkpoint of step " << step << " to " << c_.ckpt_path << std::endl;
  s.progress().begin("saving the checkpoint of step " + std::to_string(step));
  std::vector<std::future<void>> calls;
  for (Role role : {Role::kActor, Role::kCritic}) {
    if (role == Role::kCritic && !has_critic_) continue;
    const ops::Save request{(fs::path(c_.ckpt_path) / role_name(role) / tag).string(),
                            c_.save_only_model, static_cast<int>(c_.max_ckpt)};
    calls.push_back(in_parallel([&s, role, request] { s.group(role).call_all(request); }));
  }
  for (auto& c : calls) c.get();
  // The driver's own state last: its presence marks the whole step's checkpoint complete.
  const std::string file = engine::write_driver_state(
      c_.ckpt_path, step, {{"prompts_consumed", prompts_consumed}, {"kl_coef", kl_.value()}},
      settings_.trajectory_settings, c_.max_ckpt);
  s.progress().end();
  out << "ppo: checkpoint of step " << step << " saved in " << seconds_text(seconds_since(t0))
      << " s (" << file << ")" << std::endl;
}

int64_t PpoJob::resume(Scheduler& s) {
  const auto state = engine::latest_driver_state(c_.ckpt_path, Role::kActor);
  if (!state) throw InputError("--resume: no complete checkpoint under " + c_.ckpt_path);
  std::vector<std::future<void>> calls;
  for (Role role : {Role::kActor, Role::kCritic}) {
    if (role == Role::kCritic && !has_critic_) continue;
    const ops::Load request{(fs::path(c_.ckpt_path) / role_name(role) / state->tag).string()};
    calls.push_back(in_parallel([&s, role, request] { s.group(role).call_all(request); }));
  }
  for (auto& c : calls) c.get();
  stream_->seek(state->data.at("prompts_consumed").get<int64_t>());
  kl_.set_value(state->data.at("kl_coef").get<double>());
  return state->step;
}

void PpoJob::export_actor(Scheduler& s, std::ostream& out) {
  std::string dir = (fs::path(run_dir_) / "export" / "actor").string();
  out << "ppo: exporting the trained actor to " << dir << std::endl;
  s.progress().begin("exporting the actor");
  s.group(Role::kActor).call_all(ops::ExportHf{dir});
  s.progress().end();
  models::copy_tokenizer_files(settings_.actor_model, dir);  // a complete model dir
  out << "ppo: trained actor exported to " << dir << std::endl;
}

}  // namespace rlhf::ppo::job
