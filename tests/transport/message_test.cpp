// Message encoding/decoding: bit-exact round trips of every supported dtype, zero-copy on
// both sides, and rejection (with a reason) of every malformed shape of input.
#include "transport/message.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <fstream>

namespace rlhf {
namespace {

Frames copy_frames(const Frames& frames) {
  Frames out;
  for (const auto& f : frames) out.emplace_back(f.data(), f.size());
  return out;
}

zmq::message_t text_frame(const std::string& s) {
  return zmq::message_t(s.data(), s.size());
}

Frames one_tensor_message(const std::string& tensor_json, size_t frame_bytes) {
  Frames f;
  f.push_back(
      text_frame(R"({"v":1,"kind":"request","op":"echo","id":9,"step":0,"args":{},"tensors":[)" +
                 tensor_json + "]}"));
  f.emplace_back(frame_bytes);
  return f;
}

std::string decode_error(Frames frames, const MessageLimits& limits = {}) {
  try {
    decode(std::move(frames), limits);
  } catch (const MessageError& e) {
    return e.what();
  }
  return "";
}

TEST(Message, EveryDtypeRoundTripsBitExact) {
  at::manual_seed(0);
  Message m;
  m.op = "echo";
  m.id = 42;
  m.step = 7;
  m.args = {{"temperature", 0.7}, {"tag", "x"}};
  const auto base = at::randn({3, 5, 2});
  m.add("f32", base)
      .add("f64", base.to(at::kDouble))
      .add("f16", base.to(at::kHalf))
      .add("bf16", base.to(at::kBFloat16))
      .add("i8", at::randint(-128, 127, {7}, at::kChar))
      .add("u8", at::randint(0, 255, {2, 3}, at::kByte))
      .add("i16", at::randint(-1000, 1000, {4}, at::kShort))
      .add("i32", at::randint(-100000, 100000, {1, 1, 3}, at::kInt))
      .add("i64", at::arange(11, at::kLong) * int64_t{1000000007})
      .add("mask", at::rand({6}) > 0.5)
      .add("scalar", at::tensor(3.5))
      .add("empty", at::empty({0, 4}));
  Message back = decode(copy_frames(encode(m)), MessageLimits{});
  EXPECT_EQ(back.op, "echo");
  EXPECT_EQ(back.id, 42u);
  EXPECT_EQ(back.step, 7);
  EXPECT_EQ(back.args, m.args);
  ASSERT_EQ(back.tensors.size(), m.tensors.size());
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    SCOPED_TRACE(m.tensors[i].name);
    EXPECT_EQ(back.tensors[i].name, m.tensors[i].name);
    EXPECT_EQ(back.tensors[i].tensor.scalar_type(), m.tensors[i].tensor.scalar_type());
    EXPECT_EQ(back.tensors[i].tensor.sizes(), m.tensors[i].tensor.sizes());
    EXPECT_TRUE(at::equal(back.tensors[i].tensor, m.tensors[i].tensor));  // exact, no tolerance
  }
}

TEST(Message, EncodeAndDecodeShareTheTensorBytes) {
  // Without a socket in between, the decoded tensor must point at the very bytes of the
  // sent tensor: proof that neither side copied.
  auto t = at::arange(1024, at::kFloat);
  const void* original = t.data_ptr();
  Message m;
  m.add("x", t);
  Frames frames = encode(m);
  EXPECT_EQ(frames[1].data(), original);
  Message back = decode(std::move(frames), MessageLimits{});
  EXPECT_EQ(back.tensor("x").data_ptr(), original);
  t.fill_(0);  // the sender's tensor and the received one are the same memory
  EXPECT_EQ(back.tensor("x").sum().item<float>(), 0.0f);
}

TEST(Message, FrameOutlivesTheSendersTensor) {
  Frames frames;
  {
    Message m;
    m.add("x", at::full({256}, 2.0f));
    frames = encode(m);
  }  // the message and tensor handle are gone; the frame keeps the bytes alive
  Message back = decode(std::move(frames), MessageLimits{});
  EXPECT_EQ(back.tensor("x").sum().item<float>(), 512.0f);
}

TEST(Message, NonContiguousTensorsAreSentAsTheirValues) {
  auto t = at::arange(12, at::kInt).reshape({3, 4}).t();
  Message m;
  m.add("t", t);
  Message back = decode(copy_frames(encode(m)), MessageLimits{});
  EXPECT_TRUE(at::equal(back.tensor("t"), t));
}

TEST(Message, RejectsBadJson) {
  Frames f;
  f.push_back(text_frame("{\"v\":1, \"kind\": "));
  EXPECT_NE(decode_error(std::move(f)).find("not valid JSON"), std::string::npos);
}

TEST(Message, RejectsMissingAndMistypedFields) {
  Frames a;
  a.push_back(text_frame(R"({"v":1,"kind":"request","id":1,"step":0,"tensors":[]})"));
  EXPECT_NE(decode_error(std::move(a)).find("missing \"op\""), std::string::npos);
  Frames b;
  b.push_back(text_frame(R"({"v":1,"kind":"request","op":"x","id":-1,"step":0,"tensors":[]})"));
  EXPECT_NE(decode_error(std::move(b)).find("\"id\" must be a non-negative integer"),
            std::string::npos);
  Frames c;
  c.push_back(text_frame(R"({"v":1,"kind":"launch","op":"x","id":1,"step":0,"tensors":[]})"));
  EXPECT_NE(decode_error(std::move(c)).find("unknown message kind"), std::string::npos);
  Frames d;
  d.push_back(text_frame(R"([1,2,3])"));
  EXPECT_NE(decode_error(std::move(d)).find("must be a JSON object"), std::string::npos);
  EXPECT_NE(decode_error(Frames{}).find("empty message"), std::string::npos);
}

TEST(Message, RejectsUnknownDtype) {
  auto err = decode_error(
      one_tensor_message(R"({"name":"x","dtype":"complex64","shape":[2],"nbytes":16})", 16));
  EXPECT_NE(err.find("unknown dtype \"complex64\""), std::string::npos) << err;
}

TEST(Message, RejectsTruncatedFrame) {
  auto err = decode_error(
      one_tensor_message(R"({"name":"x","dtype":"float32","shape":[4],"nbytes":16})", 12));
  EXPECT_NE(err.find("frame has 12 bytes, header declares 16"), std::string::npos) << err;
}

TEST(Message, RejectsShapeInconsistentWithBytes) {
  auto err = decode_error(
      one_tensor_message(R"({"name":"x","dtype":"float32","shape":[4],"nbytes":15})", 15));
  EXPECT_NE(err.find("needs 16"), std::string::npos) << err;
}

TEST(Message, RejectsFrameCountMismatch) {
  Frames f = one_tensor_message(R"({"name":"x","dtype":"uint8","shape":[4],"nbytes":4})", 4);
  f.emplace_back(4);  // a stray extra frame
  EXPECT_NE(decode_error(std::move(f)).find("declares 1 tensors but 2 data frames"),
            std::string::npos);
  Frames g = one_tensor_message(R"({"name":"x","dtype":"uint8","shape":[4],"nbytes":4})", 4);
  g.pop_back();  // the data frame is missing
  EXPECT_NE(decode_error(std::move(g)).find("but 0 data frames"), std::string::npos);
}

TEST(Message, RejectsHugeDeclaredSizesWithoutAllocating) {
  // 2^62 elements of float64 would overflow 64-bit byte counts; must be refused by the
  // checks, not by an allocation failure.
  auto err = decode_error(one_tensor_message(
      R"({"name":"x","dtype":"float64","shape":[4611686018427387904,4],"nbytes":0})", 0));
  EXPECT_NE(err.find("bad dimension 4611686018427387904"), std::string::npos) << err;
  // Each dimension alone is plausible; their product is not.
  err = decode_error(one_tensor_message(
      R"({"name":"x","dtype":"float64","shape":[2147483648,2147483648,4],"nbytes":0})", 0));
  EXPECT_NE(err.find("exceeds the size limit"), std::string::npos) << err;
  MessageLimits small;
  small.max_total_bytes = 1024;
  err = decode_error(
      one_tensor_message(R"({"name":"x","dtype":"float32","shape":[1024],"nbytes":4096})", 4096),
      small);
  EXPECT_NE(err.find("total more than the limit of 1024 bytes"), std::string::npos) << err;
  small.max_header_bytes = 16;
  err = decode_error(
      one_tensor_message(R"({"name":"x","dtype":"float32","shape":[1],"nbytes":4})", 4), small);
  EXPECT_NE(err.find("header of"), std::string::npos) << err;
}

TEST(Message, RejectsDuplicateNamesAndTooManyDims) {
  Frames f;
  f.push_back(text_frame(R"({"v":1,"kind":"request","op":"e","id":1,"step":0,"tensors":[)"
                         R"({"name":"x","dtype":"uint8","shape":[1],"nbytes":1},)"
                         R"({"name":"x","dtype":"uint8","shape":[1],"nbytes":1}]})"));
  f.emplace_back(1);
  f.emplace_back(1);
  EXPECT_NE(decode_error(std::move(f)).find("appears twice"), std::string::npos);
  auto err = decode_error(one_tensor_message(
      R"({"name":"x","dtype":"uint8","shape":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1],"nbytes":1})", 1));
  EXPECT_NE(err.find("17 dims"), std::string::npos) << err;
}

TEST(Message, PeekRequestIdSurvivesGarbage) {
  EXPECT_EQ(peek_request_id(text_frame(R"({"id": 77, "kind": 3})")), 77u);
  EXPECT_EQ(peek_request_id(text_frame("\xff\xfe garbage")), 0u);
}

}  // namespace
}  // namespace rlhf

namespace rlhf {
namespace {

bool segment_exists(const std::string& name) {
  return std::ifstream("/dev/shm" + name).good();
}

TEST(SharedMemoryTensor, LargeTensorsTravelAsSegmentsBitExact) {
  auto big = at::randn({300, 100}).to(at::kBFloat16);  // 60000 bytes
  auto small = at::arange(5, at::kInt);                // 20 bytes: stays in its frame
  Message m;
  m.add("big", big).add("small", small);
  Frames frames = encode(m, EncodeOptions{1024});
  ASSERT_EQ(frames.size(), 3u);
  EXPECT_EQ(frames[1].size(), 0u);  // the bytes are in the segment, not the frame
  EXPECT_EQ(frames[2].size(), 20u);
  auto header = nlohmann::json::parse(
      std::string(static_cast<const char*>(frames[0].data()), frames[0].size()));
  const std::string name = header["tensors"][0]["shm"].get<std::string>();
  EXPECT_TRUE(segment_exists(name));
  Message back = decode(std::move(frames), MessageLimits{});
  EXPECT_FALSE(segment_exists(name));  // unlinked by the receiver; the mapping lives on
  EXPECT_TRUE(at::equal(back.tensor("big"), big));
  EXPECT_TRUE(at::equal(back.tensor("small"), small));
}

TEST(SharedMemoryTensor, RejectsBadNamesMissingSegmentsAndWrongSizes) {
  auto err = decode_error(one_tensor_message(
      R"({"name":"x","dtype":"uint8","shape":[4],"nbytes":4,"shm":"/etc/passwd"})", 0));
  EXPECT_NE(err.find("bad shared-memory segment name"), std::string::npos) << err;
  err = decode_error(one_tensor_message(
      R"({"name":"x","dtype":"uint8","shape":[4],"nbytes":4,"shm":"/rlhf-999999999-0"})", 0));
  EXPECT_NE(err.find("shared-memory segment /rlhf-999999999-0: No such file"), std::string::npos)
      << err;
  err = decode_error(one_tensor_message(
      R"({"name":"x","dtype":"uint8","shape":[4],"nbytes":4,"shm":"/rlhf-1-2"})", 4));
  EXPECT_NE(err.find("frame has 4 bytes, header declares 0"), std::string::npos) << err;
  // A real segment of the wrong size.
  Message m;
  m.add("x", at::zeros({8}, at::kByte));
  Frames frames = encode(m, EncodeOptions{1});
  auto header = nlohmann::json::parse(
      std::string(static_cast<const char*>(frames[0].data()), frames[0].size()));
  const std::string name = header["tensors"][0]["shm"].get<std::string>();
  err = decode_error(one_tensor_message(
      R"({"name":"x","dtype":"uint8","shape":[4],"nbytes":4,"shm":")" + name + R"("})", 0));
  EXPECT_NE(err.find("holds 8 bytes, header declares 4"), std::string::npos) << err;
  EXPECT_FALSE(segment_exists(name));
}

}  // namespace
}  // namespace rlhf
