// safetensors files (https://github.com/huggingface/safetensors): memory-mapped reading,
// streaming writing, and HF checkpoint directories (one model.safetensors, or shards listed
// in model.safetensors.index.json). Knows nothing about models: names map to tensors.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace rlhf::models {

// One tensor's entry in a safetensors header.
struct TensorInfo {
  std::string name;
  torch::Dtype dtype = torch::kFloat32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte offsets into the data section (after the header)
  uint64_t end = 0;
  uint64_t nbytes() const { return end - begin; }
};

// "F32", "BF16", ... <-> torch dtypes. Unknown names throw InputError naming them.
std::string safetensors_dtype_name(torch::Dtype dtype);
torch::Dtype safetensors_dtype(const std::string& name);

class MappedFile;

// A safetensors file mapped read-only (copy-on-write private mapping). The header is fully
// validated on open: offsets inside the file, sizes matching dtype x shape, no overlaps.
// Throws InputError naming the file when it is truncated, corrupt or unreadable.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);

  const std::string& path() const { return path_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }  // in file order
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool contains(const std::string& name) const { return index_.count(name) > 0; }
  const TensorInfo& info(const std::string& name) const;  // throws InputError if absent

  // A CPU tensor viewing the mapping (zero copy; keeps the mapping alive). Writes to it go
  // to private pages, never to the file.
  torch::Tensor view(const std::string& name) const;

 private:
  std::string path_;
  std::shared_ptr<MappedFile> map_;
  uint64_t data_offset_ = 0;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// Writes one safetensors file tensor by tensor, so a caller can stream layers without
// holding them all: the layout (names, dtypes, shapes, in order) is fixed up front.
// Data goes to PATH.tmp, renamed to PATH by finish(); destroying an unfinished writer
// removes the temporary file. Throws RuntimeError on I/O failure.
class SafetensorsWriter {
 public:
  SafetensorsWriter(std::string path, std::vector<TensorInfo> layout,
                    const std::map<std::string, std::string>& metadata = {{"format", "pt"}});
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // Writes the next tensor of the layout; its name, dtype and shape must match.
  void write(const std::string& name, const torch::Tensor& tensor);
  void finish();  // all tensors written: flush, fsync, rename

 private:
  std::string path_;
  std::vector<TensorInfo> layout_;
  size_t next_ = 0;
  int fd_ = -1;
  bool finished_ = false;
};

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

// Writes `tensors` (any device/dtype; saved as they are) to one file.
void save_safetensors(const std::string& path, const NamedTensors& tensors);

// The HF checkpoint file names.
inline constexpr const char* kSingleFileName = "model.safetensors";
inline constexpr const char* kIndexFileName = "model.safetensors.index.json";
std::string shard_file_name(int index, int count);  // "model-00001-of-00003.safetensors"

// Writes `tensors` into DIR as model.safetensors, or as shards of at most
// `max_shard_bytes` each plus model.safetensors.index.json when they do not fit in one.
void save_checkpoint(const std::string& dir, const NamedTensors& tensors,
                     uint64_t max_shard_bytes = 4ull << 30);

// Writes model.safetensors.index.json: weight_map name -> shard file, total_size in bytes.
void write_checkpoint_index(const std::string& dir,
                            const std::map<std::string, std::string>& weight_map,
                            uint64_t total_size);

// The tensors of an HF checkpoint directory (single file or sharded). Every shard named
// by the index is opened and checked to hold the tensors the index says it does.
class CheckpointReader {
 public:
  explicit CheckpointReader(const std::string& dir);

  std::vector<std::string> names() const;  // sorted
  bool contains(const std::string& name) const { return where_.count(name) > 0; }
  const TensorInfo& info(const std::string& name) const;
  const std::string& file_of(const std::string& name) const;
  torch::Tensor view(const std::string& name) const;  // zero-copy CPU view

 private:
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, size_t> where_;  // name -> index into files_
};

}  // namespace rlhf::models
