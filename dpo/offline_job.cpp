#include "dpo/offline_job.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>

#include "core/errors.h"
#include "core/timing.h"
#include "dpo/preference_dataset.h"
#include "engine/role_config.h"
#include "report/metrics.h"
#include "scheduler/role_group.h"
#include "scheduler/scheduler.h"
#include "tokenizer/prompt_format.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_config.h"

namespace rlhf::dpo {

namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

std::vector<int64_t> to_int64(const std::vector<tokenizer::TokenId>& ids) {
  return {ids.begin(), ids.end()};
}

// Mean over the ranks' replies of every number a train op returned (the trainer's loss,
// grad norm and lr agree across ranks already; accuracy and rewards are per rank). A key
// only some ranks report (KTO's rejected_reward when a rank's share holds no undesirable
// row) is the mean over the ranks that report it.
// The step's figures averaged over the ranks: the trainer's loss, grad_norm, lr and
// peak_tensor_bytes, and the loss's own means (accuracy, margins, ...).
json mean_over_ranks(const std::vector<Answered<ops::OfflineStepReply>>& replies) {
  std::map<std::string, std::pair<double, int>> sums;
  auto add = [&sums](const std::string& key, double v) {
    auto& [sum, n] = sums[key];
    sum += v;
    ++n;
  };
  for (const auto& answered : replies) {
    const ops::OfflineStepReply& r = answered.reply;
    add("loss", r.metrics.loss);
    add("grad_norm", r.metrics.grad_norm);
    add("lr", r.metrics.lr);
    add("peak_tensor_bytes", static_cast<double>(r.metrics.peak_tensor_bytes));
    if (r.metrics.loss_scale != 1.0) {  // FP16: the step's loss scale, overflows so far
      add("loss_scale", r.metrics.loss_scale);
      add("skipped_steps", static_cast<double>(r.metrics.skipped_steps));
    }
    for (const auto& [key, v] : r.means) add(key, v);
  }
  json out = json::object();
  for (const auto& [key, s] : sums) out[key] = s.first / static_cast<double>(s.second);
  return out;
}

}  // namespace

OfflineSettings OfflineSettings::from_spec(const JobSpec& spec) {
  OfflineSettings o;
  o.dispatch = model_role_dispatch(spec);
  o.train_data = OfflineDataConfig::from_spec(spec, false);
  o.eval_data = OfflineDataConfig::from_spec(spec, true);
  o.apply_chat_template = spec.get_bool("data.apply_chat_template");
  o.prompt_max_len = spec.get_int("data.prompt_max_len");
  o.max_len = spec.get_int("data.max_len");
  o.eval_steps = spec.get_int("eval.steps");
  o.micro_batch_size = spec.get_int("train.micro_batch_size");
  o.ref_model = spec.get_string("ref.model");
  o.actor_dtype = spec.get_string("actor.dtype");
  o.ref_dtype = spec.get_string("ref.dtype");
  return o;
}

OfflineJob::OfflineJob(const JobSpec& spec, OfflineDriverOptions options, Role trained,
                       RowLayout layout)
    : runtime_(runtime::RuntimeSettings::from_spec(spec, job_kind_name(spec.kind()))),
      settings_(OfflineSettings::from_spec(spec)),
      options_(options),
      trained_(trained),
      layout_(layout) {
  model_dir_ = spec.get_string(std::string(role_name(trained)) + ".model");
  tokenizer_ = tokenizer::load_tokenizer(model_dir_);
  const auto& special = tokenizer_->special_ids();
  if (special.eos) eos_id_ = *special.eos;
  pad_id_ = special.pad ? *special.pad : (special.eos ? *special.eos : 0);
  tokenizer::PromptFormatConfig fc;
  fc.input_template = spec.get_string("data.input_template");
  fc.apply_chat_template = spec.get_bool("data.apply_chat_template");
  fc.chat_template = tokenizer::parse_chat_template(spec.get_string("data.chat_template"));
  formatter_ = std::make_unique<tokenizer::PromptFormatter>(
      fc, tokenizer::read_tokenizer_config(model_dir_));
  batch_size_ = spec.get_int("train.batch_size");
  micro_ = spec.get_int("train.micro_batch_size");
  epochs_ = spec.get_int("train.max_epochs");
  seed_ = static_cast<uint64_t>(spec.get_int("train.seed"));
  packing_ = layout == RowLayout::kSingle && spec.get_bool("data.packing");
  load_data(layout);
  steps_per_epoch_ = static_cast<int64_t>(train_.size()) / batch_size_;
  if (steps_per_epoch_ == 0)
    throw InputError(spec.get_string("data.dataset") + ": " + std::to_string(train_.size()) +
                     " usable examples, fewer than train.batch_size (" +
                     std::to_string(batch_size_) + ")");
  total_steps_ = epochs_ * steps_per_epoch_;
  if (spec.get_int("train.max_steps") > 0)
    total_steps_ = std::min(total_steps_, spec.get_int("train.max_steps"));
  // The roles' LR schedules span the steps, known once the data is read.
  settings_.roles = engine::model_role_configs(spec, total_steps_);
}

OfflineJob::~OfflineJob() = default;

TokenizedExample OfflineJob::tokenize(const std::string& prompt, const std::string& response,
                                      const std::string& rejected, bool pair) {
  const bool chat = settings_.apply_chat_template;
  TokenizedExample e;
  // A chat template writes BOS itself; plain and templated prompts get the tokenizer's.
  e.prompt =
      to_int64(tokenizer_->encode(formatter_->format(json(prompt)),
                                  chat ? tokenizer::AddSpecial::kNo : tokenizer::AddSpecial::kYes));
  auto encode_response = [&](const std::string& text) {
    std::vector<int64_t> ids = to_int64(tokenizer_->encode(text, tokenizer::AddSpecial::kNo));
    if (eos_id_ >= 0) ids.push_back(eos_id_);  // OpenRLHF appends EOS to every response
    return ids;
  };
  const int64_t prompt_max = settings_.prompt_max_len, max_len = settings_.max_len;
  // A response cut to fit still ends in EOS (truncate_pair overwrites its last kept token).
  e.response = encode_response(response);
  bool cut = truncate_pair(e.prompt, e.response, prompt_max, max_len, eos_id_);
  if (pair) {
    e.rejected = encode_response(rejected);
    cut = truncate_pair(e.prompt, e.rejected, prompt_max, max_len, eos_id_) || cut;
  }
  truncated_ += cut ? 1 : 0;
  return e;
}

TokenizedExample OfflineJob::tokenize_conversation(const json& messages) {
  TokenizedExample e;
  const auto pieces = formatter_->conversation(messages);
  // The chat template writes BOS in the prompt; every piece is encoded on its own, as the
  // rollout encodes each environment turn it appends, so the token boundaries match.
  e.prompt = to_int64(tokenizer_->encode(pieces.front().text, tokenizer::AddSpecial::kNo));
  for (size_t i = 1; i < pieces.size(); ++i) {
    std::vector<int64_t> ids =
        to_int64(tokenizer_->encode(pieces[i].text, tokenizer::AddSpecial::kNo));
    // The model ends its turn with the end-of-turn token it samples (EOS: <|im_end|> in
    // ChatML instruct models, <|eot_id|> in Llama 3's), which the rollout stops on.
    if (pieces[i].model && eos_id_ >= 0) ids.push_back(eos_id_);
    e.response.insert(e.response.end(), ids.begin(), ids.end());
    e.response_mask.insert(e.response_mask.end(), ids.size(), pieces[i].model ? 1 : 0);
  }
  const bool cut =
      truncate_pair(e.prompt, e.response, settings_.prompt_max_len, settings_.max_len, eos_id_);
  // A cut response ends in EOS (truncate_pair), which is trained as the model's.
  e.response_mask.resize(e.response.size());
  if (cut && !e.response_mask.empty()) e.response_mask.back() = 1;
  truncated_ += cut ? 1 : 0;
  return e;
}

void OfflineJob::load_data(RowLayout layout) {
  const OfflineDataConfig& train_config = settings_.train_data;
  OfflineDataConfig eval_config = settings_.eval_data;
  // Without an eval set, a synthetic training set gets a held-out draw of its own generator
  // (another seed); a file has none (there is nothing to split off that the user chose).
  if (eval_config.source.empty() && train_config.source.rfind("synthetic:", 0) == 0) {
    eval_config.source = train_config.source;
    eval_config.max_samples = 256;
  }
  auto fill = [&](const OfflineDataConfig& c, std::vector<TokenizedExample>& out) {
    if (c.source.empty()) return;
    if (layout == RowLayout::kUnpairedWithKl) {
      // The KL reference point of KTO is estimated on mismatched pairs: example i's prompt
      // with the response of example (i + ceil(n/2)) mod n, fixed at load time (OpenRLHF
      // pairs each item with the next one of its shuffled batch; half a data set away keeps
      // a synthetic set's two rows of one prompt apart).
      auto data = load_unpaired(c);
      skipped_lines_ += data.stats.skipped;
      const size_t n = data.rows.size();
      for (size_t i = 0; i < n; ++i) {
        const auto& r = data.rows[i];
        out.push_back(tokenize(r.prompt, r.output, data.rows[(i + (n + 1) / 2) % n].output, true));
        out.back().desirable = r.desirable;
      }
    } else if (layout == RowLayout::kPairs) {
      auto data = load_preferences(c);
      skipped_lines_ += data.stats.skipped;
      for (const auto& r : data.rows) {
        out.push_back(tokenize(r.prompt, r.chosen, r.rejected, true));
        out.back().margin = r.margin;
      }
    } else {
      auto data = load_sft(c);
      skipped_lines_ += data.stats.skipped;
      for (const auto& r : data.rows) {
        if (r.messages.is_null()) {
          out.push_back(tokenize(r.prompt, r.output, "", false));
          continue;
        }
        try {
          out.push_back(tokenize_conversation(r.messages));
        } catch (const InputError& e) {
          throw InputError(c.source + (r.line > 0 ? ":" + std::to_string(r.line) : "") + ": " +
                           e.what());
        }
      }
    }
  };
  fill(train_config, train_);
  fill(eval_config, eval_);
}

RowTensors OfflineJob::rows_of(const std::vector<TokenizedExample>& data,
                               const std::vector<int64_t>& index) const {
  std::vector<const TokenizedExample*> picked;
  if (index.empty())
    for (const auto& e : data) picked.push_back(&e);
  for (int64_t i : index) picked.push_back(&data.at(static_cast<size_t>(i)));
  return layout_ != RowLayout::kSingle ? pair_rows(picked, pad_id_) : single_rows(picked, pad_id_);
}

namespace {

// `request` on every rank of `group` with `rows`; the ranks' tensors `name` concatenated.
template <typename Request>
torch::Tensor gather(RoleGroup& group, const Request& request, const RowTensors& rows,
                     const char* name) {
  auto replies = group.call_all(request, {{"sequences", rows.sequences},
                                          {"attention_mask", rows.attention_mask},
                                          {"loss_mask", rows.loss_mask}});
  std::vector<torch::Tensor> parts;
  for (const auto& r : replies) parts.push_back(r.tensors.tensor(name));
  return torch::cat(parts, 0);
}

}  // namespace

torch::Tensor OfflineJob::gather_log_probs(Scheduler& s, const RowTensors& rows, bool reference) {
  return gather(s.group(trained_), ops::SequenceLogProbs{{true, 2 * micro_}, reference}, rows,
                "log_probs");
}

torch::Tensor OfflineJob::gather_scores(Scheduler& s, const RowTensors& rows) {
  return gather(s.group(trained_), ops::SequenceScores{{true, 2 * micro_}}, rows, "scores");
}

std::vector<int64_t> OfflineJob::step_index(int64_t step) const {
  const int64_t epoch = (step - 1) / steps_per_epoch_, k = (step - 1) % steps_per_epoch_;
  torch::Generator gen = at::detail::createCPUGenerator(seed_ * 31 + static_cast<uint64_t>(epoch));
  torch::Tensor order = torch::randperm(static_cast<int64_t>(train_.size()), gen, torch::kLong);
  torch::Tensor picked = order.slice(0, k * batch_size_, (k + 1) * batch_size_).contiguous();
  return {picked.data_ptr<int64_t>(), picked.data_ptr<int64_t>() + picked.numel()};
}

json OfflineJob::train_step(Scheduler& s, int64_t step) {
  const auto t0 = Clock::now();
  const std::vector<int64_t> index = step_index(step);
  RowTensors rows;
  if (packing_) {
    std::vector<const TokenizedExample*> picked;
    for (int64_t i : index) picked.push_back(&train_[static_cast<size_t>(i)]);
    rows = packed_rows(picked, settings_.max_len, group_size_ * accum_, pad_id_);
  } else {
    rows = rows_of(train_, index);
  }
  const int64_t units = layout_ != RowLayout::kSingle ? rows.rows() / 2 : rows.rows();
  std::vector<NamedTensor> tensors = {{"sequences", rows.sequences},
                                      {"attention_mask", rows.attention_mask},
                                      {"loss_mask", rows.loss_mask}};
  add_step_tensors(index, tensors);
  auto replies = train_call(s.group(trained_), units / (group_size_ * accum_), tensors);
  const double t_step = seconds_since(t0);
  json rec = {
      {"step", step}, {"total_steps", total_steps_}, {"epoch", (step - 1) / steps_per_epoch_ + 1}};
  rec.update(mean_over_ranks(replies));
  rec["time_s"] = t_step;
  // Worker compute (slowest rank's train op) against the step's wall time: the rest is
  // batch building, transport and waiting (bench/dpo_offline.sh).
  const double compute = slowest_compute(replies);
  rec["worker_compute_s"] = compute;
  rec["overhead_share"] = std::max(0.0, 1.0 - compute / t_step);
  rec["tokens_per_s"] = static_cast<double>(rows.tokens()) / t_step;
  rec["samples_per_s"] = static_cast<double>(index.size()) / t_step;
  rec["rows"] = rows.rows();
  return rec;
}

void OfflineJob::write_eval(Scheduler& s, const char* when, int64_t step, std::ostream& out) {
  const auto t0 = Clock::now();
  s.progress().begin(std::string("evaluating ") + std::to_string(eval_.size()) +
                     " held-out examples " + when + " training");
  json figures = evaluate(s);
  json rec = {{"split", "eval"},
              {"when", when},
              {"step", step},
              {"examples", eval_.size()},
              {"time_s", seconds_since(t0)}};
  rec.update(figures);
  runtime_.metrics().write(rec);
  s.progress().end();
  out << kind() << ": held-out, " << when << " training (" << eval_.size()
      << " examples): " << eval_line(figures) << std::endl;
}

void OfflineJob::run(Scheduler& s, std::ostream& out) {
  report::MetricsSink& metrics = runtime_.open_metrics();
  group_size_ = s.group(trained_).size();
  accum_ = std::max<int64_t>(1, batch_size_ / (micro_ * group_size_));
  eval_.resize(eval_.size() - eval_.size() % static_cast<size_t>(group_size_));
  runtime_.say(out) << train_.size() << " training and " << eval_.size() << " held-out examples ("
                    << truncated_ << " truncated to data.max_len, " << skipped_lines_
                    << " bad lines skipped); " << total_steps_ << " steps of " << batch_size_
                    << " over " << epochs_ << " epoch(s); metrics: " << metrics.path() << std::endl;
  s.progress().begin("loading models");
  runtime_.start_roles(
      s,
      [&](RoleGroup& g) { return runtime_.init_role(s, g, settings_.roles, batch_size_, micro_); },
      out);
  int64_t step = 0;
  if (options_.resume) step = runtime_.resume(s, {trained_}, out).step;
  prepare(s, out);
  if (!eval_.empty() && step == 0) write_eval(s, "before", 0, out);
  const int64_t eval_steps = settings_.eval_steps;
  const runtime::StepClock clock(step + 1, total_steps_);
  for (++step; step <= total_steps_; ++step) {
    s.progress().begin("step " + std::to_string(step) + "/" + std::to_string(total_steps_) +
                       ": training, epoch " + std::to_string((step - 1) / steps_per_epoch_ + 1) +
                       "/" + std::to_string(epochs_));
    json rec = train_step(s, step);
    s.progress().end();
    if (runtime_.logs_at(step, total_steps_)) {
      rec["memory"] = runtime_.memory(s);
      metrics.write(rec);
      out << "step " << step << "/" << total_steps_ << " | epoch " << rec["epoch"] << " | "
          << step_line(rec) << " | " << runtime::fixed(rec["time_s"].get<double>(), 2) << " s | "
          << runtime::fixed(rec["tokens_per_s"].get<double>(), 0) << " tok/s | "
          << clock.after(step) << std::endl;
    }
    // Every eval.steps (the last step's is the "after" evaluation).
    if (!eval_.empty() && eval_steps > 0 && step % eval_steps == 0 && step < total_steps_)
      write_eval(s, "during", step, out);
    if (runtime_.saves_at(step, total_steps_))
      runtime_.save(s, step, {trained_}, {{"kind", kind()}}, out);
  }
  if (!eval_.empty()) write_eval(s, "after", total_steps_, out);
  if (runtime_.settings().export_hf) runtime_.export_model(s, trained_, model_dir_, out);
  runtime_.say(out) << "done; metrics in " << metrics.path() << std::endl;
}

}  // namespace rlhf::dpo
