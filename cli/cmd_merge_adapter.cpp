// `rlhf merge-adapter --model BASE --adapter DIR --out DIR`: a PEFT LoRA adapter merged into
// its base model (W + scale B A, PEFT's merge_and_unload), written as a complete HF model
// directory (config.json, safetensors, the base's tokenizer files) that any HF loader reads.
// Streams the base checkpoint one tensor at a time: the whole model is never in memory.
#include <torch/types.h>

#include <filesystem>
#include <iostream>

#include "cli/args.h"
#include "cli/commands.h"
#include "core/errors.h"
#include "models/lora.h"
#include "models/pretrained.h"

namespace rlhf::cli {

int cmd_merge_adapter(const Argv& argv) {
  namespace fs = std::filesystem;
  const std::vector<OptionSpec> options = {
      {"--model", true, "the base HF model directory the adapter was trained on", "DIR"},
      {"--adapter", true, "PEFT LoRA adapter directory (adapter_config.json + safetensors)", "DIR"},
      {"--out", true, "the merged model's directory (created)", "DIR"},
      {"--dtype", true, "the merged weights' dtype: fp32, bf16 or fp16 (default: the base's)",
       "DTYPE"},
      {"--help", false, "show this help"}};
  Args args(argv, options);
  if (args.flag("--help")) {
    std::cout << "usage: rlhf merge-adapter --model BASE --adapter DIR --out DIR [--dtype D]\n\n"
                 "Adds scale * B A of every adapted linear map to its base weight (the sum in "
                 "FP32)\nand writes the merged model with the base's tokenizer files.\n\n"
              << format_options(options);
    return 0;
  }
  const auto base = args.model("--model"), adapter = args.model("--adapter"),
             out = args.value("--out");
  if (!base || !adapter || !out)
    throw InputError("merge-adapter needs --model DIR, --adapter DIR and --out DIR (see --help)");
  const models::LoraConfig config = models::read_adapter_config(*adapter);
  const auto tensors = models::read_adapter_tensors(*adapter);
  const torch::Dtype dtype =
      args.value("--dtype")
          ? models::dtype_from_name(*args.value("--dtype"))
          : models::dtype_from_name(
                models::ModelConfig::from_json_file((fs::path(*base) / "config.json").string())
                    .torch_dtype);
  models::write_merged_model(*base, tensors, config, *out, dtype);
  std::cout << "merge-adapter: " << *adapter << " merged into " << *base << " -> " << *out
            << std::endl;
  return 0;
}

}  // namespace rlhf::cli
