// LoRA adapters on a CausalLM and PEFT's adapter files; see lora.h. The formulas follow
// PEFT 0.21's tuners/lora/layer.py (update_layer, reset_lora_parameters, get_delta_weight).
#include "models/lora.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <tuple>

#include "core/errors.h"
#include "core/text.h"
#include "models/pretrained.h"
#include "models/safetensors.h"

namespace rlhf::models {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// PEFT's match of a module name against one target: equal, or ending in ".<target>".
bool matches(const std::string& module, const std::string& target) {
  return target == "all-linear" || module == target || ends_with(module, "." + target);
}

std::string dtype_name_of(torch::Dtype dtype) {
  return dtype == torch::kBFloat16 ? "bfloat16" : dtype == torch::kFloat16 ? "float16" : "float32";
}

std::string shape_text(c10::IntArrayRef shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

// The short name ("q_proj") of a decoder module name.
std::string short_name(const std::string& module) {
  return module.substr(module.rfind('.') + 1);
}

// A fresh adapter for `linear`, whose full weight shape is [out, in] (its tensor may be a
// deferred placeholder), in the base weight's dtype/device; A drawn from `gen`.
std::shared_ptr<LoraAdapter> new_adapter(LinearImpl& linear, int64_t out, int64_t in,
                                         const LoraConfig& config, at::Generator& gen) {
  const int64_t r = config.rank;
  auto a = torch::empty({r, in}, torch::kFloat32);
  if (config.init == LoraInit::kKaimingUniform) {
    // kaiming_uniform_(a=sqrt(5)) on [r, in]: gain sqrt(2 / (1 + 5)), bound gain *
    // sqrt(3 / fan_in) = 1 / sqrt(in) (nn.Linear's default init).
    const double bound = 1.0 / std::sqrt(static_cast<double>(in));
    a.uniform_(-bound, bound, gen);
  } else {
    a.normal_(0.0, 1.0 / static_cast<double>(r), gen);  // PEFT: normal_(std = 1 / r)
  }
  auto adapter = std::make_shared<LoraAdapter>();
  const auto options = linear.weight.options();
  adapter->A = a.to(options).requires_grad_(true);
  adapter->B = torch::zeros({out, r}, options).requires_grad_(true);
  adapter->a_shape = {r, in};
  adapter->b_shape = {out, r};
  adapter->scale = config.scale();
  adapter->dropout = config.dropout;
  return adapter;
}

// The decoder modules `targets` select; every target must select at least one.
std::vector<std::pair<std::string, Linear>> targeted(CausalLM& model,
                                                     const std::vector<std::string>& targets,
                                                     const std::string& what) {
  auto linears = model.decoder_linears();
  for (const auto& target : targets) {
    bool found = false;
    for (const auto& [name, linear] : linears) found = found || matches(name, target);
    if (!found) {
      std::string known;
      for (const auto& name : lora_module_names()) known += (known.empty() ? "" : ", ") + name;
      throw InputError(what + ".target_modules: \"" + target +
                       "\" is not a linear map of this model (known: " + known + ", all-linear)");
    }
  }
  std::vector<std::pair<std::string, Linear>> out;
  for (auto& [name, linear] : linears) {
    for (const auto& target : targets) {
      if (!matches(name, target)) continue;
      out.emplace_back(name, linear);
      break;
    }
  }
  return out;
}

// apply_lora on exactly `modules` (HF module names of the model).
void apply_to(CausalLM& model, const LoraConfig& config,
              std::vector<std::pair<std::string, Linear>> modules, uint64_t seed,
              const std::string& what) {
  if (model.tensor_parallel().enabled())
    throw InputError(what + ": LoRA adapters on a tensor-parallel shard are not supported");
  if (model.has_adapters()) throw InputError(what + ": the model already has LoRA adapters");
  for (auto& p : model.parameters()) p.set_requires_grad(false);
  torch::NoGradGuard no_grad;
  auto gen = at::detail::createCPUGenerator(seed);
  const auto& shapes = model.parameter_shapes();
  const std::map<std::string, std::vector<int64_t>> shape_of(shapes.begin(), shapes.end());
  for (auto& [name, linear] : modules) {
    const auto& shape = shape_of.at(name + ".weight");  // [out, in]
    linear->lora = new_adapter(*linear, shape[0], shape[1], config, gen);
  }
}

// model name "<module>.lora_A.weight" -> (module, true for A); module "" when not an adapter.
std::pair<std::string, bool> adapter_module(const std::string& name) {
  const std::string a = ".lora_A.weight", b = ".lora_B.weight";
  if (ends_with(name, a)) return {name.substr(0, name.size() - a.size()), true};
  if (ends_with(name, b)) return {name.substr(0, name.size() - b.size()), false};
  return {"", false};
}

// Adapters by module: (A [r, in], B [out, r]), each module with both.
std::map<std::string, std::pair<torch::Tensor, torch::Tensor>> by_module(
    const std::vector<std::pair<std::string, torch::Tensor>>& adapters, const std::string& what) {
  std::map<std::string, std::pair<torch::Tensor, torch::Tensor>> out;
  for (const auto& [name, t] : adapters) {
    auto [module, is_a] = adapter_module(name);
    if (module.empty()) throw InputError(what + ": " + name + " is not a lora_A/lora_B weight");
    (is_a ? out[module].first : out[module].second) = t;
  }
  for (const auto& [module, ab] : out)
    if (!ab.first.defined() || !ab.second.defined())
      throw InputError(what + ": " + module + " has only one of lora_A / lora_B");
  if (out.empty()) throw InputError(what + ": holds no lora_A/lora_B tensors");
  return out;
}

// Splits model-named tensors into LoRA pairs (lora_A / lora_B) and saved whole modules
// (PEFT's modules_to_save: "score.weight").
std::pair<std::vector<std::pair<std::string, torch::Tensor>>,
          std::vector<std::pair<std::string, torch::Tensor>>>
split_saved(const std::vector<std::pair<std::string, torch::Tensor>>& tensors) {
  std::vector<std::pair<std::string, torch::Tensor>> lora, saved;
  for (const auto& entry : tensors)
    (adapter_module(entry.first).first.empty() ? saved : lora).push_back(entry);
  return {lora, saved};
}

// The module ("score") of a saved tensor name ("score.weight").
std::string saved_module(const std::string& name) {
  return name.substr(0, name.rfind('.'));
}

// Throws InputError unless A [r, in] and B [out, r] fit a base weight [out, in].
void check_fits(const std::string& what, const std::string& module, const torch::Tensor& a,
                const torch::Tensor& b, c10::IntArrayRef weight, int64_t rank) {
  const std::vector<int64_t> want_a = {rank, weight[1]}, want_b = {weight[0], rank};
  for (const auto& [key, t, want] : {std::tuple{module + ".lora_A.weight", a, want_a},
                                     std::tuple{module + ".lora_B.weight", b, want_b}})
    if (t.sizes() != c10::IntArrayRef(want))
      throw InputError(what + ": " + kPeftKeyPrefix + key + " has shape " + shape_text(t.sizes()) +
                       ", the base model (" + module + ".weight " + shape_text(weight) +
                       ", r = " + std::to_string(rank) + ") needs " + shape_text(want));
}

json read_json_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InputError(path + ": cannot open");
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    throw InputError(path + ": not valid JSON: " + e.what());
  }
}

// Refuses the PEFT options rlhf does not implement, naming the key.
void refuse_unsupported(const json& j, const std::string& path) {
  auto truthy = [&](const char* key) {
    if (!j.contains(key) || j[key].is_null()) return false;
    const json& v = j[key];
    if (v.is_boolean()) return v.get<bool>();
    if (v.is_object() || v.is_array()) return !v.empty();
    return true;
  };
  for (const char* key :
       {"use_dora", "fan_in_fan_out", "lora_bias", "alpha_pattern", "rank_pattern",
        "layers_to_transform", "trainable_token_indices", "target_parameters"})
    if (truthy(key))
      throw InputError(path + ": \"" + key + "\" is set; rlhf's LoRA does not support it");
  if (j.contains("bias") && j["bias"] != "none")
    throw InputError(path + ": \"bias\" must be \"none\", got " + j["bias"].dump());
}

}  // namespace

LoraInit lora_init_from_name(const std::string& name) {
  if (name == "default" || name == "kaiming") return LoraInit::kKaimingUniform;
  if (name == "gaussian") return LoraInit::kGaussian;
  throw InputError("lora init \"" + name + "\": expected \"default\" or \"gaussian\"");
}

std::string lora_init_name(LoraInit init) {
  return init == LoraInit::kGaussian ? "gaussian" : "default";
}

double LoraConfig::scale() const {
  const double r = static_cast<double>(rank);
  return use_rslora ? alpha / std::sqrt(r) : alpha / r;
}

const std::vector<std::string>& lora_module_names() {
  static const std::vector<std::string> names = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                 "gate_proj", "up_proj", "down_proj"};
  return names;
}

void check_lora_config(const LoraConfig& c, const std::string& what) {
  if (c.rank <= 0)
    throw InputError(what + ".rank: must be >= 1 for LoRA adapters, got " + std::to_string(c.rank));
  if (!(c.alpha > 0)) throw InputError(what + ".alpha: must be > 0");
  if (!(c.dropout >= 0 && c.dropout < 1)) throw InputError(what + ".dropout: must be in [0, 1)");
  if (c.target_modules.empty()) throw InputError(what + ".target_modules: must not be empty");
}

void apply_lora(CausalLM& model, const LoraConfig& config, uint64_t seed, const std::string& what) {
  check_lora_config(config, what);
  apply_to(model, config, targeted(model, config.target_modules, what), seed, what);
}

void merge_adapters(CausalLM& model) {
  torch::NoGradGuard no_grad;
  for (auto& [name, linear] : model.decoder_linears()) {
    auto& a = linear->lora;
    if (!a || a->merged) continue;
    TORCH_CHECK(a->enabled, "merge_adapters: adapter of ", name, " is disabled");
    // get_delta_weight: B @ A * scaling, added to the base weight.
    auto delta = torch::matmul(a->B.to(torch::kFloat32), a->A.to(torch::kFloat32)) * a->scale;
    linear->weight.copy_(linear->weight.to(torch::kFloat32) + delta.to(linear->weight.device()));
    a->merged = true;
  }
}

void unmerge_adapters(CausalLM& model) {
  torch::NoGradGuard no_grad;
  for (auto& [name, linear] : model.decoder_linears()) {
    auto& a = linear->lora;
    if (!a || !a->merged) continue;
    auto delta = torch::matmul(a->B.to(torch::kFloat32), a->A.to(torch::kFloat32)) * a->scale;
    linear->weight.copy_(linear->weight.to(torch::kFloat32) - delta.to(linear->weight.device()));
    a->merged = false;
  }
}

void remove_adapters(CausalLM& model) {
  for (auto& [name, linear] : model.decoder_linears()) linear->lora.reset();
  for (auto& p : model.parameters()) p.set_requires_grad(true);
}

LoraConfig read_adapter_config(const std::string& dir) {
  const std::string path = (fs::path(dir) / kAdapterConfigName).string();
  const json j = read_json_file(path);
  try {
    if (j.value("peft_type", std::string()) != "LORA")
      throw InputError(path + ": \"peft_type\" must be \"LORA\", got " +
                       (j.contains("peft_type") ? j["peft_type"].dump() : "nothing"));
    refuse_unsupported(j, path);
    LoraConfig c;
    if (!j.contains("r") || !j["r"].is_number_integer())
      throw InputError(path + ": \"r\" must be an integer");
    c.rank = j["r"].get<int64_t>();
    c.alpha = j.value("lora_alpha", 8.0);  // PEFT's default lora_alpha
    c.dropout = j.contains("lora_dropout") && !j["lora_dropout"].is_null()
                    ? j["lora_dropout"].get<double>()
                    : 0.0;
    c.use_rslora = j.value("use_rslora", false);
    const json& init = j.contains("init_lora_weights") ? j["init_lora_weights"] : json(true);
    c.init =
        init.is_string() ? lora_init_from_name(init.get<std::string>()) : LoraInit::kKaimingUniform;
    c.target_modules.clear();
    const json& t = j.contains("target_modules") ? j["target_modules"] : json();
    if (t.is_string()) c.target_modules.push_back(t.get<std::string>());
    if (t.is_array())
      for (const auto& name : t) c.target_modules.push_back(name.get<std::string>());
    if (j.contains("modules_to_save") && j["modules_to_save"].is_array())
      c.modules_to_save = j["modules_to_save"].get<std::vector<std::string>>();
    check_lora_config(c, path + ": lora");
    return c;
  } catch (const json::exception& e) {
    throw InputError(path + ": " + e.what());
  }
}

std::vector<std::pair<std::string, torch::Tensor>> read_adapter_tensors(const std::string& dir) {
  const std::string path = (fs::path(dir) / kAdapterWeightsName).string();
  if (!fs::exists(path)) throw InputError(path + ": not found (PEFT's adapter weights)");
  const std::vector<std::string> saved = read_adapter_config(dir).modules_to_save;
  SafetensorsFile file(path);
  const std::string prefix = kPeftKeyPrefix;
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& info : file.tensors()) {
    const std::string& key = info.name;
    const std::string name = key.substr(std::min(key.size(), prefix.size()));
    const bool whole = adapter_module(key).first.empty() &&
                       std::find(saved.begin(), saved.end(), saved_module(name)) != saved.end();
    if (key.compare(0, prefix.size(), prefix) != 0 || (adapter_module(key).first.empty() && !whole))
      throw InputError(path + ": tensor " + key + " is not a " + prefix +
                       "<module>.lora_A.weight / lora_B.weight (nor a module of "
                       "modules_to_save)");
    out.emplace_back(name, file.view(key).to(torch::kFloat32).clone());
  }
  by_module(split_saved(out).first, path);  // both halves of every pair, at least one pair
  return out;
}

namespace {

// Throws InputError unless every saved module of an adapter file names a parameter of the
// base whose shape it has (a value head: "score.weight" [1, H]).
void check_saved_modules(const std::vector<std::pair<std::string, torch::Tensor>>& saved,
                         const std::map<std::string, std::vector<int64_t>>& shape_of,
                         const std::string& path) {
  for (const auto& [name, t] : saved) {
    auto it = shape_of.find(name);
    if (it == shape_of.end())
      throw InputError(path + ": " + kPeftKeyPrefix + name +
                       " (modules_to_save) is not a parameter of this model: a value head needs "
                       "a value-head role");
    if (t.sizes() != c10::IntArrayRef(it->second))
      throw InputError(path + ": " + kPeftKeyPrefix + name + " has shape " + shape_text(t.sizes()) +
                       ", the base model needs " + shape_text(it->second));
  }
}

}  // namespace

LoraConfig check_adapter(const std::string& dir, const ModelConfig& base) {
  const LoraConfig config = read_adapter_config(dir);
  const std::string path = (fs::path(dir) / kAdapterWeightsName).string();
  const auto shapes = parameter_shapes(base);
  const std::map<std::string, std::vector<int64_t>> shape_of(shapes.begin(), shapes.end());
  const auto& names = lora_module_names();
  const auto [lora, saved] = split_saved(read_adapter_tensors(dir));
  for (const auto& [module, ab] : by_module(lora, path)) {
    auto it = shape_of.find(module + ".weight");
    if (it == shape_of.end() ||
        std::find(names.begin(), names.end(), short_name(module)) == names.end())
      throw InputError(path + ": " + kPeftKeyPrefix + module +
                       ".lora_A.weight is not the adapter of a linear map of this model");
    check_fits(path, module, ab.first, ab.second, it->second, config.rank);
  }
  check_saved_modules(saved, shape_of, path);
  return config;
}

LoraConfig load_adapter(CausalLM& model, const std::string& dir) {
  LoraConfig config = read_adapter_config(dir);
  const std::string path = (fs::path(dir) / kAdapterWeightsName).string();
  const auto [lora, saved] = split_saved(read_adapter_tensors(dir));
  const auto modules = by_module(lora, path);
  auto linears = model.decoder_linears();
  const std::map<std::string, Linear> by_name(linears.begin(), linears.end());
  const auto& shapes = model.parameter_shapes();
  const std::map<std::string, std::vector<int64_t>> shape_of(shapes.begin(), shapes.end());
  check_saved_modules(saved, shape_of, path);
  std::vector<std::pair<std::string, Linear>> targets;
  for (const auto& [module, ab] : modules) {
    if (!by_name.count(module))
      throw InputError(path + ": " + kPeftKeyPrefix + module +
                       ".lora_A.weight is not the adapter of a linear map of this model");
    check_fits(path, module, ab.first, ab.second, shape_of.at(module + ".weight"), config.rank);
    targets.emplace_back(module, by_name.at(module));
  }
  apply_to(model, config, targets, 0, path);
  torch::NoGradGuard no_grad;
  for (auto& [module, linear] : targets) {
    linear->lora->A.copy_(modules.at(module).first);
    linear->lora->B.copy_(modules.at(module).second);
  }
  // A saved value head replaces the base's where the model holds it (a deferred model's
  // trainer reads it through an AdapterSource instead: adapter_saved_modules).
  const auto params = model.named_parameters();
  for (const auto& [name, t] : saved) {
    const torch::Tensor* p = params.find(name);
    if (p && p->numel() == t.numel()) p->copy_(t.reshape(p->sizes()).to(p->options()));
  }
  return config;
}

std::vector<std::pair<std::string, torch::Tensor>> adapter_saved_modules(const std::string& dir) {
  return split_saved(read_adapter_tensors(dir)).second;
}

std::vector<std::pair<std::string, torch::Tensor>> model_adapters(CausalLM& model) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (auto& [name, linear] : model.decoder_linears()) {
    if (!linear->lora) continue;
    out.emplace_back(name + ".lora_A.weight",
                     linear->lora->A.detach().to(torch::kCPU, torch::kFloat32).clone());
    out.emplace_back(name + ".lora_B.weight",
                     linear->lora->B.detach().to(torch::kCPU, torch::kFloat32).clone());
  }
  return out;
}

std::string adapter_config_json(const LoraConfig& c, const std::string& base_model) {
  // The keys PEFT's LoraConfig writes that matter for loading; PEFT fills the rest with its
  // defaults.
  json j = {
      {"peft_type", "LORA"},
      // A value head saved as PEFT saves a sequence classifier's score head.
      {"task_type", c.modules_to_save.empty() ? "CAUSAL_LM" : "SEQ_CLS"},
      {"base_model_name_or_path", base_model},
      {"r", c.rank},
      {"lora_alpha", c.alpha},
      {"lora_dropout", c.dropout},
      {"target_modules", c.target_modules},
      {"use_rslora", c.use_rslora},
      {"init_lora_weights", c.init == LoraInit::kGaussian ? json("gaussian") : json(true)},
      {"bias", "none"},
      {"fan_in_fan_out", false},
      {"use_dora", false},
      {"inference_mode", true},
      {"modules_to_save", c.modules_to_save.empty() ? json(nullptr) : json(c.modules_to_save)},
      {"layers_to_transform", nullptr},
      {"rank_pattern", json::object()},
      {"alpha_pattern", json::object()}};
  return j.dump(2) + "\n";
}

void write_adapter_dir(const std::vector<std::pair<std::string, torch::Tensor>>& adapters,
                       const LoraConfig& config, const std::string& dir,
                       const std::string& base_model, torch::Dtype dtype) {
  const auto [lora, saved] = split_saved(adapters);
  const auto modules = by_module(lora, dir);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw RuntimeError(dir + ": cannot create directory: " + ec.message());
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  std::set<std::string> adapted;  // short names ("q_proj"), matched by PEFT as suffixes
  for (const auto& [module, ab] : modules) {
    tensors.emplace_back(kPeftKeyPrefix + module + ".lora_A.weight",
                         ab.first.to(torch::kCPU, dtype).contiguous());
    tensors.emplace_back(kPeftKeyPrefix + module + ".lora_B.weight",
                         ab.second.to(torch::kCPU, dtype).contiguous());
    adapted.insert(short_name(module));
  }
  LoraConfig written = config;
  written.modules_to_save.clear();
  for (const auto& [name, t] : saved) {  // PEFT's key for a saved module: no wrapper names
    tensors.emplace_back(kPeftKeyPrefix + name, t.to(torch::kCPU, dtype).contiguous());
    written.modules_to_save.push_back(saved_module(name));
  }
  save_safetensors((fs::path(dir) / kAdapterWeightsName).string(), tensors);
  written.target_modules.clear();
  for (const auto& name : lora_module_names())
    if (adapted.count(name)) written.target_modules.push_back(name);
  const std::string path = (fs::path(dir) / kAdapterConfigName).string();
  std::ofstream out(path);
  out << adapter_config_json(written, base_model);
  out.close();
  if (!out) throw RuntimeError(path + ": write failed");
}

void save_adapter(CausalLM& model, const LoraConfig& config, const std::string& dir,
                  const std::string& base_model, torch::Dtype dtype) {
  TORCH_CHECK(model.has_adapters(), "save_adapter: the model has no LoRA adapters");
  write_adapter_dir(model_adapters(model), config, dir, base_model, dtype);
}

void write_merged_model(const std::string& base_dir,
                        const std::vector<std::pair<std::string, torch::Tensor>>& adapters,
                        const LoraConfig& config, const std::string& out_dir, torch::Dtype dtype) {
  const auto [lora, saved_list] = split_saved(adapters);
  const auto modules = by_module(lora, "adapter");
  const std::map<std::string, torch::Tensor> saved(saved_list.begin(), saved_list.end());
  const CheckpointReader base(base_dir);
  for (const auto& [module, ab] : modules) {
    if (!base.contains(module + ".weight"))
      throw InputError(base_dir + ": has no " + module + ".weight for the adapter of " + module);
    check_fits("adapter", module, ab.first, ab.second, base.info(module + ".weight").shape,
               ab.first.size(0));
  }
  json model_config = read_json_file((fs::path(base_dir) / "config.json").string());
  model_config["torch_dtype"] = dtype_name_of(dtype);
  if (model_config.contains("dtype")) model_config["dtype"] = dtype_name_of(dtype);
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) throw RuntimeError(out_dir + ": cannot create directory: " + ec.message());
  // A saved module (a trained value head) replaces the base's tensor, or is added to it.
  std::vector<std::string> names = base.names();
  for (const auto& [name, t] : saved)
    if (!base.contains(name)) names.push_back(name);
  std::vector<TensorInfo> layout;
  for (const auto& name : names) {
    const auto it = saved.find(name);
    const std::vector<int64_t> shape =
        it != saved.end() ? it->second.sizes().vec() : base.info(name).shape;
    layout.push_back({name, dtype, shape, 0, 0});
  }
  SafetensorsWriter writer((fs::path(out_dir) / kSingleFileName).string(), layout);
  const double scale = config.scale();
  torch::NoGradGuard no_grad;
  for (const auto& name : names) {
    if (auto it = saved.find(name); it != saved.end()) {
      writer.write(name, it->second.to(dtype).contiguous());
      continue;
    }
    auto tensor = base.view(name).to(torch::kFloat32);
    const std::string module = ends_with(name, ".weight") ? name.substr(0, name.size() - 7) : "";
    auto it = modules.find(module);
    if (it != modules.end())  // PEFT's merge: W + (B @ A) * scaling
      tensor = tensor + torch::matmul(it->second.second, it->second.first) * scale;
    writer.write(name, tensor.to(dtype).contiguous());
  }
  writer.finish();
  std::ofstream out((fs::path(out_dir) / "config.json").string());
  out << model_config.dump(2) << "\n";
  out.close();
  if (!out) throw RuntimeError(out_dir + "/config.json: write failed");
  copy_tokenizer_files(base_dir, out_dir);
}

AdapterSource::AdapterSource(const WeightSource& base,
                             std::vector<std::pair<std::string, torch::Tensor>> adapters)
    : base_(base) {
  for (auto& [name, t] : adapters) adapters_[name] = t.detach();
}

torch::Tensor AdapterSource::read(const std::string& name, int64_t begin, int64_t count,
                                  torch::Dtype dtype, torch::Device device) const {
  auto it = adapters_.find(name);
  if (it == adapters_.end()) return base_.read(name, begin, count, dtype, device);
  return it->second.reshape({-1}).narrow(0, begin, count).to(device, dtype).clone();
}

}  // namespace rlhf::models
