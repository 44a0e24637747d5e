#include "dpo/ref_cache.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/errors.h"
#include "models/safetensors.h"

namespace rlhf::dpo {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr uint64_t kFnvOffset = 1469598103934665603ull;
constexpr uint64_t kFnvPrime = 1099511628211ull;

void fnv(uint64_t& h, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= kFnvPrime;
  }
}

void fnv_tensor(uint64_t& h, const torch::Tensor& t) {
  torch::Tensor c = t.contiguous();
  for (int64_t d : c.sizes()) fnv(h, &d, sizeof d);
  fnv(h, c.data_ptr(), static_cast<size_t>(c.numel() * c.element_size()));
}

json read_index(const fs::path& path) {
  if (!fs::exists(path)) return json::object();
  json j = json::parse(std::ifstream(path), nullptr, false);
  return j.is_object() ? j : json::object();
}

}  // namespace

RowsKey::RowsKey() : hash_(kFnvOffset) {}

void RowsKey::add(const RowTensors& rows) {
  fnv_tensor(hash_, rows.sequences);
  fnv_tensor(hash_, rows.attention_mask);
  fnv_tensor(hash_, rows.loss_mask);
}

std::string RowsKey::hex(const std::string& model_identity) const {
  uint64_t h = hash_;
  fnv(h, model_identity.data(), model_identity.size());
  std::ostringstream o;
  o << std::hex << h;
  return o.str();
}

std::string rows_key(const RowTensors& rows, const std::string& model_identity) {
  RowsKey key;
  key.add(rows);
  return key.hex(model_identity);
}

std::string model_identity(const std::string& model_dir, const std::string& dtype) {
  std::ostringstream o;
  o << fs::weakly_canonical(model_dir).string() << '|' << dtype;
  std::error_code ec;
  for (const auto& f : fs::directory_iterator(model_dir, ec)) {
    if (f.path().extension() != ".safetensors") continue;
    o << '|' << f.path().filename().string() << ':' << f.file_size(ec) << ':'
      << f.last_write_time(ec).time_since_epoch().count();
  }
  return o.str();
}

std::string RefLogProbCache::file(const std::string& key) const {
  return (fs::path(dir_) / (key + ".safetensors")).string();
}

std::optional<torch::Tensor> RefLogProbCache::find(const std::string& key, int64_t rows) const {
  json index = read_index(fs::path(dir_) / "index.json");
  if (!index.contains(key) || !fs::exists(file(key))) return std::nullopt;
  try {
    models::SafetensorsFile f(file(key));
    torch::Tensor t = f.view("log_probs");
    if (t.dim() != 1 || t.size(0) != rows || t.scalar_type() != torch::kFloat32)
      return std::nullopt;
    return t.clone();
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

std::string RefLogProbCache::store(const std::string& key, const torch::Tensor& log_probs,
                                   const json& info) {
  TORCH_CHECK(log_probs.dim() == 1, "RefLogProbCache::store: expected log_probs [N], got ",
              log_probs.sizes());
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec)
    throw RuntimeError(dir_ + ": cannot create the reference log-prob cache: " + ec.message());
  models::save_safetensors(file(key), {{"log_probs", log_probs.to(torch::kFloat32).contiguous()}});
  const fs::path index_path = fs::path(dir_) / "index.json";
  json index = read_index(index_path);
  json entry = info;
  entry["file"] = fs::path(file(key)).filename().string();
  entry["rows"] = log_probs.size(0);
  index[key] = entry;
  const fs::path tmp = index_path.string() + ".tmp";
  {
    std::ofstream out(tmp);
    out << index.dump(2) << '\n';
    if (!out) throw RuntimeError(tmp.string() + ": cannot write the cache index");
  }
  fs::rename(tmp, index_path, ec);
  if (ec)
    throw RuntimeError(index_path.string() + ": cannot write the cache index: " + ec.message());
  return file(key);
}

}  // namespace rlhf::dpo
