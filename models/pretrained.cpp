// load_pretrained / save_pretrained; see pretrained.h.
#include "models/pretrained.h"

#include <filesystem>
#include <fstream>
#include <set>

#include "core/errors.h"

namespace rlhf::models {

namespace fs = std::filesystem;

namespace {

std::string list_names(const std::vector<std::string>& names) {
  std::string out;
  const size_t shown = std::min<size_t>(names.size(), 8);
  for (size_t i = 0; i < shown; ++i) out += (i ? ", " : "") + names[i];
  if (names.size() > shown) out += ", ... (" + std::to_string(names.size() - shown) + " more)";
  return out;
}

std::string shape_text(c10::IntArrayRef shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

}  // namespace

torch::Dtype dtype_from_name(const std::string& name) {
  if (name == "bfloat16" || name == "bf16") return torch::kBFloat16;
  if (name == "float32" || name == "fp32") return torch::kFloat32;
  if (name == "float16" || name == "fp16") return torch::kFloat16;
  throw InputError("unsupported dtype \"" + name + "\" (supported: bf16, fp32, fp16)");
}

std::string dtype_hf_name(torch::Dtype dtype) {
  if (dtype == torch::kBFloat16) return "bfloat16";
  if (dtype == torch::kFloat32) return "float32";
  if (dtype == torch::kFloat16) return "float16";
  throw InputError(std::string("unsupported model dtype ") + c10::toString(dtype));
}

void load_weights(CausalLM& model, const CheckpointReader& checkpoint,
                  const std::vector<std::string>& allowed_missing,
                  const std::vector<std::string>& ignored) {
  torch::NoGradGuard no_grad;
  std::set<std::string> expected;
  std::vector<std::string> missing, wrong_shape;
  for (auto& [name, param] : model.state_tensors()) {
    expected.insert(name);
    if (!checkpoint.contains(name)) {
      if (std::find(allowed_missing.begin(), allowed_missing.end(), name) == allowed_missing.end())
        missing.push_back(name);
      continue;
    }
    const TensorInfo& info = checkpoint.info(name);
    if (c10::IntArrayRef(info.shape) != param.sizes()) {
      wrong_shape.push_back(name + " " + shape_text(info.shape) + " in " +
                            fs::path(checkpoint.file_of(name)).filename().string() +
                            ", model expects " + shape_text(param.sizes()));
      continue;
    }
    param.copy_(checkpoint.view(name));  // converts dtype and device
  }
  std::vector<std::string> unexpected;
  for (const auto& name : checkpoint.names()) {
    if (expected.count(name)) continue;
    if (name.find("rotary_emb.inv_freq") != std::string::npos) continue;  // old HF buffers
    if (name == "lm_head.weight" && model.config().tie_word_embeddings) continue;
    if (std::find(ignored.begin(), ignored.end(), name) != ignored.end()) continue;
    unexpected.push_back(name);
  }
  std::string problems;
  if (!missing.empty()) problems += "; missing tensors: " + list_names(missing);
  if (!unexpected.empty()) problems += "; unexpected tensors: " + list_names(unexpected);
  if (!wrong_shape.empty()) problems += "; wrong shapes: " + list_names(wrong_shape);
  if (!problems.empty()) throw InputError("checkpoint does not match the model config" + problems);
}

std::shared_ptr<CausalLM> load_pretrained(const std::string& dir, const LoadOptions& options) {
  ModelConfig config = ModelConfig::from_json_file((fs::path(dir) / "config.json").string());
  const HeadKind stored_head = config.head;
  if (options.head) config.head = *options.head;
  if (!options.value_head_prefix.empty()) config.value_head_prefix = options.value_head_prefix;
  config.validate(dir + "/config.json");
  const torch::Dtype dtype = options.dtype ? *options.dtype : dtype_from_name(config.torch_dtype);
  CheckpointReader checkpoint(dir);
  auto model = std::make_shared<CausalLM>(config);
  model->to(dtype);
  std::vector<std::string> allowed_missing, ignored;
  if (config.head == HeadKind::kValue && stored_head != HeadKind::kValue) {
    allowed_missing.push_back(config.value_head_prefix +
                              ".weight");  // initialised by the constructor
    ignored.push_back("lm_head.weight");
  }
  try {
    load_weights(*model, checkpoint, allowed_missing, ignored);
  } catch (const InputError& e) {
    throw InputError(dir + ": " + e.what());
  }
  model->to(options.device);
  return model;
}

void save_pretrained(CausalLM& model, const std::string& dir, uint64_t max_shard_bytes) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw RuntimeError(dir + ": cannot create directory: " + ec.message());
  ModelConfig config = model.config();
  config.torch_dtype = dtype_hf_name(model.dtype());
  save_checkpoint(dir, model.state_tensors(), max_shard_bytes);
  const std::string path = (fs::path(dir) / "config.json").string();
  std::ofstream out(path);
  out << config.to_json_text();
  out.close();
  if (!out) throw RuntimeError(path + ": write failed");
}

}  // namespace rlhf::models
