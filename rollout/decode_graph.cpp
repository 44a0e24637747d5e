// PagedDecoder: padded decode steps, captured as CUDA graphs on a GPU. See decode_graph.h.
#include "rollout/decode_graph.h"

#include <ATen/core/CachingHostAllocator.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <optional>

#include "core/timing.h"

namespace rlhf::rollout {
namespace {

using Clock = std::chrono::steady_clock;

// The process's decode stream of a device, taken from the pool once.
c10::cuda::CUDAStream decode_stream(c10::DeviceIndex index) {
  static std::mutex mutex;
  static std::map<c10::DeviceIndex, c10::cuda::CUDAStream> streams;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = streams.find(index);
  if (it == streams.end())
    it = streams.emplace(index, c10::cuda::getStreamFromPool(false, index)).first;
  return it->second;
}

}  // namespace

struct DecodeStream::Impl {
  Impl(c10::cuda::CUDAStream previous, c10::cuda::CUDAStream decode)
      : previous(previous), decode(decode), guard(decode) {}
  c10::cuda::CUDAStream previous;
  c10::cuda::CUDAStream decode;
  std::optional<c10::cuda::CUDAStreamGuard> guard;
};

DecodeStream::DecodeStream(torch::Device device) {
  if (!device.is_cuda()) return;
  const auto index = device.has_index() ? device.index() : c10::cuda::current_device();
  auto previous = c10::cuda::getCurrentCUDAStream(index);
  auto decode = decode_stream(index);
  at::cuda::CUDAEvent queued;
  queued.record(previous);
  queued.block(decode);
  impl_ = std::make_unique<Impl>(previous, decode);
}

DecodeStream::~DecodeStream() {
  if (!impl_) return;
  impl_->guard.reset();
  at::cuda::CUDAEvent done;
  done.record(impl_->decode);
  done.block(impl_->previous);
}

// A CUDA graph whose failed capture can take the random generators it registered out of
// capture mode. torch 2.11 does that only in capture_end (CUDAGeneratorState::
// capture_epilogue, which clears `capturing_` and is not exported); a capture that threw
// leaves the default generator's state capturing, and every eager random op after it throws
// ("Offset increment outside graph capture encountered unexpectedly").
struct CaptureGraph : at::cuda::CUDAGraph {
  void end_random_capture() {
    for (auto& entry : captured_generator_states_) entry.first->capturing_ = false;
  }
};

// One padded shape: its inputs on the device, and on a GPU its graph and output.
struct PagedDecoder::Shape {
  int64_t batch = 0;
  int64_t blocks = 0;
  // [batch * (3 + blocks)] int64: ids, then what PagedKvCache::fill_decode_inputs writes
  // (slots, positions, block tables). The views below are what the graph reads.
  torch::Tensor inputs;
  torch::Tensor ids;        // [batch, 1]
  torch::Tensor slots;      // [batch]
  torch::Tensor positions;  // [batch, 1]
  torch::Tensor tables;     // [batch * blocks]
  std::unique_ptr<CaptureGraph> graph;
  torch::Tensor logits;  // the graph's output [batch, 1, V]: rows of PagedDecoder::logits_
  int64_t kernels = 0;   // kernel nodes in the graph (-1: not known)
};

PagedDecoder::PagedDecoder(models::CausalLM& model, models::PagedKvCache& cache, int64_t max_batch,
                           int64_t max_blocks, bool capture)
    : model_(model),
      cache_(cache),
      max_batch_(max_batch),
      max_blocks_(max_blocks),
      capture_(capture),
      device_(model.device()) {
  TORCH_CHECK(max_batch > 0 && max_blocks > 0,
              "PagedDecoder: max_batch and max_blocks must be "
              "positive, got ",
              max_batch, ", ", max_blocks);
  TORCH_CHECK(!capture || device_.is_cuda(), "PagedDecoder: CUDA graphs need a CUDA model, got ",
              device_);
  if (capture_) pool_ = at::cuda::graph_pool_handle();
}

PagedDecoder::~PagedDecoder() = default;

int64_t PagedDecoder::batch_bucket(int64_t rows) const {
  int64_t bucket = 1;
  while (bucket < rows) {
    // 1, 2, 4, 8, then 12, 16, 24, 32, 48, ...: past 8 rows, at most a third is padding.
    if (bucket < 8 || (bucket & (bucket - 1)) != 0)
      bucket = (bucket & (bucket - 1)) != 0 ? bucket / 3 * 4 : bucket * 2;
    else
      bucket = bucket * 3 / 2;
  }
  return std::min(bucket, max_batch_);
}

int64_t PagedDecoder::block_bucket(int64_t blocks) const {
  int64_t bucket = 1;
  while (bucket < blocks) bucket *= 2;
  return std::min(bucket, max_blocks_);
}

PagedDecoder::Shape& PagedDecoder::shape(int64_t batch, int64_t blocks) {
  const std::pair<int64_t, int64_t> key{batch, blocks};
  if (auto it = shapes_.find(key); it != shapes_.end()) return *it->second;
  auto s = std::make_unique<Shape>();
  s->batch = batch;
  s->blocks = blocks;
  s->inputs =
      torch::zeros({batch * (3 + blocks)}, torch::TensorOptions(torch::kInt64).device(device_));
  s->ids = s->inputs.narrow(0, 0, batch).view({batch, 1});
  s->slots = s->inputs.narrow(0, batch, batch);
  s->positions = s->inputs.narrow(0, 2 * batch, batch).view({batch, 1});
  s->tables = s->inputs.narrow(0, 3 * batch, batch * blocks);
  // Registered only once captured: a capture that throws leaves no shape behind, so a later
  // step of that shape captures again instead of replaying a graph never captured.
  if (capture_) capture(*s);
  return *shapes_.emplace(key, std::move(s)).first->second;
}

namespace {

// Kernel nodes of the graph the current stream is capturing into (a decode step's kernel
// count: launch gaps inside a graph are ~1.3 us each, so this is the step's fixed cost).
int64_t kernels_in_capture() {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  cudaGraph_t graph = nullptr;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  if (cudaStreamGetCaptureInfo(stream, &status, nullptr, &graph) != cudaSuccess ||
      status != cudaStreamCaptureStatusActive || graph == nullptr)
    return -1;
  size_t count = 0;
  if (cudaGraphGetNodes(graph, nullptr, &count) != cudaSuccess) return -1;
  std::vector<cudaGraphNode_t> nodes(count);
  if (count > 0 && cudaGraphGetNodes(graph, nodes.data(), &count) != cudaSuccess) return -1;
  int64_t kernels = 0;
  for (auto node : nodes) {
    cudaGraphNodeType type;
    if (cudaGraphNodeGetType(node, &type) == cudaSuccess && type == cudaGraphNodeTypeKernel)
      ++kernels;
  }
  return kernels;
}

// Ends a capture that threw half way (an out-of-memory error, a kernel that may not be
// captured), so that the stream, the allocators and the random generator work again. torch
// 2.11's CUDAGraph::capture_end ends the stream's capture before it stops routing allocations
// into the graphs' pool, and only a capture that ended gives its reference to the pool back
// or takes the default CUDA generator out of capture mode; when the capture itself failed
// none of that happens, and the next capture_begin on the pool would fail ("already
// recording to mempool_id"), the pool would never be freed, and an eager random op would
// throw. Each step is tried alone; `graph` is the failed capture's.
void abandon_capture(CaptureGraph& graph, c10::DeviceIndex device,
                     const std::pair<unsigned long long, unsigned long long>& pool) {
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device).stream();
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &status) == cudaSuccess &&
      status != cudaStreamCaptureStatusNone) {
    cudaGraph_t partial = nullptr;
    (void)cudaStreamEndCapture(stream, &partial);  // an invalidated capture gives no graph
    if (partial != nullptr) (void)cudaGraphDestroy(partial);
  }
  (void)cudaGetLastError();  // the failed capture's error, not a later call's
  try {
    c10::cuda::CUDACachingAllocator::endAllocateToPool(device, pool);
  } catch (const c10::Error&) {  // capture_end had already ended it
  }
  try {
    at::getHostAllocator(at::kCUDA)->end_allocate_to_pool(pool);
  } catch (const c10::Error&) {
  }
  bool ended = true;
  try {
    (void)graph.pool();  // throws unless capture_end got to its end
  } catch (const c10::Error&) {
    ended = false;
  }
  if (!ended) {  // the capture's reference to the shared pool, which reset() will not give back
    try {
      c10::cuda::CUDACachingAllocator::releasePool(device, pool);
    } catch (const c10::Error&) {
    }
    try {
      at::getHostAllocator(at::kCUDA)->release_pool(pool);
    } catch (const c10::Error&) {
    }
  }
  graph.end_random_capture();
}

}  // namespace

void PagedDecoder::capture(Shape& s) {
  const auto start = Clock::now();
  // Warm-up and capture run on padding rows only (every row on the scratch block), so the
  // warm-up forward writes no sequence's keys; the real step's inputs come after.
  const int64_t n = models::PagedKvCache::decode_inputs_size(s.batch, s.blocks);
  auto host = torch::empty({n}, torch::kInt64);
  cache_.fill_decode_inputs({}, s.batch, s.blocks, host.data_ptr<int64_t>());
  s.inputs.narrow(0, s.batch, n).copy_(host);
  torch::cuda::synchronize();
  // Capture needs a stream other than the default one (DecodeStream gives it); the graph
  // then replays on any.
  TORCH_CHECK(c10::cuda::getCurrentCUDAStream(device_.index()) !=
                  c10::cuda::getDefaultCUDAStream(device_.index()),
              "PagedDecoder: capturing needs a non-default stream (run under DecodeStream)");
  // Lazy initialisation (cuBLAS handles and workspaces, the rotary table) happens here,
  // outside the capture; so does the logits buffer every graph writes into.
  cache_.plan_decode_static({}, s.slots, s.positions, s.tables);
  const auto warm = model_.logits(model_.forward(s.ids, cache_));  // [batch, 1, V]
  if (!logits_.defined()) logits_ = torch::empty({max_batch_, 1, warm.size(2)}, warm.options());
  auto graph = std::make_unique<CaptureGraph>();
  // Thread-local: the worker's other threads (sockets, logging) are not capturing.
  graph->capture_begin(pool_, cudaStreamCaptureModeThreadLocal);
  try {
    cache_.plan_decode_static({}, s.slots, s.positions, s.tables);
    // The LM head too: the step's logits [batch, 1, V] come out of the graph, so nothing of
    // the forward runs eagerly between replays. They land in the rows of the one buffer all
    // shapes share (the head's own output is freed inside the capture, so its pool block is
    // reused by the next shape's capture): a buffer per shape held ~78 MB each at V = 151,936
    // and 256 rows in BF16, for the rollout's life, across 10-25 shapes (issue 39.1.5).
    s.logits = logits_.narrow(0, 0, s.batch);
    s.logits.copy_(model_.logits(model_.forward(s.ids, cache_)));
    s.kernels = kernels_in_capture();
    graph->capture_end();
  } catch (const c10::OutOfMemoryError& e) {
    s.logits = torch::Tensor();
    abandon_capture(*graph, device_.index(), pool_);
    // An out-of-memory error like any other (the worker names role, device and phase), with
    // the shape whose graph did not fit.
    TORCH_CHECK_WITH(OutOfMemoryError, false, "capturing the CUDA graph of a decode step of ",
                     s.batch, " rows x ", s.blocks, " KV blocks: ", e.what_without_backtrace());
  } catch (...) {
    s.logits = torch::Tensor();
    abandon_capture(*graph, device_.index(), pool_);
    throw;
  }
  s.graph = std::move(graph);
  torch::cuda::synchronize();
  capture_seconds_ += seconds_since(start);
}

torch::Tensor PagedDecoder::step(const std::vector<int64_t>& seqs, const torch::Tensor& next,
                                 const std::vector<int64_t>& extra, torch::Tensor* extra_out) {
  const int64_t C = static_cast<int64_t>(seqs.size());
  TORCH_CHECK(C > 0 && C <= max_batch_ && next.dim() == 1 && next.size(0) == C,
              "PagedDecoder::step: 1..", max_batch_, " sequences and next [C], got ", C, " and ",
              next.sizes());
  int64_t needed = 1;
  for (int64_t seq : seqs) needed = std::max(needed, cache_.blocks_for(cache_.length(seq) + 1));
  TORCH_CHECK(needed <= max_blocks_, "PagedDecoder::step: a sequence needs ", needed,
              " blocks, the decoder was made for ", max_blocks_);
  Shape& s = shape(batch_bucket(C), block_bucket(needed));

  // The step's inputs and `extra` in one host buffer; pinned on a GPU, so the copy does not
  // wait for the device (the caching host allocator keeps the buffer until the copy ran).
  const int64_t n = models::PagedKvCache::decode_inputs_size(s.batch, s.blocks);
  const int64_t E = static_cast<int64_t>(extra.size());
  auto host =
      torch::empty({n + E}, torch::TensorOptions(torch::kInt64).pinned_memory(device_.is_cuda()));
  int64_t* data = host.data_ptr<int64_t>();
  cache_.fill_decode_inputs(seqs, s.batch, s.blocks, data);
  std::copy(extra.begin(), extra.end(), data + n);
  s.inputs.narrow(0, s.batch, n).copy_(host.narrow(0, 0, n), /*non_blocking=*/true);
  if (extra_out) {
    *extra_out = torch::empty({E}, torch::TensorOptions(torch::kInt64).device(device_));
    if (E > 0) extra_out->copy_(host.narrow(0, n, E), /*non_blocking=*/true);
  }
  s.ids.narrow(0, 0, C).copy_(next.view({C, 1}));

  cache_.plan_decode_static(seqs, s.slots, s.positions, s.tables);
  if (s.graph) {
    s.graph->replay();
    cache_.finish_step();
    return s.logits.narrow(0, 0, C).squeeze(1);  // [C, V]
  }
  auto hidden = model_.forward(s.ids, cache_);              // marks the step filled
  return model_.logits(hidden.narrow(0, 0, C)).squeeze(1);  // [C, V]
}

int64_t PagedDecoder::kernels_per_step() const {
  int64_t most = 0;
  for (const auto& [key, s] : shapes_) most = std::max(most, s->kernels);
  return most;
}

}  // namespace rlhf::rollout
