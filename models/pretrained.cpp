// load_pretrained / save_pretrained; see pretrained.h.
#include "models/pretrained.h"

#include <filesystem>
#include <fstream>
#include <map>
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

namespace {

// What keeps `checkpoint` from filling parameters `shapes`: "; missing tensors: ...;
// unexpected tensors: ...; wrong shapes: ..." ("" when it fits). Names in allowed_missing
// may be absent; ignored names, old RoPE buffers and a tied model's lm_head may be extra.
std::string mismatches(const CausalLM::ShapeList& shapes, const CheckpointReader& checkpoint,
                       bool tied, const std::vector<std::string>& allowed_missing,
                       const std::vector<std::string>& ignored) {
  auto listed = [](const std::vector<std::string>& names, const std::string& name) {
    return std::find(names.begin(), names.end(), name) != names.end();
  };
  std::set<std::string> expected;
  std::vector<std::string> missing, wrong_shape;
  for (const auto& [name, shape] : shapes) {
    expected.insert(name);
    if (!checkpoint.contains(name)) {
      if (!listed(allowed_missing, name)) missing.push_back(name);
      continue;
    }
    const TensorInfo& info = checkpoint.info(name);
    if (info.shape != shape)
      wrong_shape.push_back(name + " " + shape_text(info.shape) + " in " +
                            fs::path(checkpoint.file_of(name)).filename().string() +
                            ", model expects " + shape_text(shape));
  }
  std::vector<std::string> unexpected;
  for (const auto& name : checkpoint.names()) {
    if (expected.count(name)) continue;
    if (name.find("rotary_emb.inv_freq") != std::string::npos) continue;  // old HF buffers
    if (name == "lm_head.weight" && tied) continue;
    if (listed(ignored, name)) continue;
    unexpected.push_back(name);
  }
  std::string problems;
  if (!missing.empty()) problems += "; missing tensors: " + list_names(missing);
  if (!unexpected.empty()) problems += "; unexpected tensors: " + list_names(unexpected);
  if (!wrong_shape.empty()) problems += "; wrong shapes: " + list_names(wrong_shape);
  return problems;
}

}  // namespace

void load_weights(CausalLM& model, const CheckpointReader& checkpoint,
                  const std::vector<std::string>& allowed_missing,
                  const std::vector<std::string>& ignored) {
  torch::NoGradGuard no_grad;
  const std::string problems =
      mismatches(model.parameter_shapes(), checkpoint, model.config().tie_word_embeddings,
                 allowed_missing, ignored);
  if (!problems.empty()) throw InputError("checkpoint does not match the model config" + problems);
  for (auto& [name, param] : model.state_tensors())
    if (checkpoint.contains(name)) param.copy_(checkpoint.view(name));  // converts dtype, device
}

PretrainedSource::PretrainedSource(const std::string& dir, const LoadOptions& options)
    : dir_(dir), config_(ModelConfig::from_json_file((fs::path(dir) / "config.json").string())) {
  const HeadKind stored_head = config_.head;
  if (options.head) config_.head = *options.head;
  if (!options.value_head_prefix.empty()) config_.value_head_prefix = options.value_head_prefix;
  config_.validate(dir + "/config.json");
  dtype_ = options.dtype ? *options.dtype : dtype_from_name(config_.torch_dtype);
  checkpoint_ = std::make_unique<CheckpointReader>(dir);
  std::vector<std::string> fresh, ignored;
  if (config_.head == HeadKind::kValue && stored_head != HeadKind::kValue) {
    fresh_value_head_ = config_.value_head_prefix + ".weight";
    fresh.push_back(fresh_value_head_);
    ignored.push_back("lm_head.weight");
  }
  const std::string problems = mismatches(parameter_shapes(config_), *checkpoint_,
                                          config_.tie_word_embeddings, fresh, ignored);
  if (!problems.empty())
    throw InputError(dir + ": checkpoint does not match the model config" + problems);
}

PretrainedSource::~PretrainedSource() = default;

torch::Tensor PretrainedSource::read(const std::string& name, int64_t begin, int64_t count,
                                     torch::Dtype dtype, torch::Device device) const {
  torch::Tensor flat = name == fresh_value_head_ && !checkpoint_->contains(name)
                           ? value_head_init(config_).reshape({-1})
                           : checkpoint_->view(name).reshape({-1});  // the mapping, no copy
  TORCH_CHECK(begin >= 0 && count >= 0 && begin + count <= flat.numel(), dir_, ": ", name, " has ",
              flat.numel(), " elements; asked for [", begin, ", ", begin + count, ")");
  // A copy even when dtype and device match: the result must not pin the mapping.
  return flat.narrow(0, begin, count).to(device, dtype, /*non_blocking=*/false, /*copy=*/true);
}

void load_whole(CausalLM& model, const WeightSource& source, torch::Dtype dtype,
                torch::Device device) {
  torch::NoGradGuard no_grad;
  TORCH_CHECK(!model.fused_projections(),
              "load_whole: the model's projections are fused; load first, then fuse_projections");
  std::map<std::string, torch::Tensor> params;
  for (auto& [name, param] : model.state_tensors()) params[name] = param;
  const TensorParallel& tp = model.tensor_parallel();
  for (const auto& [name, shape] : model.parameter_shapes()) {
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    const int dim = tp.enabled() ? tensor_parallel_dim(name) : -1;
    torch::Tensor value;
    if (dim < 0) {
      value = source.read(name, 0, numel, dtype, device).view(shape);
    } else if (dim == 0) {  // rank r's rows are one flat range
      const int64_t count = numel / tp.size;
      value = source.read(name, tp.rank * count, count, dtype, device)
                  .view(tensor_parallel_shape(name, shape, tp.size));
    } else {
      auto whole = source.read(name, 0, numel, dtype, torch::kCPU).view(shape);
      value = tensor_parallel_slice(name, whole, tp.rank, tp.size).contiguous().to(device);
    }
    params.at(name).set_data(value);
  }
}

TensorsSource::TensorsSource(std::vector<std::pair<std::string, torch::Tensor>> tensors) {
  for (auto& [name, t] : tensors) tensors_[name] = t.detach();
}

torch::Tensor TensorsSource::read(const std::string& name, int64_t begin, int64_t count,
                                  torch::Dtype dtype, torch::Device device) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) throw InputError("TensorsSource: no tensor named " + name);
  return it->second.reshape({-1}).narrow(0, begin, count).to(device, dtype).clone();
}

std::shared_ptr<CausalLM> load_pretrained(const std::string& dir, const LoadOptions& options,
                                          const TensorParallel& tp) {
  PretrainedSource source(dir, options);
  auto model = std::make_shared<CausalLM>(source.config(), Materialize::kDeferred, tp);
  load_whole(*model, source, source.dtype(), options.device);
  return model;
}

void save_pretrained(CausalLM& model, const std::string& dir, uint64_t max_shard_bytes) {
  TORCH_CHECK(!model.tensor_parallel().enabled(),
              "save_pretrained: a tensor-parallel shard holds slices, not the model");
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

void copy_tokenizer_files(const std::string& from_dir, const std::string& to_dir) {
  for (const char* name :
       {"tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json",
        "generation_config.json", "chat_template.jinja"}) {
    const std::filesystem::path from = std::filesystem::path(from_dir) / name;
    if (std::filesystem::exists(from))
      std::filesystem::copy_file(from, std::filesystem::path(to_dir) / name,
                                 std::filesystem::copy_options::overwrite_existing);
  }
}

}  // namespace rlhf::models
