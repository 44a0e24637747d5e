// `rlhf init-model --preset NAME --out DIR`: a randomly initialised model in HF format
// (config.json, model.safetensors, tokenizer_config.json of the byte tokenizer).
#include <filesystem>
#include <fstream>
#include <iostream>

#include "cli/args.h"
#include "cli/commands.h"
#include "core/errors.h"
#include "core/text.h"
#include "models/causal_lm.h"
#include "models/config.h"
#include "models/pretrained.h"

namespace rlhf::cli {
namespace {

// The byte tokenizer's config (fixed format shared with tokenizer/; see its docs).
const char* const kByteTokenizerConfig =
    "{\n"
    "  \"tokenizer_class\": \"RlhfByteTokenizer\",\n"
    "  \"bos_token\": \"<s>\",\n"
    "  \"eos_token\": \"</s>\",\n"
    "  \"pad_token\": \"<pad>\",\n"
    "  \"add_bos_token\": true\n"
    "}\n";

}  // namespace

int cmd_init_model(const Argv& argv) {
  const std::vector<OptionSpec> options = {
      {"--preset", true, "model size: " + join(models::preset_names(), ", "), "NAME"},
      {"--out", true, "directory to write (created; must not hold a config.json unless --force)",
       "DIR"},
      {"--value-head", false, "a scalar value head (critic, reward) instead of the LM head"},
      {"--value-head-prefix", true, "value head weight name prefix (default score)", "NAME"},
      {"--seed", true, "initialisation seed (default 0)", "S"},
      {"--dtype", true, "bf16 (default) or fp32 weights", "DTYPE"},
      {"--force", false, "overwrite an existing model in DIR"},
      {"--help", false, "show this help"}};
  Args args(argv, options);
  if (args.flag("--help")) {
    std::cout
        << "usage: rlhf init-model --preset NAME --out DIR [--value-head] [--seed S] [--dtype "
           "bf16|fp32]\n\n"
           "Writes a randomly initialised Llama-style model in Hugging Face format: config.json,\n"
           "model.safetensors and the byte tokenizer's tokenizer_config.json. Presets:\n"
           "  tiny      2 layers, hidden 64, 4 heads (2 kv), vocab 288: tests\n"
           "  tiny-moe  tiny as a Qwen3-MoE: 8 experts of 88 rows, top-2 (examples/grpo_moe_tiny)\n"
           "  small     4 layers, hidden 256, 8 heads (4 kv), vocab 288\n"
           "  100m      12 layers, hidden 768, 12 heads (4 kv), vocab 32000, tied: benchmarks\n\n"
        << format_options(options);
    return 0;
  }
  const auto preset = args.value("--preset");
  const auto out = args.value("--out");
  if (!preset || !out)
    throw InputError("init-model needs --preset NAME and --out DIR (see --help)");
  models::ModelConfig config = models::preset_config(*preset);
  if (args.flag("--value-head")) {
    config.head = models::HeadKind::kValue;
    config.architectures = {"LlamaForSequenceClassification"};
    if (auto prefix = args.value("--value-head-prefix")) config.value_head_prefix = *prefix;
  }
  const torch::Dtype dtype = models::dtype_from_name(args.value("--dtype").value_or("bf16"));
  uint64_t seed = 0;
  if (auto s = args.value("--seed")) {
    try {
      seed = std::stoull(*s);
    } catch (const std::exception&) {
      throw InputError("--seed must be a non-negative integer, got \"" + *s + "\"");
    }
  }
  namespace fs = std::filesystem;
  if (fs::exists(fs::path(*out) / "config.json") && !args.flag("--force"))
    throw InputError(*out + " already holds a model (config.json); pass --force to overwrite");
  config.validate("preset " + *preset);
  models::CausalLM model(config);
  model.init_weights(seed);
  model.to(dtype);
  models::save_pretrained(model, *out);
  const std::string tok_path = (fs::path(*out) / "tokenizer_config.json").string();
  std::ofstream tok(tok_path);
  tok << kByteTokenizerConfig;
  tok.close();
  if (!tok) throw RuntimeError(tok_path + ": write failed");
  std::cout << "wrote " << *out << ": preset " << *preset << ", "
            << (config.head == models::HeadKind::kValue ? "value head" : "LM head") << ", "
            << config.num_parameters() << " parameters, " << models::dtype_hf_name(dtype)
            << ", seed " << seed << '\n';
  return 0;
}

}  // namespace rlhf::cli
