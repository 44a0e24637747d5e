#include "cli/preflight.h"

#include <torch/cuda.h>

#include <algorithm>
#include <filesystem>

#include "core/placement.h"
#include "core/python_ref.h"
#include "core/run_dir.h"
#include "core/text.h"
#include "dpo/driver.h"
#include "dpo/preference_dataset.h"
#include "engine/memory_plan.h"
#include "models/config.h"
#include "models/expert_parallel.h"
#include "models/lora.h"
#include "models/safetensors.h"
#include "models/tensor_parallel.h"
#include "ppo/driver.h"
#include "ppo/prompt_dataset.h"
#include "rewards/format_reward.h"
#include "rewards/rule_rewards.h"
#include "rewards/spec_keys.h"
#include "tokenizer/tokenizer.h"

namespace rlhf::cli {
namespace {

namespace fs = std::filesystem;

// A check that throws InputError on failure, recorded as a problem of `path`.
template <typename F>
void check(std::vector<SpecProblem>& problems, const std::string& path, F&& f) {
  try {
    f();
  } catch (const SpecError& e) {
    for (const auto& p : e.problems()) problems.push_back(p);
  } catch (const InputError& e) {
    std::string what = e.what();
    // Library messages often start with the key already ("reward.rule: unknown rule ...").
    if (!path.empty() && what.rfind(path + ": ", 0) == 0) what = what.substr(path.size() + 2);
    problems.push_back({path, what});
  }
}

// The names the spec uses that must be built in: reward.rule and synthetic:NAME datasets.
void check_names(const JobSpec& spec, std::vector<SpecProblem>& problems) {
  const bool ppo = spec.kind() == JobKind::kPpo;
  if (ppo) {
    const bool listed = !spec.at("reward.sources").empty();
    for (const auto& src : rewards::reward_sources(spec.json())) {
      const std::string kind = src.at("kind");
      if (kind == "rule") {
        const std::string rule = src.at("rule");
        check(problems, listed ? "reward.sources" : "reward.rule", [&] {
          if (rule == "format")
            rewards::FormatReward(src.value("pattern", std::string()));
          else
            rewards::find_rule_reward(rule);
        });
      } else if (kind == "python") {
        const std::string fn = src.at("python");
        const auto ref = parse_python_ref(fn);
        const std::string file = ref ? ref->file : fn;
        check(problems, listed ? "reward.sources" : "reward.python", [&] {
          if (!std::filesystem::is_regular_file(file))
            throw InputError("\"" + fn + "\": no such file " + file);
        });
      }
    }
  }
  const std::string prefix = "synthetic:";
  for (const char* key : {ppo ? "data.prompt_dataset" : "data.dataset", "data.eval_dataset"}) {
    const std::string source = spec.get_string(key);
    if (source.rfind(prefix, 0) != 0) continue;
    const std::string name = source.substr(prefix.size());
    check(problems, key, [&] {
      if (ppo) {
        const auto& known = ppo::synthetic_prompt_datasets();
        if (std::find(known.begin(), known.end(), name) == known.end())
          throw InputError("unknown synthetic dataset \"" + source +
                           "\" (known: synthetic:" + join(known, ", synthetic:") + ")");
      } else if (spec.kind() == JobKind::kSft) {
        dpo::synthetic_sft(name, 0, 0);
      } else {
        dpo::synthetic_preferences(name, 0, 0);
      }
    });
  }
}

// Every used role's model directory opens as a checkpoint (headers, offsets, sizes: a
// truncated or corrupt safetensors file is named here, not by a worker later).
void check_model_files(const JobSpec& spec, std::vector<SpecProblem>& problems) {
  std::vector<std::string> seen;
  for (Role r : spec.used_roles()) {
    const std::string key = std::string(role_name(r)) + ".model";
    const std::string dir = spec.get_string(key);
    if (dir.empty() || !fs::exists(fs::path(dir) / "config.json") ||
        std::find(seen.begin(), seen.end(), dir) != seen.end())
      continue;
    seen.push_back(dir);
    check(problems, key, [&] { models::CheckpointReader reader(dir); });
  }
}

// A LoRA adapter to start from (<role>.lora.adapter) fits the role's base model: its keys
// and every lora_A / lora_B shape (and a saved value head's), named here rather than by a
// worker later.
void check_lora_adapters(const JobSpec& spec, std::vector<SpecProblem>& problems) {
  for (Role r : spec.used_roles()) {
    const std::string role = role_name(r), key = role + ".lora.adapter";
    if (!spec.trains(r) || spec.get_string(key).empty()) continue;
    const std::string model = spec.get_string(role + ".model");
    check(problems, key, [&] {
      auto base = models::ModelConfig::from_json_file((fs::path(model) / "config.json").string());
      if (r == Role::kCritic || r == Role::kReward) {  // a saved value head must fit the role's
        base.head = models::HeadKind::kValue;
        base.value_head_prefix = spec.get_string(role + ".value_head_prefix");
      }
      models::check_adapter(spec.get_string(key), base);
    });
  }
}

// A teacher scores the actor's token ids: it must read them as the same text (one tokenizer)
// and have a row for every id the actor can sample (its embedding at least as wide).
void check_teacher(const JobSpec& spec, std::vector<SpecProblem>& problems) {
  if (!spec.uses(Role::kTeacher)) return;
  const std::string actor = spec.get_string("actor.model");
  const std::string teacher = spec.get_string("teacher.model");
  check(problems, "teacher.model", [&] {
    const std::string why = tokenizer::tokenizer_difference(*tokenizer::load_tokenizer(actor),
                                                            *tokenizer::load_tokenizer(teacher));
    if (!why.empty())
      throw InputError(teacher + " does not share the actor's tokenizer (" + actor + "): " + why +
                       "; a teacher scores the actor's token ids, so both must use one "
                       "tokenizer");
    const auto config = [](const std::string& dir) { return models::model_config_of(dir); };
    const int64_t va = config(actor).vocab_size, vt = config(teacher).vocab_size;
    if (vt < va)
      throw InputError(teacher + " has " + std::to_string(vt) +
                       " embedding rows, fewer than the "
                       "actor's " +
                       std::to_string(va) +
                       ": the actor may sample ids the "
                       "teacher cannot score");
  });
}

// Workers start on this machine: a cuda worker needs its GPU here.
void check_devices(const JobSpec& spec, std::vector<SpecProblem>& problems) {
  const Placement placement = place(spec);
  const int gpus = static_cast<int>(torch::cuda::device_count());
  for (const auto& w : placement.workers) {
    if (w.device_kind != DeviceKind::kCuda || w.device_id < gpus) continue;
    problems.push_back(
        {"cluster.nodes", w.label() + " is placed on cuda node '" + w.node + "' device " +
                              std::to_string(w.device_id) + ", but this machine has " +
                              std::to_string(gpus) + " CUDA device" + (gpus == 1 ? "" : "s") +
                              " (`rlhf version` says what torch sees; `rlhf plan` and `rlhf "
                              "validate --no-files` size a GPU job on any machine)"});
    return;  // one line says it
  }
}

// The planner's hard limits (a KV budget below one prompt) where every model config is known;
// first the rollout's tensor-parallel split, which needs the model's sizes (the spec alone
// checks only the worker count).
void check_plan(const JobSpec& spec, std::vector<SpecProblem>& problems) {
  std::vector<std::string> missing;
  const auto models = engine::load_role_models(spec, missing);
  if (models.count(Role::kRollout)) {
    const size_t before = problems.size();
    const std::string key = "rollout.tensor_parallel_size";
    check(problems, key, [&] {
      models::check_tensor_parallel(models.at(Role::kRollout), static_cast<int>(spec.get_int(key)),
                                    "the rollout model " + spec.get_string("rollout.model"));
    });
    if (problems.size() > before) return;
  }
  for (Role r : {Role::kActor, Role::kCritic, Role::kReward}) {
    const std::string role = role_name(r), key = role + ".expert_parallel_size";
    if (!models.count(r) || spec.get_int(key) == 1) continue;
    const size_t before = problems.size();
    check(problems, key, [&] {
      models::check_expert_parallel(models.at(r), static_cast<int>(spec.get_int(key)),
                                    "the " + role + " model " + spec.get_string(role + ".model"));
    });
    if (problems.size() > before) return;
  }
  if (spec.kind() == JobKind::kPpo && models.count(Role::kActor))
    for (const char* key : {"algo.routing_replay", "algo.routing_stats"})
      if (spec.get_bool(key) && models.at(Role::kActor).moe.num_experts == 0)
        problems.push_back({key, "the actor's model " + spec.get_string("actor.model") +
                                     " has no mixture-of-experts layers: there are no routes to "
                                     "record"});
  if (!missing.empty()) return;
  check(problems, "", [&] { engine::plan_memory(spec, models, /*suggest=*/false); });
}

void check_resume(const JobSpec& spec, const PreflightOptions& options, Preflight& out,
                  std::vector<SpecProblem>& problems) {
  const std::string ckpt = checkpoint_directory(spec);
  out.resume_from = engine::latest_driver_state(ckpt, engine::checkpointed_role(spec));
  if (!out.resume_from) {
    problems.push_back({"ckpt.path", "--resume: no complete checkpoint under " + ckpt +
                                         " (run without --resume to start over)"});
    return;
  }
  const auto changed =
      engine::changed_settings(out.resume_from->data.value("settings", nlohmann::json()), spec);
  if (changed.empty() || options.resume_changed) return;
  problems.push_back({"", "--resume: the checkpoint of step " +
                              std::to_string(out.resume_from->step) + " (" + out.resume_from->file +
                              ") was trained with other settings that change the trajectory: " +
                              join(changed, "; ") +
                              ". Resume with these changes anyway with --resume-changed, or set "
                              "them back"});
}

}  // namespace

Preflight preflight(const JobSpec& spec, const PreflightOptions& options) {
  Preflight out;
  std::vector<SpecProblem> problems;
  check_names(spec, problems);
  if (options.machine) {
    for (const auto& m : missing_inputs(spec)) problems.push_back(m);
    if (problems.empty()) check_model_files(spec, problems);
    if (problems.empty()) check_lora_adapters(spec, problems);
    if (problems.empty()) check_teacher(spec, problems);
    check_devices(spec, problems);
  }
  if (problems.empty()) check_plan(spec, problems);
  if (options.resume) check_resume(spec, options, out, problems);
  // The driver reads the data and the tokenizer: bad lines and tokenizer files are named
  // here, before any worker starts.
  if (options.machine && problems.empty()) {
    check(problems, "", [&] {
      out.driver = spec.kind() == JobKind::kPpo ? ppo::ppo_driver(spec, {options.resume})
                                                : dpo::offline_driver(spec, {options.resume});
    });
  }
  if (!problems.empty()) throw SpecError(spec.source(), problems);
  return out;
}

}  // namespace rlhf::cli
