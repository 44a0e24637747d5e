// The reference model's per-row log-probs of an offline dataset, cached in the run
// directory so a DPO job asks the reference group once per pair: <dir>/<key>.safetensors
// (tensor "log_probs" [N]) and <dir>/index.json (key -> file, rows, what it was made from).
// The key hashes the exact token rows and the reference model's identity, so a changed
// dataset, truncation, tokenizer or reference model never reads a stale cache. Computing
// the log-probs is the driver's business; this only names, stores and finds them.
#pragma once

#include <torch/types.h>

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "dpo/offline_batch.h"

namespace rlhf::dpo {

// Hex FNV-1a 64 over the rows' sequences, attention and loss masks (bytes and shapes), in
// the order they are added, and the reference model's identity (see model_identity()).
// Rows may come in chunks, so a large dataset is never padded and held whole.
class RowsKey {
 public:
  RowsKey();
  void add(const RowTensors& rows);
  std::string hex(const std::string& model_identity) const;

 private:
  uint64_t hash_;
};

// RowsKey of one block of rows.
std::string rows_key(const RowTensors& rows, const std::string& model_identity);

// The model directory, its weight files' sizes and modification times, and the dtype: a
// retrained or replaced model at the same path is a different model.
std::string model_identity(const std::string& model_dir, const std::string& dtype);

class RefLogProbCache {
 public:
  explicit RefLogProbCache(std::string dir) : dir_(std::move(dir)) {}

  // The cached log-probs [rows] for `key`, or nullopt when absent or unreadable/mismatched
  // (a damaged cache is recomputed, not fatal).
  std::optional<torch::Tensor> find(const std::string& key, int64_t rows) const;
  // Writes the file (temporary name, then rename), then the index entry. Returns the path.
  // Throws RuntimeError on I/O failure.
  std::string store(const std::string& key, const torch::Tensor& log_probs,
                    const nlohmann::json& info);
  std::string file(const std::string& key) const;

 private:
  std::string dir_;
};

}  // namespace rlhf::dpo
