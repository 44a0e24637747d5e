// Encoding and validated decoding of transport messages (see message.h for the format).
#include "transport/message.h"

#include <ATen/ATen.h>

#include <cstring>
#include <memory>
#include <set>
#include <utility>

#include "transport/shm_tensor.h"

namespace rlhf {
namespace {

constexpr int kFormatVersion = 1;

struct KindName {
  MessageKind kind;
  const char* name;
};
constexpr KindName kKinds[] = {
    {MessageKind::kRequest, "request"},       {MessageKind::kReply, "reply"},
    {MessageKind::kError, "error"},           {MessageKind::kRegister, "register"},
    {MessageKind::kRegistered, "registered"}, {MessageKind::kHeartbeat, "heartbeat"},
    {MessageKind::kShutdown, "shutdown"},     {MessageKind::kPartial, "partial"},
};

struct DtypeName {
  c10::ScalarType dtype;
  const char* name;
};
constexpr DtypeName kDtypes[] = {
    {c10::kFloat, "float32"},     {c10::kDouble, "float64"}, {c10::kHalf, "float16"},
    {c10::kBFloat16, "bfloat16"}, {c10::kChar, "int8"},      {c10::kByte, "uint8"},
    {c10::kShort, "int16"},       {c10::kInt, "int32"},      {c10::kLong, "int64"},
    {c10::kBool, "bool"},
};

MessageKind parse_kind(const std::string& name) {
  for (const auto& k : kKinds)
    if (name == k.name) return k.kind;
  throw MessageError("unknown message kind \"" + name + "\"");
}

// ZeroMQ's free callback: drops the reference that kept the tensor's bytes alive.
void release_tensor(void* /*data*/, void* hint) {
  delete static_cast<at::Tensor*>(hint);
}

zmq::message_t tensor_frame(const at::Tensor& contiguous_cpu) {
  const size_t nbytes = contiguous_cpu.nbytes();
  if (nbytes == 0) return zmq::message_t();
  auto keep_alive = std::make_unique<at::Tensor>(contiguous_cpu);
  zmq::message_t frame(keep_alive->data_ptr(), nbytes, &release_tensor, keep_alive.get());
  keep_alive.release();  // owned by the frame from here on
  return frame;
}

const nlohmann::json& require(const nlohmann::json& obj, const char* key,
                              const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end()) throw MessageError(where + ": missing \"" + key + "\"");
  return *it;
}

uint64_t require_unsigned(const nlohmann::json& obj, const char* key, const std::string& where) {
  const auto& v = require(obj, key, where);
  if (!v.is_number_unsigned())
    throw MessageError(where + ": \"" + key + "\" must be a non-negative integer, found " +
                       v.dump());
  return v.get<uint64_t>();
}

std::string require_string(const nlohmann::json& obj, const char* key, const std::string& where) {
  const auto& v = require(obj, key, where);
  if (!v.is_string()) throw MessageError(where + ": \"" + key + "\" must be a string");
  return v.get<std::string>();
}

struct TensorSpec {
  std::string name;
  c10::ScalarType dtype;
  std::vector<int64_t> shape;
  uint64_t nbytes;
  std::string shm;  // shared-memory segment name, or "" when the bytes are in the frame
};

// Checks one tensor entry of the header against the limits; never allocates by its sizes.
TensorSpec parse_tensor_spec(const nlohmann::json& entry, size_t index,
                             const MessageLimits& limits) {
  const std::string where = "header tensors[" + std::to_string(index) + "]";
  if (!entry.is_object()) throw MessageError(where + " must be an object");
  TensorSpec spec;
  spec.name = require_string(entry, "name", where);
  if (spec.name.empty()) throw MessageError(where + ": empty tensor name");
  spec.dtype = parse_dtype(require_string(entry, "dtype", where));
  const auto& shape = require(entry, "shape", where);
  if (!shape.is_array()) throw MessageError(where + ": \"shape\" must be an array");
  if (shape.size() > limits.max_dims)
    throw MessageError(where + ": " + std::to_string(shape.size()) + " dims, limit " +
                       std::to_string(limits.max_dims));
  uint64_t numel = 1;
  for (const auto& d : shape) {
    if (!d.is_number_unsigned() || d.get<uint64_t>() > limits.max_total_bytes)
      throw MessageError(where + ": bad dimension " + d.dump() + " in shape " + shape.dump());
    const uint64_t dim = d.get<uint64_t>();
    if (__builtin_mul_overflow(numel, dim, &numel) || numel > limits.max_total_bytes)
      throw MessageError(where + ": shape " + shape.dump() + " exceeds the size limit");
    spec.shape.push_back(static_cast<int64_t>(dim));
  }
  spec.nbytes = require_unsigned(entry, "nbytes", where);
  if (auto it = entry.find("shm"); it != entry.end()) {
    if (!it->is_string() || !is_shm_name(it->get<std::string>()))
      throw MessageError(where + ": bad shared-memory segment name " + it->dump());
    spec.shm = it->get<std::string>();
  }
  const uint64_t expected = numel * c10::elementSize(spec.dtype);
  if (spec.nbytes != expected)
    throw MessageError(where + " (\"" + spec.name + "\"): nbytes " + std::to_string(spec.nbytes) +
                       " but shape " + shape.dump() + " of " + dtype_name(spec.dtype) + " needs " +
                       std::to_string(expected));
  return spec;
}

// A tensor over the frame's bytes that keeps the frame alive; copies only when the bytes
// are misaligned for the dtype (ZeroMQ gives no alignment guarantee).
at::Tensor tensor_from_frame(zmq::message_t&& frame, const TensorSpec& spec) {
  const auto options = at::TensorOptions().dtype(spec.dtype);
  if (spec.nbytes == 0) return at::empty(spec.shape, options);
  auto owned = std::make_shared<zmq::message_t>(std::move(frame));  // data() is stable from here
  void* data = owned->data();
  if (reinterpret_cast<uintptr_t>(data) % c10::elementSize(spec.dtype) != 0) {
    at::Tensor copy = at::empty(spec.shape, options);
    std::memcpy(copy.data_ptr(), data, spec.nbytes);
    return copy;
  }
  return at::from_blob(
      data, spec.shape, [owned](void*) mutable { owned.reset(); }, options);
}

}  // namespace

const char* message_kind_name(MessageKind kind) {
  for (const auto& k : kKinds)
    if (k.kind == kind) return k.name;
  return "?";
}

const char* dtype_name(c10::ScalarType dtype) {
  for (const auto& d : kDtypes)
    if (d.dtype == dtype) return d.name;
  throw InputError(std::string("dtype ") + c10::toString(dtype) + " cannot travel in a message");
}

c10::ScalarType parse_dtype(const std::string& name) {
  for (const auto& d : kDtypes)
    if (name == d.name) return d.dtype;
  throw MessageError("unknown dtype \"" + name + "\"");
}

const torch::Tensor& Message::tensor(const std::string& name) const {
  for (const auto& t : tensors)
    if (t.name == name) return t.tensor;
  throw InputError("message \"" + op + "\" (id " + std::to_string(id) + ") has no tensor \"" +
                   name + "\"");
}

bool Message::has_tensor(const std::string& name) const {
  for (const auto& t : tensors)
    if (t.name == name) return true;
  return false;
}

Message& Message::add(std::string name, torch::Tensor tensor) {
  tensors.push_back({std::move(name), std::move(tensor)});
  return *this;
}

Frames encode(const Message& message, const EncodeOptions& options) {
  Frames frames;
  frames.reserve(1 + message.tensors.size());
  nlohmann::json header = {{"v", kFormatVersion},
                           {"kind", message_kind_name(message.kind)},
                           {"op", message.op},
                           {"id", message.id},
                           {"step", message.step},
                           {"args", message.args},
                           {"tensors", nlohmann::json::array()}};
  if (!message.error.empty()) header["error"] = message.error;
  std::vector<at::Tensor> ready;
  for (const auto& [name, tensor] : message.tensors) {
    TORCH_CHECK(tensor.defined(), "message \"", message.op, "\": tensor \"", name,
                "\" is undefined");
    at::Tensor t = tensor.device().is_cpu() ? tensor : tensor.cpu();
    t = t.contiguous();
    nlohmann::json entry = {{"name", name},
                            {"dtype", dtype_name(t.scalar_type())},
                            {"shape", t.sizes().vec()},
                            {"nbytes", t.nbytes()}};
    if (options.shm_min_bytes > 0 && t.nbytes() >= options.shm_min_bytes) {
      entry["shm"] = shm_export(t);
      t = at::Tensor();  // an empty frame
    }
    header["tensors"].push_back(std::move(entry));
    ready.push_back(std::move(t));
  }
  // Text a model wrote (a byte-level vocabulary can end a turn mid-character) need not be
  // UTF-8: invalid bytes go as U+FFFD rather than failing the whole message.
  frames.emplace_back(header.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  for (const auto& t : ready) frames.push_back(t.defined() ? tensor_frame(t) : zmq::message_t());
  return frames;
}

Message decode(Frames&& frames, const MessageLimits& limits) {
  if (frames.empty()) throw MessageError("empty message (no header frame)");
  const zmq::message_t& head = frames[0];
  if (head.size() > limits.max_header_bytes)
    throw MessageError("header of " + std::to_string(head.size()) + " bytes exceeds the limit of " +
                       std::to_string(limits.max_header_bytes));
  const char* text = static_cast<const char*>(head.data());
  nlohmann::json header = nlohmann::json::parse(text, text + head.size(), nullptr, false);
  if (header.is_discarded()) throw MessageError("header is not valid JSON");
  if (!header.is_object()) throw MessageError("header must be a JSON object");
  const std::string where = "header";
  if (require_unsigned(header, "v", where) != kFormatVersion)
    throw MessageError("header format version " + require(header, "v", where).dump() +
                       ", expected " + std::to_string(kFormatVersion));
  Message m;
  m.kind = parse_kind(require_string(header, "kind", where));
  m.op = require_string(header, "op", where);
  m.id = require_unsigned(header, "id", where);
  const auto& step = require(header, "step", where);
  if (!step.is_number_integer()) throw MessageError("header: \"step\" must be an integer");
  m.step = step.get<int64_t>();
  if (auto it = header.find("args"); it != header.end()) {
    if (!it->is_object()) throw MessageError("header: \"args\" must be an object");
    m.args = std::move(*it);
  }
  if (auto it = header.find("error"); it != header.end()) {
    if (!it->is_string()) throw MessageError("header: \"error\" must be a string");
    m.error = it->get<std::string>();
  }
  const auto& entries = require(header, "tensors", where);
  if (!entries.is_array()) throw MessageError("header: \"tensors\" must be an array");
  if (entries.size() > limits.max_tensors)
    throw MessageError("header declares " + std::to_string(entries.size()) + " tensors, limit " +
                       std::to_string(limits.max_tensors));
  if (frames.size() != 1 + entries.size())
    throw MessageError("header declares " + std::to_string(entries.size()) + " tensors but " +
                       std::to_string(frames.size() - 1) + " data frames follow");
  std::vector<TensorSpec> specs;
  std::set<std::string> names;
  uint64_t total = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    TensorSpec spec = parse_tensor_spec(entries[i], i, limits);
    if (!names.insert(spec.name).second)
      throw MessageError("header: tensor name \"" + spec.name + "\" appears twice");
    if (__builtin_add_overflow(total, spec.nbytes, &total) || total > limits.max_total_bytes)
      throw MessageError("tensors total more than the limit of " +
                         std::to_string(limits.max_total_bytes) + " bytes");
    const uint64_t frame_bytes = spec.shm.empty() ? spec.nbytes : 0;
    if (frames[1 + i].size() != frame_bytes)
      throw MessageError("tensor \"" + spec.name + "\": frame has " +
                         std::to_string(frames[1 + i].size()) + " bytes, header declares " +
                         std::to_string(frame_bytes));
    specs.push_back(std::move(spec));
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    const TensorSpec& spec = specs[i];
    m.tensors.push_back(
        {spec.name, spec.shm.empty() ? tensor_from_frame(std::move(frames[1 + i]), spec)
                                     : shm_import(spec.shm, spec.dtype, spec.shape, spec.nbytes)});
  }
  frames.clear();
  return m;
}

uint64_t peek_request_id(const zmq::message_t& header) noexcept {
  try {
    const char* text = static_cast<const char*>(header.data());
    auto j = nlohmann::json::parse(text, text + header.size(), nullptr, false);
    if (j.is_object() && j.contains("id") && j["id"].is_number_unsigned())
      return j["id"].get<uint64_t>();
  } catch (...) {
  }
  return 0;
}

Message make_error(uint64_t id, std::string op, std::string error) {
  Message m;
  m.kind = MessageKind::kError;
  m.id = id;
  m.op = std::move(op);
  m.error = std::move(error);
  return m;
}

}  // namespace rlhf
