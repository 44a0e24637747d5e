// make_collective_group: picks the backend named in the config.
#include "transport/collective_group.h"

#include <cstdlib>

#include "core/errors.h"
#include "transport/gloo_group.h"
#include "transport/nccl_group.h"
#include "transport/store.h"

namespace rlhf::transport {

namespace {

int64_t bytes_of(const torch::Tensor& t) {
  return t.numel() * static_cast<int64_t>(t.element_size());
}

}  // namespace

CollectiveTraffic CollectiveTraffic::operator-(const CollectiveTraffic& before) const {
  return {all_gather - before.all_gather,
          reduce_scatter - before.reduce_scatter,
          all_reduce - before.all_reduce,
          broadcast - before.broadcast,
          scatter - before.scatter,
          all_to_all - before.all_to_all,
          calls - before.calls};
}

CollectiveTraffic& CollectiveTraffic::operator+=(const CollectiveTraffic& more) {
  all_gather += more.all_gather;
  reduce_scatter += more.reduce_scatter;
  all_reduce += more.all_reduce;
  broadcast += more.broadcast;
  scatter += more.scatter;
  all_to_all += more.all_to_all;
  calls += more.calls;
  return *this;
}

bool CollectiveTraffic::operator==(const CollectiveTraffic& o) const {
  return all_gather == o.all_gather && reduce_scatter == o.reduce_scatter &&
         all_reduce == o.all_reduce && broadcast == o.broadcast && scatter == o.scatter &&
         all_to_all == o.all_to_all && calls == o.calls;
}

int64_t wire_bytes_per_rank(const CollectiveTraffic& t, int ranks, const std::string& backend) {
  if (ranks <= 1) return 0;
  const int64_t n = ranks;
  auto part = [n](int64_t bytes, int64_t times) { return times * bytes * (n - 1) / n; };
  const int64_t gather_scatter = backend == "gloo" ? 2 : 1;  // GlooGroup: ring all-reduces
  return part(t.all_gather, gather_scatter) + part(t.reduce_scatter, gather_scatter) +
         part(t.all_reduce, 2) + t.broadcast + part(t.scatter, 1) + part(t.all_to_all, 1);
}

void CollectiveGroup::all_reduce(torch::Tensor& tensor, ReduceOp op) {
  traffic_.all_reduce += bytes_of(tensor);
  ++traffic_.calls;
  do_all_reduce(tensor, op);
}

void CollectiveGroup::all_gather(torch::Tensor& output, const torch::Tensor& input) {
  traffic_.all_gather += bytes_of(output);
  ++traffic_.calls;
  do_all_gather(output, input);
}

void CollectiveGroup::reduce_scatter(torch::Tensor& output, torch::Tensor& input) {
  traffic_.reduce_scatter += bytes_of(input);
  ++traffic_.calls;
  do_reduce_scatter(output, input);
}

void CollectiveGroup::broadcast(torch::Tensor& tensor, int root) {
  traffic_.broadcast += bytes_of(tensor);
  ++traffic_.calls;
  do_broadcast(tensor, root);
}

void CollectiveGroup::all_to_all(torch::Tensor& output, const torch::Tensor& input,
                                 const std::vector<int64_t>& output_splits,
                                 const std::vector<int64_t>& input_splits) {
  const auto n = static_cast<size_t>(size());
  TORCH_CHECK(output_splits.size() == n && input_splits.size() == n,
              "all_to_all: one split per rank (", n, "), got ", output_splits.size(), " and ",
              input_splits.size());
  int64_t in_rows = 0, out_rows = 0;
  for (size_t k = 0; k < n; ++k) {
    in_rows += input_splits[k];
    out_rows += output_splits[k];
  }
  TORCH_CHECK(input.dim() >= 1 && output.dim() == input.dim() && input.size(0) == in_rows &&
                  output.size(0) == out_rows && output.dtype() == input.dtype(),
              "all_to_all: input ", input.sizes(), " and output ", output.sizes(),
              " must have the splits' rows (", in_rows, ", ", out_rows, ") and one dtype");
  traffic_.all_to_all += bytes_of(input);
  ++traffic_.calls;
  do_all_to_all(output, input, output_splits, input_splits);
}

void CollectiveGroup::scatter(torch::Tensor& output, const std::vector<torch::Tensor>& inputs,
                              int root) {
  traffic_.scatter += bytes_of(output) * size();
  ++traffic_.calls;
  do_scatter(output, inputs, root);
}

void CollectiveGroup::barrier() {
  ++traffic_.calls;
  do_barrier();
}

std::chrono::milliseconds default_collective_timeout() {
  if (const char* ms = std::getenv(kEnvCollectiveTimeout)) {
    char* end = nullptr;
    const long long v = std::strtoll(ms, &end, 10);
    if (end && *end == '\0' && v > 0) return std::chrono::milliseconds(v);
  }
  return std::chrono::minutes(5);
}

CollectiveBackend collective_backend(const std::string& name) {
  if (name == "gloo") return CollectiveBackend::kGloo;
  if (name == "nccl") return CollectiveBackend::kNccl;
  throw InputError("collective backend \"" + name + "\": expected gloo or nccl");
}

std::unique_ptr<CollectiveGroup> make_collective_group(const CollectiveConfig& config) {
  if (config.backend == CollectiveBackend::kNccl)
    return make_nccl_group(config, open_store(config));
  return std::make_unique<GlooGroup>(config);
}

}  // namespace rlhf::transport
