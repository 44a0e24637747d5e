// safetensors reading (mmap) and writing; see safetensors.h. Format: 8-byte little-endian
// header length N, N bytes of JSON {name: {dtype, shape, data_offsets}, __metadata__},
// then the data section. Assumes a little-endian host (x86-64, aarch64).
#include "models/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/errors.h"

namespace rlhf::models {

namespace fs = std::filesystem;

namespace {

std::string errno_text() {
  return std::strerror(errno);
}

struct DtypeName {
  torch::Dtype dtype;
  const char* name;
};
constexpr DtypeName kDtypeNames[] = {
    {torch::kFloat32, "F32"}, {torch::kBFloat16, "BF16"}, {torch::kFloat16, "F16"},
    {torch::kFloat64, "F64"}, {torch::kInt64, "I64"},     {torch::kInt32, "I32"},
    {torch::kInt16, "I16"},   {torch::kInt8, "I8"},       {torch::kUInt8, "U8"},
    {torch::kBool, "BOOL"},
};

uint64_t element_size(torch::Dtype dtype) {
  return c10::elementSize(dtype);
}

uint64_t checked_numel(const std::vector<int64_t>& shape, const std::string& what) {
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) throw InputError(what + ": negative dimension in shape");
    n *= static_cast<uint64_t>(d);
  }
  return n;
}

}  // namespace

std::string safetensors_dtype_name(torch::Dtype dtype) {
  for (const auto& d : kDtypeNames)
    if (d.dtype == dtype) return d.name;
  throw InputError(std::string("safetensors: unsupported tensor dtype ") + c10::toString(dtype));
}

torch::Dtype safetensors_dtype(const std::string& name) {
  for (const auto& d : kDtypeNames)
    if (name == d.name) return d.dtype;
  throw InputError("safetensors: unsupported dtype \"" + name + "\"");
}

// An mmap of a whole file; unmapped when the last view is gone.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw InputError(path + ": cannot open: " + errno_text());
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      std::string err = errno_text();
      ::close(fd);
      throw InputError(path + ": cannot stat: " + err);
    }
    size_ = static_cast<uint64_t>(st.st_size);
    if (size_ > 0) {
      void* p = ::mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) {
        std::string err = errno_text();
        ::close(fd);
        throw InputError(path + ": cannot mmap: " + err);
      }
      data_ = static_cast<char*>(p);
    }
    ::close(fd);  // the mapping stays valid
  }
  ~MappedFile() {
    if (data_) ::munmap(data_, size_);
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  char* data() const { return data_; }
  uint64_t size() const { return size_; }

 private:
  char* data_ = nullptr;
  uint64_t size_ = 0;
};

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  map_ = std::make_shared<MappedFile>(path);
  const uint64_t size = map_->size();
  if (size < 8)
    throw InputError(path + ": truncated safetensors file (" + std::to_string(size) + " bytes)");
  uint64_t header_len = 0;
  std::memcpy(&header_len, map_->data(), 8);
  if (header_len > size - 8)
    throw InputError(path + ": truncated or corrupt safetensors file (header of " +
                     std::to_string(header_len) + " bytes, file of " + std::to_string(size) + ")");
  data_offset_ = 8 + header_len;
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(map_->data() + 8, map_->data() + 8 + header_len);
  } catch (const nlohmann::json::exception& e) {
    throw InputError(path + ": corrupt safetensors header: " + e.what());
  }
  if (!header.is_object())
    throw InputError(path + ": corrupt safetensors header: not a JSON object");
  const uint64_t data_size = size - data_offset_;
  for (const auto& [name, entry] : header.items()) {
    const std::string what = path + ": tensor \"" + name + "\"";
    try {
      if (name == "__metadata__") {
        for (const auto& [k, v] : entry.items()) metadata_[k] = v.get<std::string>();
        continue;
      }
      TensorInfo t;
      t.name = name;
      t.dtype = safetensors_dtype(entry.at("dtype").get<std::string>());
      t.shape = entry.at("shape").get<std::vector<int64_t>>();
      auto offsets = entry.at("data_offsets").get<std::vector<uint64_t>>();
      if (offsets.size() != 2) throw InputError(what + ": data_offsets must have 2 entries");
      t.begin = offsets[0];
      t.end = offsets[1];
      if (t.begin > t.end || t.end > data_size)
        throw InputError(what + ": data [" + std::to_string(t.begin) + ", " +
                         std::to_string(t.end) + ") lies outside the file's " +
                         std::to_string(data_size) + " data bytes (truncated?)");
      if (checked_numel(t.shape, what) * element_size(t.dtype) != t.nbytes())
        throw InputError(what + ": " + std::to_string(t.nbytes()) +
                         " bytes do not match its dtype and shape");
      tensors_.push_back(std::move(t));
    } catch (const nlohmann::json::exception& e) {
      throw InputError(what + ": corrupt header entry: " + e.what());
    } catch (const InputError& e) {
      if (std::string(e.what()).rfind(path, 0) == 0) throw;
      throw InputError(what + ": " + e.what());
    }
  }
  std::sort(tensors_.begin(), tensors_.end(),
            [](const TensorInfo& a, const TensorInfo& b) { return a.begin < b.begin; });
  for (size_t i = 0; i < tensors_.size(); ++i) {
    if (i > 0 && tensors_[i].begin < tensors_[i - 1].end && tensors_[i].nbytes() > 0)
      throw InputError(path + ": tensors \"" + tensors_[i - 1].name + "\" and \"" +
                       tensors_[i].name + "\" overlap");
    index_[tensors_[i].name] = i;
  }
}

const TensorInfo& SafetensorsFile::info(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) throw InputError(path_ + ": no tensor named \"" + name + "\"");
  return tensors_[it->second];
}

torch::Tensor SafetensorsFile::view(const std::string& name) const {
  const TensorInfo& t = info(name);
  auto options = torch::TensorOptions().dtype(t.dtype).device(torch::kCPU);
  if (t.nbytes() == 0) return torch::empty(t.shape, options);
  void* ptr = map_->data() + data_offset_ + t.begin;
  auto keep = map_;
  return torch::from_blob(
      ptr, t.shape, [keep](void*) {}, options);
}

// --- writing ---------------------------------------------------------------------------

namespace {

void write_all(int fd, const char* data, uint64_t n, const std::string& path) {
  while (n > 0) {
    ssize_t w = ::write(fd, data, std::min<uint64_t>(n, 1ull << 30));
    if (w < 0) {
      if (errno == EINTR) continue;
      throw RuntimeError(path + ": write failed: " + errno_text());
    }
    data += w;
    n -= static_cast<uint64_t>(w);
  }
}

}  // namespace

SafetensorsWriter::SafetensorsWriter(std::string path, std::vector<TensorInfo> layout,
                                     const std::map<std::string, std::string>& metadata)
    : path_(std::move(path)), layout_(std::move(layout)) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (auto& t : layout_) {
    if (t.name == "__metadata__")
      throw InputError(path_ + ": a tensor may not be named __metadata__");
    if (header.contains(t.name))
      throw InputError(path_ + ": duplicate tensor name \"" + t.name + "\"");
    t.begin = offset;
    t.end = offset + checked_numel(t.shape, t.name) * element_size(t.dtype);
    offset = t.end;
    header[t.name] = {{"dtype", safetensors_dtype_name(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {t.begin, t.end}}};
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // keep the data section 8-byte aligned
  const std::string tmp = path_ + ".tmp";
  fd_ = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw RuntimeError(tmp + ": cannot create: " + errno_text());
  uint64_t len = text.size();
  write_all(fd_, reinterpret_cast<const char*>(&len), 8, tmp);
  write_all(fd_, text.data(), len, tmp);
}

SafetensorsWriter::~SafetensorsWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!finished_) ::unlink((path_ + ".tmp").c_str());  // best effort: nothing to report to
}

void SafetensorsWriter::write(const std::string& name, const torch::Tensor& tensor) {
  if (next_ >= layout_.size())
    throw InputError(path_ + ": tensor \"" + name + "\" written past the end of the layout");
  const TensorInfo& t = layout_[next_];
  TORCH_CHECK(t.name == name, path_, ": expected tensor \"", t.name, "\" next, got \"", name, "\"");
  TORCH_CHECK(tensor.scalar_type() == t.dtype && tensor.sizes().vec() == t.shape, path_,
              ": tensor \"", name, "\" is ", tensor.scalar_type(), tensor.sizes(),
              ", the layout says ", t.dtype, c10::IntArrayRef(t.shape));
  torch::Tensor cpu = tensor.detach().to(torch::kCPU).contiguous();
  write_all(fd_, static_cast<const char*>(cpu.data_ptr()), t.nbytes(), path_ + ".tmp");
  ++next_;
}

void SafetensorsWriter::finish() {
  if (next_ != layout_.size())
    throw InputError(path_ + ": finish() after " + std::to_string(next_) + " of " +
                     std::to_string(layout_.size()) + " tensors");
  const std::string tmp = path_ + ".tmp";
  if (::fsync(fd_) != 0) throw RuntimeError(tmp + ": fsync failed: " + errno_text());
  int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) throw RuntimeError(tmp + ": close failed: " + errno_text());
  if (::rename(tmp.c_str(), path_.c_str()) != 0)
    throw RuntimeError(tmp + ": rename to " + path_ + " failed: " + errno_text());
  finished_ = true;
}

void save_safetensors(const std::string& path, const NamedTensors& tensors) {
  std::vector<TensorInfo> layout;
  for (const auto& [name, t] : tensors) layout.push_back({name, t.scalar_type(), t.sizes().vec()});
  SafetensorsWriter writer(path, std::move(layout));
  for (const auto& [name, t] : tensors) writer.write(name, t);
  writer.finish();
}

std::string shard_file_name(int index, int count) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05d-of-%05d.safetensors", index, count);
  return buf;
}

void write_checkpoint_index(const std::string& dir,
                            const std::map<std::string, std::string>& weight_map,
                            uint64_t total_size) {
  nlohmann::ordered_json index = {{"metadata", {{"total_size", total_size}}},
                                  {"weight_map", weight_map}};
  const std::string path = (fs::path(dir) / kIndexFileName).string();
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << index.dump(2) << '\n';
    if (!out) throw RuntimeError(tmp + ": write failed");
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0)
    throw RuntimeError(tmp + ": rename failed: " + errno_text());
}

void save_checkpoint(const std::string& dir, const NamedTensors& tensors,
                     uint64_t max_shard_bytes) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw RuntimeError(dir + ": cannot create directory: " + ec.message());
  // Greedy split in order; a tensor larger than the limit gets a shard of its own.
  std::vector<NamedTensors> shards(1);
  uint64_t in_shard = 0, total = 0;
  for (const auto& nt : tensors) {
    uint64_t n = nt.second.numel() * nt.second.element_size();
    if (!shards.back().empty() && in_shard + n > max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(nt);
    in_shard += n;
    total += n;
  }
  const fs::path index_path = fs::path(dir) / kIndexFileName;
  if (shards.size() == 1) {
    save_safetensors((fs::path(dir) / kSingleFileName).string(), tensors);
    fs::remove(index_path, ec);  // a stale index would shadow the single file
    return;
  }
  std::map<std::string, std::string> weight_map;
  const int count = static_cast<int>(shards.size());
  for (int i = 0; i < count; ++i) {
    const std::string file = shard_file_name(i + 1, count);
    save_safetensors((fs::path(dir) / file).string(), shards[i]);
    for (const auto& nt : shards[i]) weight_map[nt.first] = file;
  }
  write_checkpoint_index(dir, weight_map, total);
  fs::remove(fs::path(dir) / kSingleFileName, ec);
}

// --- checkpoint directories --------------------------------------------------------------

CheckpointReader::CheckpointReader(const std::string& dir) : dir_(dir) {
  const fs::path index_path = fs::path(dir) / kIndexFileName;
  const fs::path single = fs::path(dir) / kSingleFileName;
  if (fs::exists(index_path)) {
    nlohmann::json index;
    std::ifstream in(index_path);
    if (!in) throw InputError(index_path.string() + ": cannot open");
    try {
      index = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      throw InputError(index_path.string() + ": corrupt index: " + e.what());
    }
    if (!index.contains("weight_map") || !index["weight_map"].is_object())
      throw InputError(index_path.string() + ": missing object \"weight_map\"");
    std::map<std::string, size_t> file_ids;
    for (const auto& [name, file_json] : index["weight_map"].items()) {
      if (!file_json.is_string())
        throw InputError(index_path.string() + ": weight_map[\"" + name + "\"] is not a file name");
      const std::string file = file_json.get<std::string>();
      auto it = file_ids.find(file);
      if (it == file_ids.end()) {
        files_.push_back(std::make_unique<SafetensorsFile>((fs::path(dir) / file).string()));
        it = file_ids.emplace(file, files_.size() - 1).first;
      }
      if (!files_[it->second]->contains(name))
        throw InputError(files_[it->second]->path() + ": tensor \"" + name + "\" listed in " +
                         kIndexFileName + " is not in this file");
      where_[name] = it->second;
    }
  } else if (fs::exists(single)) {
    files_.push_back(std::make_unique<SafetensorsFile>(single.string()));
    for (const auto& t : files_[0]->tensors()) where_[t.name] = 0;
  } else {
    throw InputError(dir + ": no " + kSingleFileName + " or " + kIndexFileName +
                     " (not an HF checkpoint directory)");
  }
}

std::vector<std::string> CheckpointReader::names() const {
  std::vector<std::string> out;
  for (const auto& kv : where_) out.push_back(kv.first);
  return out;
}

const TensorInfo& CheckpointReader::info(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) throw InputError(dir_ + ": checkpoint has no tensor \"" + name + "\"");
  return files_[it->second]->info(name);
}

const std::string& CheckpointReader::file_of(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) throw InputError(dir_ + ": checkpoint has no tensor \"" + name + "\"");
  return files_[it->second]->path();
}

torch::Tensor CheckpointReader::view(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) throw InputError(dir_ + ": checkpoint has no tensor \"" + name + "\"");
  return files_[it->second]->view(name);
}

}  // namespace rlhf::models
