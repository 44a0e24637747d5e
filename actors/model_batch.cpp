#include "actors/model_batch.h"

#include "core/errors.h"

namespace rlhf::model_ops {

Batch read_batch(const Message& req, int64_t action_len, torch::Device device) {
  Batch b;
  b.sequences = req.tensor("sequences").to(device, torch::kLong);
  b.attention_mask = req.tensor("attention_mask").to(device, torch::kLong);
  b.action_len = action_len;
  TORCH_CHECK(b.sequences.dim() == 2 && b.sequences.sizes() == b.attention_mask.sizes(), req.op,
              ": expected sequences and attention_mask [B, T], got ", b.sequences.sizes(), " and ",
              b.attention_mask.sizes());
  TORCH_CHECK(b.action_len >= 1 && b.action_len < b.sequences.size(1), req.op,
              ": action_len must be in [1, T), got ", b.action_len,
              " for T = ", b.sequences.size(1));
  if (req.has_tensor("routes")) {
    b.routes = req.tensor("routes").to(device);
    TORCH_CHECK(b.routes.dim() == 4 && b.routes.size(0) == b.sequences.size(0) &&
                    b.routes.size(1) == b.sequences.size(1),
                req.op, ": expected routes [B, T, sparse layers, top_k] for sequences ",
                b.sequences.sizes(), ", got ", b.routes.sizes());
  }
  return b;
}

torch::Tensor rows(const Message& req, const char* name, int64_t b0, int64_t b1,
                   torch::Device device) {
  return req.tensor(name).slice(0, b0, b1).to(device);
}

Batch slice(const Batch& b, int64_t begin, int64_t end) {
  return {b.sequences.slice(0, begin, end), b.attention_mask.slice(0, begin, end), b.action_len,
          b.routes.defined() ? b.routes.slice(0, begin, end) : torch::Tensor()};
}

double request_temperature(double t, const char* op) {
  if (!(t >= 0.0))
    throw InputError(std::string(op) + ": temperature must be >= 0, got " + std::to_string(t));
  return t == 0.0 ? 1.0 : t;
}
torch::Tensor at_temperature(const torch::Tensor& hidden, double temperature) {
  return temperature == 1.0 ? hidden : hidden / temperature;
}

std::pair<int64_t, int64_t> rank_rows(int64_t rows, const WorkerIdentity& self,
                                      const std::string& op) {
  if (rows % self.world_size != 0)
    throw InputError(op + ": " + std::to_string(rows) + " rows do not split over " +
                     std::to_string(self.world_size) + " ranks");
  int64_t per = rows / self.world_size;
  return {self.rank * per, (self.rank + 1) * per};
}

}  // namespace rlhf::model_ops
