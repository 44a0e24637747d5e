// Weight sync: header + layout check, then fixed-size buckets over the group or through a
// CUDA IPC buffer. See weight_sync.h.
#include "rollout/weight_sync.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <string>

#include "core/bits.h"
#include "core/errors.h"
#include "core/timing.h"
#include "engine/trainer.h"
#include "transport/cuda_ipc.h"

namespace rlhf::rollout {
namespace {

using Clock = std::chrono::steady_clock;

// Header fields, broadcast from the root as one int64 tensor.
enum HeaderField : int64_t {
  kVersion = 0,
  kUnits,
  kLayoutHash,
  kWireDtype,
  kBucketNumel,     // elements of wire dtype per bucket
  kPath,            // SyncPath
  kTensorParallel,  // the rollout's TP size: each rank receives only its slices
  kContent,         // SyncContent
  kLoraScale,       // kLoraAdapters: the scale s as the bits of a double
  kManifestBytes,   // kLoraAdapters: the layout's JSON, broadcast after the header
  kHeaderSize
};

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

template <typename T>
void sort_by_name(std::vector<T>& v) {
  std::sort(v.begin(), v.end(), [](const T& a, const T& b) { return a.first < b.first; });
}

// Full (unsharded) shapes: a tensor-parallel shard's layout is the whole model's.
std::vector<std::vector<TensorSpec>> layout_of_units(const std::vector<models::ParamUnit>& units) {
  std::vector<std::vector<TensorSpec>> layout;
  for (const auto& unit : units) {
    std::vector<TensorSpec> specs;
    for (size_t i = 0; i < unit.params.size(); ++i) {
      const auto& [name, tensor] = unit.params[i];
      specs.push_back({name, i < unit.shapes.size() ? unit.shapes[i] : tensor.sizes().vec()});
    }
    layout.push_back(std::move(specs));
  }
  return layout;
}

// Where the group's small control tensors live: NCCL only takes CUDA tensors (the current
// device), Gloo here takes CPU ones.
torch::Device control_device(const transport::CollectiveGroup& group) {
  return group.backend_name() == "nccl" ? torch::Device(torch::kCUDA) : torch::Device(torch::kCPU);
}

// Every rank says whether it can take this sync (0 yes, 1 no); all learn the worst.
bool all_ok(transport::CollectiveGroup& group, bool ok) {
  auto flag =
      torch::tensor({static_cast<int64_t>(ok ? 0 : 1)}, torch::kInt64).to(control_device(group));
  group.all_reduce(flag, transport::ReduceOp::kMax);
  return flag.item<int64_t>() == 0;
}

// An adapter layout as JSON text: [[[name, [d0, d1]], ...] per unit]. The adapters path's
// receiver builds its buffers from it (the rollout model has no adapters of its own).
std::string manifest_of(const std::vector<std::vector<TensorSpec>>& layout) {
  nlohmann::json units = nlohmann::json::array();
  for (const auto& unit : layout) {
    nlohmann::json specs = nlohmann::json::array();
    for (const auto& spec : unit) specs.push_back({spec.name, spec.shape});
    units.push_back(std::move(specs));
  }
  return units.dump();
}

// Throws nlohmann::json::exception on malformed text.
std::vector<std::vector<TensorSpec>> parse_manifest(const std::string& text) {
  std::vector<std::vector<TensorSpec>> layout;
  for (const auto& unit : nlohmann::json::parse(text)) {
    std::vector<TensorSpec> specs;
    for (const auto& spec : unit)
      specs.push_back({spec.at(0).get<std::string>(), spec.at(1).get<std::vector<int64_t>>()});
    layout.push_back(std::move(specs));
  }
  return layout;
}

// The root's `text` (n bytes, n known to all from the header) to every rank.
std::string broadcast_text(transport::CollectiveGroup& group, const std::string& text, int64_t n) {
  auto bytes = torch::zeros({n}, torch::kUInt8);
  if (group.rank() == 0) std::memcpy(bytes.data_ptr<uint8_t>(), text.data(), text.size());
  bytes = bytes.to(control_device(group));
  group.broadcast(bytes, 0);
  bytes = bytes.to(torch::kCPU);
  return std::string(reinterpret_cast<const char*>(bytes.data_ptr<uint8_t>()),
                     static_cast<size_t>(n));
}

}  // namespace

int64_t layout_hash(const std::vector<std::vector<TensorSpec>>& layout) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over "unit|name:d0,d1;..."
  auto mix = [&h](const std::string& s) {
    for (unsigned char ch : s) {
      h ^= ch;
      h *= 1099511628211ull;
    }
  };
  for (size_t u = 0; u < layout.size(); ++u) {
    auto specs = layout[u];
    std::sort(specs.begin(), specs.end(),
              [](const TensorSpec& a, const TensorSpec& b) { return a.name < b.name; });
    mix("|" + std::to_string(u));
    for (const auto& s : specs) {
      mix(s.name + ":");
      for (int64_t d : s.shape) mix(std::to_string(d) + ",");
      mix(";");
    }
  }
  return static_cast<int64_t>(h >> 1);
}

std::vector<std::vector<TensorSpec>> ModelWeights::layout() {
  return layout_of_units(model_.param_units());
}

NamedTensors ModelWeights::acquire(int64_t unit) {
  auto units = model_.param_units();
  TORCH_CHECK(unit >= 0 && unit < static_cast<int64_t>(units.size()), "ModelWeights: unit ", unit,
              " out of range");
  return units[static_cast<size_t>(unit)].params;
}

std::vector<std::vector<TensorSpec>> TrainerWeights::layout() {
  std::vector<std::vector<TensorSpec>> layout;
  for (const auto& unit : trainer_.unit_layout()) {
    std::vector<TensorSpec> specs;
    for (const auto& [name, shape] : unit) specs.push_back({name, shape});
    layout.push_back(std::move(specs));
  }
  return layout;
}

NamedTensors TrainerWeights::acquire(int64_t unit) {
  return trainer_.acquire_unit(unit, with_frozen_);
}

void TrainerWeights::release(int64_t unit) {
  trainer_.release_unit(unit);
}

namespace {

// The order both sides walk the weights in: units in order, each unit's tensors sorted by
// name, each tensor's elements in order, cut into buckets of `capacity` elements.
class BucketCursor {
 public:
  explicit BucketCursor(int64_t capacity) : capacity_(capacity) {}
  // piece(tensor_offset, bucket_offset, n) for each piece of a tensor of `numel` elements;
  // full(n) whenever the bucket holds `capacity` elements (then it starts empty).
  template <typename Piece, typename Full>
  void add(int64_t numel, Piece&& piece, Full&& full) {
    for (int64_t done = 0; done < numel;) {
      const int64_t n = std::min(numel - done, capacity_ - fill_);
      piece(done, fill_, n);
      fill_ += n;
      done += n;
      if (fill_ == capacity_) {
        full(fill_);
        fill_ = 0;
      }
    }
  }
  // full(n) for a partly filled last bucket.
  template <typename Full>
  void finish(Full&& full) {
    if (fill_ > 0) full(fill_);
    fill_ = 0;
  }

 private:
  int64_t capacity_;
  int64_t fill_ = 0;
};

// Moves one bucket's first n elements from the root to every other rank of the group.
class BucketTransport {
 public:
  virtual ~BucketTransport() = default;
  virtual torch::Tensor buffer() = 0;  // [capacity] wire dtype
  // Root: where TP rank `tp_rank`'s slices go (one buffer for all ranks without TP).
  virtual torch::Tensor buffer(int /*tp_rank*/) { return buffer(); }
  // Root: sends the first n elements (returns when the buffer may be refilled). Others:
  // makes them readable in buffer().
  virtual void move(int64_t n) = 0;
  // Others, after reading the bucket: tells the root it may refill it.
  virtual void consumed() {}
  virtual void finish() {}  // after the last bucket, on every rank
};

// Gloo or NCCL: one broadcast per bucket (into each rank's own buffer).
class BroadcastBuckets final : public BucketTransport {
 public:
  BroadcastBuckets(transport::CollectiveGroup& group, int64_t capacity, torch::Dtype dtype,
                   torch::Device device)
      : group_(group),
        buffer_(torch::empty({capacity}, torch::TensorOptions(dtype).device(device))) {}
  torch::Tensor buffer() override { return buffer_; }
  void move(int64_t n) override {
    auto part = buffer_.narrow(0, 0, n);
    group_.broadcast(part, 0);
  }

 private:
  transport::CollectiveGroup& group_;
  torch::Tensor buffer_;
};

// Tensor parallel: the root fills one buffer per TP rank (that rank's slices) and scatters
// them, sync rank g > 0 (rollout rank g - 1) getting TP rank (g - 1) % tp's; a receiver
// holds only its own.
class ScatterBuckets final : public BucketTransport {
 public:
  ScatterBuckets(transport::CollectiveGroup& group, int tp, int64_t capacity, torch::Dtype dtype,
                 torch::Device device)
      : group_(group) {
    const auto options = torch::TensorOptions(dtype).device(device);
    const int buffers = group.rank() == 0 ? tp + 1 : 1;  // the root's own piece: a scratch
    for (int i = 0; i < buffers; ++i) buffers_.push_back(torch::empty({capacity}, options));
  }
  torch::Tensor buffer() override { return buffers_[0]; }
  torch::Tensor buffer(int tp_rank) override {
    return buffers_.at(static_cast<size_t>(tp_rank) + 1);
  }
  void move(int64_t n) override {
    auto out = buffers_[0].narrow(0, 0, n);
    std::vector<torch::Tensor> inputs;
    if (group_.rank() == 0) {
      const int tp = static_cast<int>(buffers_.size()) - 1;
      inputs.push_back(buffer(0).narrow(0, 0, n));  // lands in the root's scratch, unused
      for (int g = 1; g < group_.size(); ++g)
        inputs.push_back(buffer((g - 1) % tp).narrow(0, 0, n));
    }
    group_.scatter(out, inputs, 0);
  }

 private:
  transport::CollectiveGroup& group_;
  std::vector<torch::Tensor> buffers_;  // receiver: [0]; root: [0] scratch, [1 + r] TP rank r
};

// The root's IPC buffer, mapped by every other rank; the group carries the handle, "bucket
// of n elements ready" (a broadcast) and "read" (a barrier).
class IpcBuckets final : public BucketTransport {
 public:
  // Root: allocates and exports the buffer. Others: map it; whether that worked is agreed
  // with all_ok by the caller (mapped()).
  IpcBuckets(transport::CollectiveGroup& group, int64_t capacity, torch::Dtype dtype)
      : group_(group) {
    const int64_t bytes = capacity * static_cast<int64_t>(c10::elementSize(dtype));
    auto handle = torch::zeros({transport::cuda_ipc_handle_bytes()}, torch::kUInt8);
    if (group.rank() == 0) {
      try {
        owned_ = std::make_unique<transport::CudaIpcBuffer>(bytes);
        const auto h = owned_->handle();
        std::copy(h.begin(), h.end(), handle.data_ptr<uint8_t>());
        buffer_ = owned_->as(dtype);
      } catch (const std::exception& e) {
        error_ = e.what();  // the receivers get a zero handle, fail to map it, and all agree
      }
    }
    group.broadcast(handle, 0);
    if (group.rank() == 0) return;
    try {
      const auto* p = handle.data_ptr<uint8_t>();
      mapping_ = std::make_unique<transport::CudaIpcMapping>(
          std::vector<uint8_t>(p, p + handle.numel()), bytes);
      buffer_ = mapping_->as(dtype);
    } catch (const std::exception& e) {
      error_ = e.what();
    }
  }
  const std::string& error() const { return error_; }  // why allocating or mapping failed
  torch::Tensor buffer() override { return buffer_; }
  void move(int64_t n) override {
    if (group_.rank() == 0)
      transport::cuda_synchronize();  // the bucket is written before it is announced
    auto count = torch::tensor({n}, torch::kInt64);
    group_.broadcast(count, 0);
    TORCH_CHECK(count.item<int64_t>() == n, "weight sync: the actor announced a bucket of ",
                count.item<int64_t>(), " elements, this rank expected ", n);
    if (group_.rank() == 0) group_.barrier();  // every receiver has copied it out
  }
  void consumed() override {
    transport::cuda_synchronize();  // the copies out of the mapped buffer are done
    group_.barrier();
  }
  void finish() override {
    mapping_.reset();  // unmapped on every receiver before the root frees the buffer
    group_.barrier();
  }

 private:
  transport::CollectiveGroup& group_;
  std::unique_ptr<transport::CudaIpcBuffer> owned_;
  std::unique_ptr<transport::CudaIpcMapping> mapping_;
  torch::Tensor buffer_;
  std::string error_;
};

int64_t bucket_numel(int64_t bucket_bytes, torch::Dtype dtype, int64_t total_numel) {
  const int64_t per =
      std::max<int64_t>(1, bucket_bytes / static_cast<int64_t>(c10::elementSize(dtype)));
  return std::max<int64_t>(1, std::min(per, total_numel));
}

// The sync's layout splits over `rollout_ranks` in engines of tensor_parallel_size (every
// split dimension divides), on a path that can scatter (not CUDA IPC).
bool tensor_parallel_fits(const std::vector<std::vector<TensorSpec>>& layout,
                          const SyncOptions& options, int rollout_ranks) {
  const int tp = std::max(options.tensor_parallel_size, 1);
  bool ok = options.tensor_parallel_size >= 1 &&
            (tp == 1 || (options.path != SyncPath::kCudaIpc && rollout_ranks % tp == 0));
  for (const auto& unit : layout)  // every split dim divides (checked before the header)
    for (const auto& spec : unit) {
      const int dim = tp > 1 ? models::tensor_parallel_dim(spec.name) : -1;
      if (dim >= 0 && (dim >= static_cast<int>(spec.shape.size()) || spec.shape[dim] % tp != 0))
        ok = false;
    }
  return ok;
}

// Elements each rollout rank receives (its TP slices).
int64_t received_numel(const std::vector<std::vector<TensorSpec>>& layout, int tp) {
  int64_t total = 0;
  for (const auto& unit : layout)
    for (const auto& spec : unit)
      total += numel_of(models::tensor_parallel_shape(spec.name, spec.shape, tp));
  return total;
}

// The header (and an adapter manifest) to every rank, then every rank's yes or no; throws
// naming the reason when anyone, the sender included, refused.
void announce(transport::CollectiveGroup& group, WeightSource& source,
              const std::vector<std::vector<TensorSpec>>& layout, const SyncOptions& options,
              int64_t version, int64_t capacity, bool tp_ok) {
  const int64_t units = static_cast<int64_t>(layout.size());
  const int tp = std::max(options.tensor_parallel_size, 1);
  const bool adapters = source.content() == SyncContent::kLoraAdapters;
  const std::string manifest = adapters ? manifest_of(layout) : "";
  auto header =
      torch::tensor({version, units, layout_hash(layout), static_cast<int64_t>(options.wire_dtype),
                     capacity, static_cast<int64_t>(options.path), static_cast<int64_t>(tp),
                     static_cast<int64_t>(source.content()), double_bits(source.lora_scale()),
                     static_cast<int64_t>(manifest.size())},
                    torch::kInt64)
          .to(control_device(group));
  group.broadcast(header, 0);
  if (adapters) broadcast_text(group, manifest, static_cast<int64_t>(manifest.size()));
  // The receivers learn of a refused sync through all_ok: nobody waits for buckets.
  if (!all_ok(group, tp_ok) || !tp_ok) {
    if (!tp_ok)
      throw InputError("weight sync v" + std::to_string(version) + ": tensor_parallel_size " +
                       std::to_string(options.tensor_parallel_size) +
                       " needs the gloo or nccl path, a rollout rank count that it divides and "
                       "a model whose heads, KV heads, intermediate size and vocabulary it "
                       "divides (" +
                       std::to_string(group.size() - 1) + " ranks, path " +
                       sync_path_name(options.path) + "); nothing was sent");
    throw RuntimeError("weight sync v" + std::to_string(version) +
                       (adapters ? ": a rollout rank cannot take the LoRA adapters (see its log); "
                                 : ": a rollout rank's model layout differs from the actor's "
                                   "(see its log); ") +
                       "nothing was sent");
  }
}

// The sender's transport for its path (after every rank agreed to take the sync).
std::unique_ptr<BucketTransport> sender_transport(transport::CollectiveGroup& group,
                                                  const SyncOptions& options, int64_t capacity,
                                                  int64_t version) {
  const int tp = std::max(options.tensor_parallel_size, 1);
  std::unique_ptr<BucketTransport> transport;
  if (options.path == SyncPath::kCudaIpc) {
    auto ipc = std::make_unique<IpcBuckets>(group, capacity, options.wire_dtype);
    const std::string error = ipc->error();
    if (!all_ok(group, error.empty()))
      throw RuntimeError("weight sync v" + std::to_string(version) + ": " +
                         (error.empty() ? "a rollout rank could not map the actor's CUDA IPC "
                                          "buffer (see its log)"
                                        : error) +
                         "; nothing was sent");
    transport = std::move(ipc);
  } else if (tp > 1) {
    transport =
        std::make_unique<ScatterBuckets>(group, tp, capacity, options.wire_dtype, options.device);
  } else {
    transport =
        std::make_unique<BroadcastBuckets>(group, capacity, options.wire_dtype, options.device);
  }
  return transport;
}

}  // namespace

const char* sync_path_name(SyncPath path) {
  switch (path) {
    case SyncPath::kGloo:
      return "gloo";
    case SyncPath::kNccl:
      return "nccl";
    case SyncPath::kCudaIpc:
      return "cuda_ipc";
  }
  return "?";
}

SyncPath parse_sync_path(const std::string& name) {
  for (SyncPath p : {SyncPath::kGloo, SyncPath::kNccl, SyncPath::kCudaIpc})
    if (name == sync_path_name(p)) return p;
  throw InputError("weight sync path \"" + name + "\": expected gloo, nccl or cuda_ipc");
}

int64_t bucket_count(const std::vector<int64_t>& numels, torch::Dtype wire_dtype,
                     int64_t bucket_bytes) {
  int64_t total = 0;
  for (int64_t n : numels) total += n;
  if (total == 0) return 0;
  const int64_t per = bucket_numel(bucket_bytes, wire_dtype, total);
  return (total + per - 1) / per;
}

WeightSyncStats send_weights(WeightSource& source, transport::CollectiveGroup* group,
                             int64_t version, const SyncOptions& options) {
  torch::NoGradGuard no_grad;
  const auto start = Clock::now();
  const auto layout = source.layout();
  const auto units = static_cast<int64_t>(layout.size());
  WeightSyncStats stats;
  stats.version = version;
  stats.path = options.path;
  if (!group) {  // another actor rank: only the (collective) gathers
    for (int64_t u = 0; u < units; ++u) {
      source.acquire(u);
      source.release(u);
    }
    stats.seconds = seconds_since(start);
    return stats;
  }
  TORCH_CHECK(group->rank() == 0,
              "send_weights: the actor must be rank 0 of the sync group, got rank ", group->rank());
  if (options.path == SyncPath::kCudaIpc)
    TORCH_CHECK(group->backend_name() == "gloo" && options.device.is_cuda(),
                "send_weights: cuda_ipc needs a Gloo sync group and a CUDA device");
  const int tp = std::max(options.tensor_parallel_size, 1);
  const bool tp_ok = tensor_parallel_fits(layout, options, group->size() - 1);
  const int64_t total = tp_ok ? received_numel(layout, tp) : 0;  // elements per rollout rank
  // At TP > 1 the root fills one bucket per TP rank, bucket_bytes together (plus a scratch
  // bucket its own scatter slot lands in).
  const int64_t capacity = bucket_numel(options.bucket_bytes / tp, options.wire_dtype, total);
  announce(*group, source, layout, options, version, capacity, tp_ok);
  std::unique_ptr<BucketTransport> transport = sender_transport(*group, options, capacity, version);
  std::vector<torch::Tensor> buckets;  // per TP rank
  for (int r = 0; r < tp; ++r) buckets.push_back(transport->buffer(r));
  BucketCursor cursor(capacity);
  const auto element = static_cast<int64_t>(c10::elementSize(options.wire_dtype));
  auto flush = [&](int64_t n) {
    transport->move(n);
    stats.bytes += n * element * tp;
    ++stats.buckets;
  };
  for (int64_t u = 0; u < units; ++u) {
    auto tensors = source.acquire(u);
    sort_by_name(tensors);
    for (const auto& [name, t] : tensors) {
      // Each TP rank's slice, flat (a column split is copied out once per tensor).
      std::vector<torch::Tensor> flats;
      for (int r = 0; r < tp; ++r)
        flats.push_back(models::tensor_parallel_slice(name, t, r, tp).reshape({-1}));
      cursor.add(
          flats[0].numel(),
          [&](int64_t from, int64_t at, int64_t n) {
            for (int r = 0; r < tp; ++r)  // converts to wire dtype
              buckets[static_cast<size_t>(r)].narrow(0, at, n).copy_(flats[r].narrow(0, from, n));
          },
          flush);
    }
    stats.tensors += static_cast<int64_t>(tensors.size());
    source.release(u);
  }
  cursor.finish(flush);
  transport->finish();
  stats.seconds = seconds_since(start);
  return stats;
}

namespace {

// The receiver's transport for the header's path (after every rank agreed to take it).
std::unique_ptr<BucketTransport> receiver_transport(models::CausalLM& model,
                                                    transport::CollectiveGroup& group,
                                                    SyncPath path, int64_t capacity,
                                                    torch::Dtype wire, const std::string& sync) {
  if (path == SyncPath::kCudaIpc) {
    std::string error;
    if (!model.device().is_cuda()) {
      error = "the model is on " + model.device().str() + ", not on the actor's GPU";
    }
    auto ipc = std::make_unique<IpcBuckets>(group, capacity, wire);
    if (error.empty()) error = ipc->error();
    if (!all_ok(group, error.empty()) || !error.empty())
      throw RuntimeError(sync + ": cannot take the actor's buckets through CUDA IPC: " +
                         (error.empty() ? "another rollout rank cannot (see its log)" : error));
    return ipc;
  }
  const auto& tp = model.tensor_parallel();
  if (tp.enabled())
    return std::make_unique<ScatterBuckets>(group, tp.size, capacity, wire, model.device());
  return std::make_unique<BroadcastBuckets>(group, capacity, wire, model.device());
}

// Fills `units`' tensors in place from the buckets, in the order both sides walk.
void receive_buckets(std::vector<models::ParamUnit>& units, BucketTransport& transport,
                     int64_t capacity, WeightSyncStats& stats) {
  // Pieces of the bucket being filled: where each goes in its parameter.
  struct Piece {
    torch::Tensor param_flat;  // [numel] the parameter's storage, flat
    int64_t from = 0, at = 0, n = 0;
  };
  std::vector<Piece> pending;
  BucketCursor cursor(capacity);
  auto apply = [&](int64_t n) {
    transport.move(n);
    torch::Tensor bucket = transport.buffer();
    for (const auto& p : pending)
      p.param_flat.narrow(0, p.from, p.n).copy_(bucket.narrow(0, p.at, p.n));  // converts dtype
    pending.clear();
    transport.consumed();
    stats.bytes += n * static_cast<int64_t>(bucket.element_size());
    ++stats.buckets;
  };
  for (auto& unit : units) {
    auto params = unit.params;
    sort_by_name(params);
    for (auto& [name, param] : params) {
      TORCH_CHECK(param.is_contiguous(), "receive_weights: parameter ", name,
                  " is not contiguous (it is filled in place)");
      auto flat = param.view({-1});
      cursor.add(
          flat.numel(),
          [&](int64_t from, int64_t at, int64_t n) {
            pending.push_back({flat, from, at, n});
          },
          apply);
    }
    stats.tensors += static_cast<int64_t>(params.size());
  }
  cursor.finish(apply);
  transport.finish();
}

}  // namespace

WeightSyncStats receive_weights(models::CausalLM& model, transport::CollectiveGroup& group,
                                LoraMerge* lora) {
  torch::NoGradGuard no_grad;
  const auto start = Clock::now();
  TORCH_CHECK(group.rank() > 0, "receive_weights: rank 0 of the sync group is the sender");
  auto header = torch::zeros({kHeaderSize},
                             torch::TensorOptions(torch::kInt64).device(control_device(group)));
  group.broadcast(header, 0);
  header = header.to(torch::kCPU);
  const auto* h = header.data_ptr<int64_t>();
  const std::string sync = "weight sync v" + std::to_string(h[kVersion]) + " on sync rank " +
                           std::to_string(group.rank());
  // What this rank fills: the model's parameters, or LoRA adapter buffers merged afterwards.
  const bool adapters = h[kContent] == static_cast<int64_t>(SyncContent::kLoraAdapters);
  std::string refused;  // why this rank cannot take the adapters
  std::vector<models::ParamUnit> units;
  if (adapters) {
    const std::string manifest = broadcast_text(group, "", h[kManifestBytes]);
    if (!lora) {
      refused =
          "the actor sends LoRA adapters (rollout.lora_sync adapters) and this rollout "
          "worker does not merge them";
    } else {
      try {
        refused = lora->prepare(model, parse_manifest(manifest), bits_double(h[kLoraScale]));
      } catch (const nlohmann::json::exception& e) {
        refused = std::string("the actor's adapter layout is not valid JSON: ") + e.what();
      }
    }
    if (refused.empty()) units = lora->units();
  } else {
    if (lora) lora->forget();
    units = model.param_units();
  }
  const int64_t mine = layout_hash(layout_of_units(units));
  const bool ok =
      refused.empty() && h[kUnits] == static_cast<int64_t>(units.size()) && h[kLayoutHash] == mine;
  const auto& tp = model.tensor_parallel();
  const bool tp_ok =
      h[kTensorParallel] == tp.size && (group.rank() - 1) % std::max(tp.size, 1) == tp.rank;
  if (!all_ok(group, ok && tp_ok) || !ok || !tp_ok) {
    if (!tp_ok)
      throw RuntimeError(
          sync + ": the actor sends tensor-parallel slices for " +
          std::to_string(h[kTensorParallel]) +
          " ranks (sync rank g gets TP rank (g - 1) % that), this model is TP rank " +
          std::to_string(tp.rank) + " of " + std::to_string(tp.size));
    if (!refused.empty()) throw RuntimeError(sync + ": cannot take the LoRA adapters: " + refused);
    throw RuntimeError(sync + ": the actor's layout (" + std::to_string(h[kUnits]) +
                       " units, hash " + std::to_string(h[kLayoutHash]) +
                       ") differs from this model's (" + std::to_string(units.size()) +
                       " units, hash " + std::to_string(mine) +
                       "), or another rank refused the sync (see the actor's log)");
  }
  const int64_t capacity = h[kBucketNumel];
  WeightSyncStats stats;
  stats.version = h[kVersion];
  stats.path = static_cast<SyncPath>(h[kPath]);
  auto transport = receiver_transport(model, group, stats.path, capacity,
                                      static_cast<torch::Dtype>(h[kWireDtype]), sync);
  receive_buckets(units, *transport, capacity, stats);
  if (adapters) lora->merge(model);
  stats.seconds = seconds_since(start);
  return stats;
}

}  // namespace rlhf::rollout
