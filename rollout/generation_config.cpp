// GenerationConfig from the spec's rollout section and over the wire. See generation_config.h.
#include "rollout/generation_config.h"

#include <map>

#include "core/errors.h"
#include "core/json_fields.h"

namespace rlhf::rollout {
namespace {

using nlohmann::json;

const std::map<DecodeSteps, std::string>& decode_step_names() {
  static const std::map<DecodeSteps, std::string> names = {{DecodeSteps::kAuto, "auto"},
                                                           {DecodeSteps::kEager, "eager"},
                                                           {DecodeSteps::kPadded, "padded"}};
  return names;
}

// rollout.KEY of the resolved section, of the type T asks for.
template <typename T>
T section_value(const json& rollout, const char* key) {
  if (!rollout.is_object() || !rollout.contains(key))
    throw InputError(std::string("rollout.") + key + ": missing from the spec's rollout section");
  try {
    return rollout.at(key).get<T>();
  } catch (const json::exception&) {
    throw InputError(std::string("rollout.") + key + ": unexpected value " +
                     rollout.at(key).dump());
  }
}

}  // namespace

void GenerationConfig::validate() const {
  if (max_new_tokens < 1)
    throw InputError("rollout.max_new_tokens must be >= 1, got " + std::to_string(max_new_tokens));
  if (n_samples_per_prompt < 1)
    throw InputError("rollout.n_samples_per_prompt must be >= 1, got " +
                     std::to_string(n_samples_per_prompt));
  if (micro_batch_size < 1)
    throw InputError("rollout.micro_batch_size must be >= 1, got " +
                     std::to_string(micro_batch_size));
  if (kv_cache_bytes < 0)
    throw InputError("rollout.kv_cache_memory_gb must be >= 0, got " +
                     std::to_string(kv_cache_bytes) + " bytes");
  if (kv_block_size < 1)
    throw InputError("rollout.kv_block_size must be >= 1, got " + std::to_string(kv_block_size));
  if (max_num_seqs < 0 || (max_num_seqs > 0 && max_num_seqs < n_samples_per_prompt))
    throw InputError("rollout.max_num_seqs must be 0 or >= rollout.n_samples_per_prompt (" +
                     std::to_string(n_samples_per_prompt) + "), got " +
                     std::to_string(max_num_seqs));
  if (sync_interval < 0)
    throw InputError("generation: sync_interval must be >= 0, got " +
                     std::to_string(sync_interval));
}

GenerationConfig generation_config_from_rollout_section(const json& rollout) {
  GenerationConfig c;
  c.max_new_tokens = section_value<int64_t>(rollout, "max_new_tokens");
  c.n_samples_per_prompt = section_value<int64_t>(rollout, "n_samples_per_prompt");
  c.micro_batch_size = section_value<int64_t>(rollout, "micro_batch_size");
  c.kv_block_size = section_value<int64_t>(rollout, "kv_block_size");
  c.max_num_seqs = section_value<int64_t>(rollout, "max_num_seqs");
  c.decode_steps =
      section_value<bool>(rollout, "enforce_eager") ? DecodeSteps::kEager : DecodeSteps::kAuto;
  c.gpu_kernels = section_value<bool>(rollout, "gpu_kernels");
  c.stop_token_ids = section_value<std::vector<int64_t>>(rollout, "stop_token_ids");
  if (!rollout.contains("kv_cache_memory_gb"))
    throw InputError("rollout.kv_cache_memory_gb: missing from the spec's rollout section");
  const json& kv = rollout.at("kv_cache_memory_gb");
  if (kv.is_number())
    c.kv_cache_bytes = static_cast<int64_t>(kv.get<double>() * static_cast<double>(1ll << 30));
  return c;
}

SamplingParams sampling_from_rollout_section(const json& rollout) {
  SamplingParams p;
  p.temperature = section_value<double>(rollout, "temperature");
  p.top_p = section_value<double>(rollout, "top_p");
  p.top_k = section_value<int64_t>(rollout, "top_k");
  return p;
}

json to_json(const GenerationConfig& c) {
  return {{"max_new_tokens", c.max_new_tokens},
          {"n_samples_per_prompt", c.n_samples_per_prompt},
          {"micro_batch_size", c.micro_batch_size},
          {"kv_cache_bytes", c.kv_cache_bytes},
          {"kv_block_size", c.kv_block_size},
          {"max_num_seqs", c.max_num_seqs},
          {"decode_steps", decode_step_names().at(c.decode_steps)},
          {"gpu_kernels", c.gpu_kernels},
          {"stop_token_ids", c.stop_token_ids},
          {"pad_token_id", c.pad_token_id},
          {"sync_interval", c.sync_interval}};
}

GenerationConfig generation_config_from_json(const json& j, const std::string& where) {
  GenerationConfig c;
  JsonFields r(j, where);
  r.read("max_new_tokens", c.max_new_tokens);
  r.read("n_samples_per_prompt", c.n_samples_per_prompt);
  r.read("micro_batch_size", c.micro_batch_size);
  r.read("kv_cache_bytes", c.kv_cache_bytes);
  r.read("kv_block_size", c.kv_block_size);
  r.read("max_num_seqs", c.max_num_seqs);
  std::string steps;
  r.read("decode_steps", steps);
  bool known = false;
  for (const auto& [value, name] : decode_step_names())
    if (name == steps) c.decode_steps = value, known = true;
  if (!known)
    throw RuntimeError(where + ": field \"decode_steps\" must be auto, eager or padded, got \"" +
                       steps + "\"");
  r.read("gpu_kernels", c.gpu_kernels);
  r.read("stop_token_ids", c.stop_token_ids);
  r.read("pad_token_id", c.pad_token_id);
  r.read("sync_interval", c.sync_interval);
  r.finish();
  c.validate();
  return c;
}

}  // namespace rlhf::rollout
