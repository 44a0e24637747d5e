// HF model directories <-> CausalLM: config.json plus safetensors (single or sharded).
// Loading checks every tensor (missing, unexpected, wrong shape: one error listing them
// all) and converts dtypes one tensor (or one slice) at a time straight from the memory
// mapping: no FP32 copy of the whole model and no random init on the way. Tokenizer files
// are not read here (tokenizer/ does that).
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "models/causal_lm.h"
#include "models/config.h"
#include "models/safetensors.h"

namespace rlhf::models {

// "bfloat16"/"bf16", "float32"/"fp32", "float16"/"fp16" -> dtype; InputError otherwise.
torch::Dtype dtype_from_name(const std::string& name);
std::string dtype_hf_name(torch::Dtype dtype);  // "bfloat16", "float32", "float16"

struct LoadOptions {
  std::optional<torch::Dtype> dtype;  // default: config.json's torch_dtype
  torch::Device device = torch::kCPU;
  // Force a head (e.g. a critic from an actor checkpoint). A value head absent from the
  // checkpoint is then freshly initialised (OpenRLHF's critic init) and lm_head.weight
  // is ignored; otherwise the head must be in the checkpoint.
  std::optional<HeadKind> head;
  std::string value_head_prefix;  // "" keeps the config's (default "score")
};

// A checkpoint directory as a WeightSource: config.json (with LoadOptions' head applied)
// and the memory-mapped safetensors, checked on construction against every parameter the
// model will have (missing, unexpected, wrong shape: one InputError naming DIR and listing
// them all). read() copies and converts only the requested slice; a value head absent from
// an LM checkpoint (a critic started from an actor) reads as value_head_init.
class PretrainedSource final : public WeightSource {
 public:
  PretrainedSource(const std::string& dir, const LoadOptions& options = {});
  ~PretrainedSource() override;

  const ModelConfig& config() const { return config_; }
  const std::string& dir() const { return dir_; }
  torch::Dtype dtype() const { return dtype_; }  // LoadOptions' dtype, else config.json's
  torch::Tensor read(const std::string& name, int64_t begin, int64_t count, torch::Dtype dtype,
                     torch::Device device) const override;

 private:
  std::string dir_;
  ModelConfig config_;
  torch::Dtype dtype_;
  std::unique_ptr<CheckpointReader> checkpoint_;
  std::string fresh_value_head_;  // the value head's name when it is initialised, not read
};

// Tensors in memory, by HF name, as a WeightSource (a preset's fresh weights, to be loaded
// into a tensor-parallel shard).
class TensorsSource final : public WeightSource {
 public:
  explicit TensorsSource(std::vector<std::pair<std::string, torch::Tensor>> tensors);
  torch::Tensor read(const std::string& name, int64_t begin, int64_t count, torch::Dtype dtype,
                     torch::Device device) const override;

 private:
  std::map<std::string, torch::Tensor> tensors_;
};

// Reads DIR/config.json and DIR's safetensors into a whole model in options.dtype on
// options.device; peak memory is the model plus one tensor. Throws InputError naming the
// file and the offending tensors.
std::shared_ptr<CausalLM> load_pretrained(const std::string& dir, const LoadOptions& options = {},
                                          const TensorParallel& tp = {});

// Sets every parameter of a deferred (or allocated) `model` whole from `source`, in `dtype`
// on `device`, one tensor at a time. A tensor-parallel shard (CausalLM's `tp`) gets its
// slices only: a row-split tensor reads just its rows; a column-split one is read whole
// (one tensor on the host) and sliced.
void load_whole(CausalLM& model, const WeightSource& source, torch::Dtype dtype,
                torch::Device device);

// Copies a checkpoint's tensors into `model` (converting dtype). Every parameter must be
// present with its shape; unexpected tensors are an error, except `lm_head.weight` of a
// tied model, RoPE inv_freq buffers, and the names in `allowed_missing`.
void load_weights(CausalLM& model, const CheckpointReader& checkpoint,
                  const std::vector<std::string>& allowed_missing = {},
                  const std::vector<std::string>& ignored = {});

// Writes DIR/config.json (torch_dtype = the parameters' dtype) and the weights
// (model.safetensors, or shards + index above max_shard_bytes). Creates DIR.
void save_pretrained(CausalLM& model, const std::string& dir,
                     uint64_t max_shard_bytes = 4ull << 30);

// An export is a complete model directory: copies the tokenizer and chat-template files
// (tokenizer.json, tokenizer.model, tokenizer_config.json, special_tokens_map.json,
// generation_config.json, chat_template.jinja) that `from_dir` has into `to_dir`.
void copy_tokenizer_files(const std::string& from_dir, const std::string& to_dir);

}  // namespace rlhf::models
