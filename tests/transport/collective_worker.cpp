// Test helper process for collective_test: joins a collective group and writes the result
// of each collective as a line "name v0 v1 ..." to --out. The test checks the values.
// Usage: rlhf_collective_worker RANK SIZE (file PATH | tcp PORT | tcp0 PORT) OUT [nccl]
// With "nccl": the NCCL backend, rank r on GPU r, the same collectives (CPU tensors staged
// through the GPU) plus "async": an all_reduce_async of CUDA tensors overlapped with other
// work on the current stream, read after wait().
#include <torch/types.h>

#include <fstream>
#include <iostream>

#include "transport/collective_group.h"
#include "transport/nccl_group.h"

using rlhf::transport::CollectiveConfig;
using rlhf::transport::ReduceOp;

namespace {

void write(std::ofstream& out, const std::string& name, const torch::Tensor& t) {
  auto flat = t.to(torch::kDouble).contiguous();
  out << name;
  for (int64_t i = 0; i < flat.numel(); ++i) out << ' ' << flat.data_ptr<double>()[i];
  out << '\n';
}

}  // namespace

int main(int argc, char** argv) {
  const bool nccl = argc == 7 && std::string(argv[6]) == "nccl";
  if (argc != 6 && !nccl) {
    std::cerr << "usage: rlhf_collective_worker RANK SIZE (file PATH | tcp PORT) OUT [nccl]\n";
    return 2;
  }
  try {
    torch::set_num_threads(1);
    CollectiveConfig config;
    config.rank = std::stoi(argv[1]);
    config.size = std::stoi(argv[2]);
    if (std::string(argv[3]) == "file") {
      config.store_path = argv[4];
    } else {  // "tcp": hosted outside the group; "tcp0": rank 0 hosts it
      config.store = rlhf::transport::StoreKind::kTcp;
      config.store_host = std::string(argv[3]) == "tcp0" ? rlhf::transport::StoreHost::kRank0
                                                         : rlhf::transport::StoreHost::kExternal;
      config.port = static_cast<uint16_t>(std::stoi(argv[4]));
    }
    config.timeout = std::chrono::seconds(60);
    if (nccl) {
      config.backend = rlhf::transport::CollectiveBackend::kNccl;
      config.cuda_device = config.rank;
    }
    auto group = rlhf::transport::make_collective_group(config);
    const int r = group->rank();
    const int n = group->size();
    std::ofstream out(argv[5]);
    out << "rank " << group->rank() << "\nsize " << group->size() << '\n';

    // rank r contributes [r+1, 10(r+1), -(r+1)] (float) to the sum and max.
    auto sum = torch::tensor({1.0f, 10.0f, -1.0f}) * (r + 1);
    group->all_reduce(sum, ReduceOp::kSum);
    write(out, "sum", sum);
    auto max = torch::tensor({1.0f, 10.0f, -1.0f}) * (r + 1);
    group->all_reduce(max, ReduceOp::kMax);
    write(out, "max", max);

    // all_gather of [r, r + 0.5] in bf16 (exact in bf16): [0, .5, 1, 1.5, ...].
    auto piece = torch::tensor({r * 1.0f, r + 0.5f}).to(torch::kBFloat16);
    auto gathered = torch::empty({2 * n}, piece.options());
    group->all_gather(gathered, piece);
    write(out, "gather", gathered);
    // An odd number of BF16 elements: 6 x size bytes, not always a multiple of 4 words.
    auto odd = torch::tensor({r * 1.0f, r + 0.25f, r + 0.5f}).to(torch::kBFloat16);
    auto odd_gathered = torch::empty({3 * n}, odd.options());
    group->all_gather(odd_gathered, odd);
    write(out, "gather3", odd_gathered);

    // reduce_scatter of input[i] = i * (r + 1), 3 per rank: rank r gets sum_k (k+1) * i.
    auto input = torch::arange(3 * n, torch::kFloat) * (r + 1);
    auto shard = torch::empty({3}, torch::kFloat);
    group->reduce_scatter(shard, input);
    write(out, "scatter", shard);

    auto bcast = torch::full({4}, static_cast<int64_t>(100 + r), torch::kLong);
    group->broadcast(bcast, n - 1);
    write(out, "bcast", bcast);
    // scatter from the last rank: rank k receives [k, 2k] (as int64), the root's own too.
    auto piece_of = torch::empty({2}, torch::kLong);
    std::vector<torch::Tensor> pieces;
    if (r == n - 1)
      for (int k = 0; k < n; ++k) pieces.push_back(torch::tensor({k, 2 * k}, torch::kLong));
    group->scatter(piece_of, pieces, n - 1);
    write(out, "scatter_from_root", piece_of);
    // all_to_all with uneven splits (some 0), as expert dispatch runs it: rank r sends rank k
    // (2r + k) % 3 rows of BF16 [r * 10 + k, j] (row j), the counts exchanged first.
    std::vector<int64_t> ones(n, 1), send(n), recv(n);
    auto counts = torch::empty({n}, torch::kLong);
    for (int k = 0; k < n; ++k) counts[k] = send[k] = (2 * r + k) % 3;
    auto got_counts = torch::empty({n}, torch::kLong);
    group->all_to_all(got_counts, counts, ones, ones);
    write(out, "a2a_counts", got_counts);
    int64_t rows_in = 0, rows_out = 0;
    for (int k = 0; k < n; ++k) {
      recv[k] = got_counts[k].item<int64_t>();
      rows_in += recv[k];
      rows_out += send[k];
    }
    auto rows = torch::empty({rows_out, 2}, torch::kFloat);
    for (int k = 0, at = 0; k < n; ++k)
      for (int64_t j = 0; j < send[k]; ++j, ++at) {
        rows[at][0] = r * 10 + k;
        rows[at][1] = static_cast<double>(j);
      }
    auto received = torch::empty({rows_in, 2}, torch::kBFloat16);
    group->all_to_all(received, rows.to(torch::kBFloat16), recv, send);
    write(out, "a2a", received);
    if (nccl) {
      // rank r contributes r + 1 everywhere; a matmul queued behind it on the current stream
      // overlaps; after wait() the stream orders the read: every element is sum (r + 1).
      const auto cuda = torch::TensorOptions(torch::kFloat).device(torch::kCUDA, r);
      auto t = torch::full({1 << 20}, static_cast<float>(r + 1), cuda);
      auto pending = rlhf::transport::all_reduce_async(*group, t, ReduceOp::kSum);
      auto busy = torch::ones({1024, 1024}, cuda);
      busy = torch::matmul(busy, busy);
      pending->wait();
      write(out, "async", torch::stack({t.min(), t.max(), busy[0][0] / 1024}));
    }
    group->barrier();
    out << "done\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "collective worker: " << e.what() << '\n';
    return 1;
  }
}
