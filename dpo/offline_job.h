// The loop shared by the offline drivers (dpo, sft, rm): reading and tokenizing the data,
// the order of global batches (a fresh permutation per epoch, so a step number fixes its
// batch and --resume continues the same trajectory), each step's record and console line.
// Role start-up, checkpoints, the export and the metrics sink are the job runtime's
// (runtime/job_runtime.h, shared with ppo/). A job subclass says what a step sends, what it
// reports and how it evaluates; nothing here knows a loss.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <vector>

#include "core/spec.h"
#include "dpo/driver.h"
#include "dpo/offline_batch.h"
#include "dpo/preference_dataset.h"
#include "dpo/worker_ops.h"
#include "engine/role_config.h"
#include "runtime/job_runtime.h"
#include "scheduler/role_group.h"
#include "transport/message.h"

namespace rlhf {
class RoleGroup;
class Scheduler;
namespace report {
class MetricsSink;
}  // namespace report
namespace tokenizer {
class Tokenizer;
class PromptFormatter;
}  // namespace tokenizer
}  // namespace rlhf

namespace rlhf::dpo {

// sft: one row per example; dpo, rm: two (chosen, rejected); kto: two laid out as pairs, the
// labelled row and a mismatched KL row (its prompt with another example's response).
enum class RowLayout { kSingle, kPairs, kUnpairedWithKl };

// What an offline job reads of the spec beyond its loss's own fields and the runtime's
// settings, once, when it is built: the roles' configs, the data, the evaluation schedule and
// the reference's identity. The job keeps no JobSpec.
struct OfflineSettings {
  // Each model role the spec uses, its Init config (engine::model_role_configs, set once the
  // step count is known); the runtime's init_role sets the trained role's micro batches per step.
  std::map<Role, engine::ModelRoleConfig> roles;
  std::map<Role, Dispatch> dispatch;  // how a scatter spreads over each model role's ranks
  OfflineDataConfig train_data, eval_data;
  bool apply_chat_template = false;
  int64_t prompt_max_len = 0, max_len = 0;
  int64_t eval_steps = 0;              // eval.steps
  int64_t micro_batch_size = 1;        // train.micro_batch_size
  std::string ref_model;               // ref.model
  std::string actor_dtype, ref_dtype;  // actor.dtype, ref.dtype

  static OfflineSettings from_spec(const JobSpec& spec);  // all but `roles`
};

class OfflineJob {
 public:
  OfflineJob(const JobSpec& spec, OfflineDriverOptions options, Role trained, RowLayout layout);
  virtual ~OfflineJob();
  void run(Scheduler& s, std::ostream& out);

 protected:
  // After every role's init (and a resume's load), before the first step.
  virtual void prepare(Scheduler&, std::ostream&) {}
  // One optimizer step on the trained group: this job's train request (dpo/worker_ops.h)
  // with micro_batch_size units, over `tensors`.
  virtual std::vector<Answered<ops::OfflineStepReply>> train_call(
      RoleGroup& group, int64_t micro_batch_size,
      const std::vector<NamedTensor>& tensors) const = 0;
  // Tensors a step needs beyond the rows of its examples `index` (into train_data()).
  virtual void add_step_tensors(const std::vector<int64_t>& /*index*/,
                                std::vector<NamedTensor>& /*tensors*/) const {}
  // Held-out figures on eval_data() (called only when there is some).
  virtual nlohmann::json evaluate(Scheduler& s) = 0;
  virtual std::string step_line(const nlohmann::json& rec) const = 0;
  virtual std::string eval_line(const nlohmann::json& figures) const = 0;

  // Helpers for subclasses.
  const std::string& kind() const { return runtime_.kind(); }  // "dpo", "sft", "rm"
  const OfflineSettings& settings() const { return settings_; }
  Role trained_role() const { return trained_; }
  const std::vector<TokenizedExample>& train_data() const { return train_; }
  // The eval examples, trimmed to a multiple of the trained group's size (so each rank of
  // a call_all takes an equal share).
  const std::vector<TokenizedExample>& eval_data() const { return eval_; }
  int64_t pad_id() const { return pad_id_; }
  const std::string& run_dir() const { return runtime_.settings().run_dir; }
  // Rows of `data`'s examples `index` (all when empty) in this job's layout, unpacked.
  RowTensors rows_of(const std::vector<TokenizedExample>& data,
                     const std::vector<int64_t>& index = {}) const;
  // The trained group's sequence log-probs (with `reference`, its adapters off) or scores of
  // `rows`: each rank takes its share (a call_all: the group may be ZeRO-3), the ranks'
  // values concatenated in rank order (rows in order).
  torch::Tensor gather_log_probs(Scheduler& s, const RowTensors& rows, bool reference = false);
  torch::Tensor gather_scores(Scheduler& s, const RowTensors& rows);

 private:
  void load_data(RowLayout layout);
  TokenizedExample tokenize(const std::string& prompt, const std::string& response,
                            const std::string& rejected, bool pair);
  // An SFT conversation (SftRow::messages): the prompt, then every later turn as the response,
  // trained where the model wrote it (TokenizedExample::response_mask).
  TokenizedExample tokenize_conversation(const nlohmann::json& messages);
  std::vector<int64_t> step_index(int64_t step) const;
  nlohmann::json train_step(Scheduler& s, int64_t step);
  void write_eval(Scheduler& s, const char* when, int64_t step, std::ostream& out);

  runtime::JobRuntime runtime_;
  OfflineSettings settings_;
  OfflineDriverOptions options_;
  Role trained_;
  RowLayout layout_;
  std::string model_dir_;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer_;
  std::unique_ptr<tokenizer::PromptFormatter> formatter_;
  int64_t pad_id_ = 0, eos_id_ = -1;
  std::vector<TokenizedExample> train_, eval_;
  int64_t truncated_ = 0, skipped_lines_ = 0;
  int64_t batch_size_ = 0, micro_ = 0, group_size_ = 1, accum_ = 1;
  int64_t epochs_ = 1, steps_per_epoch_ = 0, total_steps_ = 0;
  uint64_t seed_ = 42;
  bool packing_ = false;
};

}  // namespace rlhf::dpo
