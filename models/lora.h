// LoRA adapters on a CausalLM (Hu et al. 2021; PEFT's LoraModel): which linear maps get
// one, their initialisation, merging into the base weights, and PEFT's adapter directory
// (adapter_config.json + adapter_model.safetensors). Training them is engine/'s business;
// the adapter term itself is in models/linear.h.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "models/causal_lm.h"
#include "models/layer_hooks.h"
#include "models/lora_config.h"

namespace rlhf::models {

// The seven linear-map names of a decoder layer, in HF order.
const std::vector<std::string>& lora_module_names();

// target_modules expanded ("all-linear") and checked: each must name a linear map of the
// decoder ("q_proj", or a longer path ending in it such as "self_attn.q_proj" or
// "model.layers.0.self_attn.q_proj"). Throws InputError naming `what` (a spec key or a
// file) and the offending name; also for rank <= 0, alpha <= 0 or dropout outside [0, 1).
void check_lora_config(const LoraConfig& config, const std::string& what);

// Puts a fresh adapter on every targeted linear of `model` (the decoder's modules whose HF
// name matches a target), A drawn by config.init from a generator seeded with `seed` (the
// same on every rank), B zero; in the model's dtype and device. Freezes every base
// parameter (requires_grad false) and makes A and B trainable. Throws InputError (via
// check_lora_config) or when the model already has adapters or is a tensor-parallel shard.
void apply_lora(CausalLM& model, const LoraConfig& config, uint64_t seed,
                const std::string& what = "lora");

// W += scale * B A on every adapted linear (PEFT's merge); the adapter term is then skipped.
// unmerge_adapters subtracts it again. In FP32, then cast to W's dtype.
void merge_adapters(CausalLM& model);
void unmerge_adapters(CausalLM& model);
// Removes every adapter (after a merge: the plain merged model, for save_pretrained).
void remove_adapters(CausalLM& model);

// PEFT's file names and the key prefix of adapter_model.safetensors.
inline constexpr const char* kAdapterConfigName = "adapter_config.json";
inline constexpr const char* kAdapterWeightsName = "adapter_model.safetensors";
inline constexpr const char* kPeftKeyPrefix = "base_model.model.";

// DIR/adapter_config.json as a LoraConfig. Throws InputError naming the file and key for a
// missing file, a peft_type other than LORA, and PEFT features rlhf does not implement
// (DoRA, fan_in_fan_out, lora bias, bias != "none", alpha_pattern / rank_pattern,
// layers_to_transform). modules_to_save is read into the config (a value head).
LoraConfig read_adapter_config(const std::string& dir);

// Checks DIR's adapter against a base model of `base` (without building it): its config,
// its keys, and every lora_A / lora_B shape against the base's linear maps. Returns the
// adapter's config; throws InputError naming the file, the key and both shapes.
LoraConfig check_adapter(const std::string& dir, const ModelConfig& base);

// DIR's saved whole modules only (modules_to_save: a value head), by model name.
std::vector<std::pair<std::string, torch::Tensor>> adapter_saved_modules(const std::string& dir);

// Puts DIR's adapter on `model` (read_adapter_config, then apply_lora on the modules the
// file holds, then the tensors, converted to the model's dtype; a saved value head replaces
// the model's where its weights are materialized). Every lora_A / lora_B pair
// must belong to a linear map of the model with fitting shapes; errors name the file, the
// key and both shapes. Throws InputError.
LoraConfig load_adapter(CausalLM& model, const std::string& dir);

// adapter_config.json's text for `config` and the adapted modules' short names.
std::string adapter_config_json(const LoraConfig& config, const std::string& base_model);

// Writes DIR/adapter_config.json and DIR/adapter_model.safetensors (tensors in `dtype`)
// as PEFT's save_pretrained does. Creates DIR.
void save_adapter(CausalLM& model, const LoraConfig& config, const std::string& dir,
                  const std::string& base_model, torch::Dtype dtype = torch::kFloat32);

// The adapter of DIR as tensors by model name ("model.layers.0.self_attn.q_proj.lora_A.weight",
// FP32 CPU), and the whole modules its config's modules_to_save names ("score.weight": a
// value head, as PEFT saves a sequence classifier's). Throws InputError naming the file.
std::vector<std::pair<std::string, torch::Tensor>> read_adapter_tensors(const std::string& dir);

// Streams base_dir's checkpoint into out_dir as one model.safetensors in `dtype`, one tensor
// at a time, adding scale * B A (FP32) to each adapted linear's weight: the merged model
// without ever holding the whole model. `adapters` are model-named lora_A/lora_B tensors
// (read_adapter_tensors, or a trainer's); other tensors among them (a trained value head)
// replace the base's tensor of that name or are added. Writes config.json (torch_dtype = dtype) and
// copies the base's tokenizer files. Throws InputError when an adapter does not fit the base.
void write_merged_model(const std::string& base_dir,
                        const std::vector<std::pair<std::string, torch::Tensor>>& adapters,
                        const LoraConfig& config, const std::string& out_dir, torch::Dtype dtype);

// Writes adapter_config.json and adapter_model.safetensors to DIR from model-named adapter
// tensors (a trainer's export): the keys get PEFT's prefix, tensors are written in `dtype`.
// Tensors that are not lora_A / lora_B (a value head, "score.weight") are saved whole as
// PEFT saves modules_to_save: key base_model.model.score.weight, "modules_to_save":
// ["score"], "task_type": "SEQ_CLS" (PeftModelForSequenceClassification loads it).
void write_adapter_dir(const std::vector<std::pair<std::string, torch::Tensor>>& adapters,
                       const LoraConfig& config, const std::string& dir,
                       const std::string& base_model, torch::Dtype dtype);

// A WeightSource for a model with adapters: base parameters from `base`, adapters (by model
// name) from `adapters`. What a sharded trainer reads its shards from.
class AdapterSource final : public WeightSource {
 public:
  AdapterSource(const WeightSource& base,
                std::vector<std::pair<std::string, torch::Tensor>> adapters);
  torch::Tensor read(const std::string& name, int64_t begin, int64_t count, torch::Dtype dtype,
                     torch::Device device) const override;

 private:
  const WeightSource& base_;
  std::map<std::string, torch::Tensor> adapters_;
};

// Switches a model's LoRA adapters off for a scope (when `off`), and back on at its end: the
// base model's forward, a LoRA role's own reference (issue 30.2).
class AdaptersOff {
 public:
  AdaptersOff(CausalLM& model, bool off) : model_(off ? &model : nullptr) {
    if (model_) model_->set_adapters_enabled(false);
  }
  ~AdaptersOff() {
    if (model_) model_->set_adapters_enabled(true);
  }
  AdaptersOff(const AdaptersOff&) = delete;
  AdaptersOff& operator=(const AdaptersOff&) = delete;

 private:
  CausalLM* model_;
};

// The model's adapters by model name (FP32 copies on the CPU), for an AdapterSource.
std::vector<std::pair<std::string, torch::Tensor>> model_adapters(CausalLM& model);

}  // namespace rlhf::models
