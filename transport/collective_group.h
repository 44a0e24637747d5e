// A group of N ranks (processes) running collectives on tensors: the one interface the
// trainer uses, with a c10d Gloo backend (CPU tensors; CUDA ones staged through the host) and
// an NCCL backend (CUDA tensors, one GPU per rank). It does not move messages between roles (that
// is the ZeroMQ side of transport/).
#pragma once

#include <torch/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/errors.h"
#include "core/json_fields.h"

namespace rlhf::transport {

enum class CollectiveBackend { kGloo, kNccl };
enum class ReduceOp { kSum, kMax };
// Where the group meets: a file on a shared filesystem, or a TCP key-value store.
enum class StoreKind { kFile, kTcp };
// Who hosts a kTcp store: rank 0 of the group (on `port`), or a process outside the group
// (the scheduler) that every rank connects to.
enum class StoreHost { kRank0, kExternal };

// A collective that failed in flight: a peer died or hung past the timeout. The group is
// unusable afterwards; a worker reports it as a failure of its rank (actors/worker.cpp).
class CollectiveFailure : public RuntimeError {
 public:
  using RuntimeError::RuntimeError;
};

// RLHF_COLLECTIVE_TIMEOUT_MS (fault.collective_timeout_s) when the scheduler set it, else 5
// minutes.
std::chrono::milliseconds default_collective_timeout();

struct CollectiveConfig {
  CollectiveBackend backend = CollectiveBackend::kGloo;
  int rank = 0;
  int size = 1;
  StoreKind store = StoreKind::kFile;
  std::string store_path;          // kFile: the rendezvous file (must not exist beforehand)
                                   // or a store URL tcp://HOST:PORT/GROUP (transport/store.h)
  std::string token;               // store URL: the job token to prove; "": $RLHF_TOKEN
  std::string host = "127.0.0.1";  // kTcp: store host; the Gloo device binds here too
  uint16_t port = 0;               // kTcp: store port (must be set: peers need to know it)
  StoreHost store_host = StoreHost::kRank0;
  std::chrono::milliseconds timeout = default_collective_timeout();  // every collective and wait
  int cuda_device = 0;  // kNccl: the device this rank's tensors live on
};

// The payload bytes of the collectives a group ran, by kind: what each call's tensors hold
// (an all-gather's output, a reduce-scatter's input, an all-reduce's and a broadcast's
// tensor, a scatter's size() pieces), whatever algorithm moves them. What one rank sends and
// receives for them is wire_bytes_per_rank's.
struct CollectiveTraffic {
  int64_t all_gather = 0;
  int64_t reduce_scatter = 0;
  int64_t all_reduce = 0;
  int64_t broadcast = 0;
  int64_t scatter = 0;
  int64_t all_to_all = 0;  // what this rank's inputs held (its own rows included)
  int64_t calls = 0;       // collectives of every kind, barriers included

  int64_t total() const {
    return all_gather + reduce_scatter + all_reduce + broadcast + scatter + all_to_all;
  }
  CollectiveTraffic operator-(const CollectiveTraffic& before) const;
  CollectiveTraffic& operator+=(const CollectiveTraffic& more);
  bool operator==(const CollectiveTraffic& other) const;
};
RLHF_WIRE_STRUCT(CollectiveTraffic, "collectives", all_gather, reduce_scatter, all_reduce,
                 broadcast, scatter, all_to_all, calls)

// The bytes one rank sends for `t` in a group of `ranks` (and as many it receives), by the
// algorithms each backend runs. NCCL, ring: all-gather and reduce-scatter (N-1)/N of the
// payload, all-reduce 2 (N-1)/N, broadcast the whole tensor (a pipelined chain). Gloo as
// GlooGroup runs it: all-gather and reduce-scatter are ring all-reduces of the whole buffer
// (faster there than c10d Gloo's own, gloo_group.h), so 2 (N-1)/N each. Scatters: the root's
// (N-1)/N; all-to-all what leaves the rank, counted as (N-1)/N of its input. Zero for one rank.
int64_t wire_bytes_per_rank(const CollectiveTraffic& t, int ranks, const std::string& backend);

// Collectives on contiguous tensors of one dtype. A call returns when its result is ready for
// what comes next: Gloo (CPU tensors) blocks until it is done; NCCL (CUDA tensors) enqueues it
// on torch's current CUDA stream and returns without waiting for the device, so later work on
// that stream (or a copy to the host) sees the result. Calls throw rlhf::RuntimeError (naming
// rank and operation) when a peer fails or the timeout passes: Gloo in that call, NCCL in the
// first call after its watchdog noticed (a call that returns a result to the host, CPU tensors
// or barrier, checks after waiting). An asynchronous all-reduce: all_reduce_async in
// nccl_group.h. Every call adds its payload to traffic() (a backend implements the do_*
// functions; its internal calls go to do_* and are not counted twice).
class CollectiveGroup {
 public:
  virtual ~CollectiveGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend_name() const = 0;

  // In place: tensor = op over all ranks' `tensor`.
  void all_reduce(torch::Tensor& tensor, ReduceOp op);
  // output [size * n] = concat over ranks of input [n] (rank order).
  void all_gather(torch::Tensor& output, const torch::Tensor& input);
  // output [n] = sum over ranks of input[rank * n : (rank + 1) * n], input [size * n].
  // `input` is scratch: its contents afterwards are unspecified (Gloo reduces in place).
  void reduce_scatter(torch::Tensor& output, torch::Tensor& input);
  // In place: every rank's tensor becomes root's.
  void broadcast(torch::Tensor& tensor, int root);
  // Root sends inputs[r] to rank r (size() tensors of output's numel and dtype; inputs[root]
  // lands in root's own output); other ranks pass no inputs. What a rank receives is only
  // its own piece (a tensor-parallel weight sync: each rank gets its slices).
  void scatter(torch::Tensor& output, const std::vector<torch::Tensor>& inputs, int root);
  // Rows along dim 0 (the other dims alike on every rank): this rank sends input rows
  // [sum(input_splits[:k]), + input_splits[k]) to rank k and receives rank k's rows for it
  // into output rows [sum(output_splits[:k]), + output_splits[k]). Rank r's input_splits[k]
  // must equal rank k's output_splits[r] (exchange the counts first: an all_to_all of [size]
  // int64 with splits of 1). Expert parallelism's token dispatch.
  void all_to_all(torch::Tensor& output, const torch::Tensor& input,
                  const std::vector<int64_t>& output_splits,
                  const std::vector<int64_t>& input_splits);
  void barrier();

  // Every collective this rank has run in the group so far (its calls are made from one
  // thread at a time, as collectives must be).
  const CollectiveTraffic& traffic() const { return traffic_; }

 protected:
  virtual void do_all_reduce(torch::Tensor& tensor, ReduceOp op) = 0;
  virtual void do_all_gather(torch::Tensor& output, const torch::Tensor& input) = 0;
  virtual void do_reduce_scatter(torch::Tensor& output, torch::Tensor& input) = 0;
  virtual void do_broadcast(torch::Tensor& tensor, int root) = 0;
  virtual void do_scatter(torch::Tensor& output, const std::vector<torch::Tensor>& inputs,
                          int root) = 0;
  virtual void do_all_to_all(torch::Tensor& output, const torch::Tensor& input,
                             const std::vector<int64_t>& output_splits,
                             const std::vector<int64_t>& input_splits) = 0;
  virtual void do_barrier() = 0;

 private:
  CollectiveTraffic traffic_;
};

// "gloo" or "nccl" (as backend_name() says); InputError otherwise.
CollectiveBackend collective_backend(const std::string& name);

// Joins the group described by `config` (blocks until all `size` ranks have joined).
// Throws rlhf::InputError for a bad config, rlhf::RuntimeError when rendezvous fails, and
// for kNccl in a build without NCCL.
std::unique_ptr<CollectiveGroup> make_collective_group(const CollectiveConfig& config);

}  // namespace rlhf::transport
