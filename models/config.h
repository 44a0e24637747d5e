// The model configuration read from (and written to) an HF config.json for the Llama family
// (llama, mistral, qwen2, dense qwen3), and the built-in presets `rlhf init-model` writes.
// Anything the model cannot honour (architecture, activation, RoPE scaling type, sliding
// windows per layer, mixture-of-experts, ...) is an InputError naming it, never a silently
// different model.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace rlhf::models {

// Which head sits on the final norm.
enum class HeadKind {
  kLanguageModel,  // lm_head: [V, H] (actor, reference); tied to embeddings when asked
  kValue,          // <value_head_prefix>.weight: [1, H] (critic, reward)
};

enum class RopeScalingType { kNone, kLinear, kLlama3 };

struct RopeScaling {
  RopeScalingType type = RopeScalingType::kNone;
  double factor = 1.0;
  double low_freq_factor = 1.0;                     // llama3
  double high_freq_factor = 4.0;                    // llama3
  int64_t original_max_position_embeddings = 8192;  // llama3
};

// A mixture-of-experts model's own fields (qwen3_moe, qwen2_moe, mixtral), as transformers
// names them; what each layer is made of follows from them in its family's file
// (MoeSpec, layer_spec.h). num_experts 0: a dense model.
struct MoeConfig {
  int64_t num_experts = 0;            // Qwen's num_experts, Mixtral's num_local_experts
  int64_t num_experts_per_tok = 0;    // top-k
  int64_t moe_intermediate_size = 0;  // each expert's (Mixtral: intermediate_size)
  bool norm_topk_prob = false;        // renormalise the top-k weights (Mixtral: always)
  // Qwen: layer i is sparse when (i + 1) % decoder_sparse_step == 0 and i is not in
  // mlp_only_layers; the other layers have a dense MLP of intermediate_size.
  int64_t decoder_sparse_step = 1;
  std::vector<int64_t> mlp_only_layers;
  int64_t shared_expert_intermediate_size = 0;  // qwen2_moe's shared expert
  double router_aux_loss_coef = 0.001;          // the load-balancing loss's coefficient
};

struct ModelConfig {
  // llama | mistral | qwen2 | qwen3 | gemma3_text | qwen3_moe | qwen2_moe | mixtral
  std::string model_type = "llama";
  std::vector<std::string> architectures = {"LlamaForCausalLM"};
  int64_t hidden_size = 64;
  int64_t intermediate_size = 176;
  int64_t num_hidden_layers = 2;
  int64_t num_attention_heads = 4;
  int64_t num_key_value_heads = 2;  // < num_attention_heads: grouped-query attention
  int64_t head_dim = 16;            // hidden_size / num_attention_heads unless given
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  int64_t max_position_embeddings = 2048;
  int64_t vocab_size = 288;
  bool tie_word_embeddings = false;
  bool qkv_bias = false;     // attention_bias (llama, qwen3), always on for qwen2
  bool o_proj_bias = false;  // attention_bias (llama, qwen3); never for qwen2
  bool mlp_bias = false;
  bool qk_norm = false;        // qwen3 only: RMSNorm [head_dim] on each head's q and k before RoPE
  int64_t sliding_window = 0;  // 0: full attention (mistral may set a window)
  // Layers of two kinds (gemma3_text): transformers' layer_types, one "sliding_attention" or
  // "full_attention" per layer; the sliding layers attend within local_window keys with RoPE
  // base rope_local_theta (LayerSpec::local_attention). Empty: every layer alike.
  std::vector<std::string> layer_types;
  int64_t local_window = 0;
  double rope_local_theta = 10000.0;
  double query_pre_attn_scalar = 0;  // gemma3_text: q.k scaled by its -0.5 power (0: head_dim)
  double initializer_range = 0.02;
  std::string torch_dtype = "bfloat16";
  int64_t bos_token_id = -1;  // -1: absent
  int64_t eos_token_id = -1;
  int64_t pad_token_id = -1;
  MoeConfig moe;  // num_experts 0: dense
  HeadKind head = HeadKind::kLanguageModel;
  std::string value_head_prefix = "score";  // OpenRLHF's value_head_prefix

  // Parses an HF config.json object (text). `source` names it in errors.
  static ModelConfig from_json_text(const std::string& text, const std::string& source);
  // Reads DIR/config.json or a path to a config file. Throws InputError.
  static ModelConfig from_json_file(const std::string& path);

  // HF-shaped config.json text; keys of the file this config was read from that the model
  // does not use are kept as they were.
  std::string to_json_text() const;

  // Throws InputError when fields are inconsistent (heads not dividing, ...).
  void validate(const std::string& source) const;

  int64_t num_parameters() const;  // exact count, heads included (models/param_layout.h)

  std::string original_json;  // the parsed file, for round trips ("" when built in code)
};

// Built-in presets for init-model: "tiny" (tests), "small", "100m" (benchmarks).
std::vector<std::string> preset_names();
ModelConfig preset_config(const std::string& name);  // throws InputError listing presets

// Well-known architectures, as their HF config.json files give them, so a job can be sized
// (rlhf plan, rlhf validate) before any weights are downloaded: "llama-3-8b", "llama-3-70b",
// "qwen2.5-7b", "qwen2.5-32b", "mistral-7b" (v0.3), "gemma-3-1b". Shapes only: they have no
// weights.
std::vector<std::string> architecture_names();
ModelConfig architecture_config(const std::string& name);  // InputError listing the names

// A role's `model` value as the planner reads it: "preset:NAME" (an architecture above),
// a config.json file, or a model directory holding one. Throws InputError naming `ref`.
ModelConfig model_config_of(const std::string& ref);
inline constexpr const char* kArchitecturePrefix = "preset:";

}  // namespace rlhf::models
