// safetensors files and checkpoint directories: exact round trips, sharding, and the
// errors a truncated or corrupt file must give (naming the file, never crashing).
#include "models/safetensors.h"

#include <fstream>

#include "core/errors.h"
#include "test_util.h"

namespace rlhf::models {
namespace {

using testing::expect_error;
using testing::TempDir;

NamedTensors sample_tensors() {
  torch::manual_seed(7);
  return {{"a.f32", torch::randn({3, 5})},
          {"b.bf16", torch::randn({4, 2}).to(torch::kBFloat16)},
          {"c.f16", torch::randn({7}).to(torch::kFloat16)},
          {"d.i64", torch::arange(0, 10, torch::kInt64).reshape({2, 5})},
          {"e.bool", torch::tensor({true, false, true})},
          {"f.empty", torch::zeros({0, 4})},
          {"g.scalar", torch::tensor(3.5)}};
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A file with the given header text and `data_bytes` bytes of data.
std::string raw_file(const std::string& header, size_t data_bytes) {
  uint64_t n = header.size();
  std::string out(reinterpret_cast<const char*>(&n), 8);
  return out + header + std::string(data_bytes, '\0');
}

TEST(Safetensors, RoundTripIsBitExactForEveryDtype) {
  TempDir dir;
  auto tensors = sample_tensors();
  save_safetensors(dir / "t.safetensors", tensors);
  SafetensorsFile file(dir / "t.safetensors");
  ASSERT_EQ(file.tensors().size(), tensors.size());
  EXPECT_EQ(file.metadata().at("format"), "pt");  // transformers refuses files without it
  for (const auto& [name, t] : tensors) {
    auto loaded = file.view(name);
    EXPECT_EQ(loaded.scalar_type(), t.scalar_type()) << name;
    EXPECT_EQ(loaded.sizes(), t.sizes()) << name;
    EXPECT_TRUE(torch::equal(loaded, t)) << name;
  }
  // Writing what was read gives the same bytes.
  NamedTensors again;
  for (const auto& [name, t] : tensors) again.emplace_back(name, file.view(name));
  save_safetensors(dir / "u.safetensors", again);
  EXPECT_EQ(read_bytes(dir / "t.safetensors"), read_bytes(dir / "u.safetensors"));
}

TEST(Safetensors, HeaderIsPaddedSoDataIsAligned) {
  TempDir dir;
  save_safetensors(dir / "t.safetensors", {{"x", torch::ones({3})}});
  std::string bytes = read_bytes(dir / "t.safetensors");
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(bytes.size(), 8 + n + 12);
}

TEST(Safetensors, WriterChecksOrderAndCleansUpWhenUnfinished) {
  TempDir dir;
  {
    SafetensorsWriter w(dir / "w.safetensors",
                        {{"x", torch::kFloat32, {2}}, {"y", torch::kFloat32, {1}}});
    EXPECT_THROW(w.write("y", torch::ones({1})), c10::Error);  // out of order
    w.write("x", torch::ones({2}));
    EXPECT_THROW(w.finish(), InputError);  // y missing
  }
  EXPECT_FALSE(std::filesystem::exists(dir / "w.safetensors"));
  EXPECT_FALSE(std::filesystem::exists(dir / "w.safetensors.tmp"));
}

TEST(Safetensors, TruncatedFileIsAnErrorNamingIt) {
  TempDir dir;
  save_safetensors(dir / "t.safetensors", sample_tensors());
  std::string bytes = read_bytes(dir / "t.safetensors");
  write_bytes(dir / "cut.safetensors", bytes.substr(0, bytes.size() - 10));
  expect_error<InputError>([&] { SafetensorsFile f(dir / "cut.safetensors"); },
                           {dir / "cut.safetensors", "outside the file", "truncated"});
  write_bytes(dir / "tiny.safetensors", bytes.substr(0, 5));
  expect_error<InputError>([&] { SafetensorsFile f(dir / "tiny.safetensors"); },
                           {"tiny.safetensors", "truncated"});
  write_bytes(dir / "head.safetensors", bytes.substr(0, 40));  // cut inside the header
  expect_error<InputError>([&] { SafetensorsFile f(dir / "head.safetensors"); },
                           {"head.safetensors", "truncated"});
}

TEST(Safetensors, CorruptHeadersAreErrorsNamingTheFileAndTensor) {
  TempDir dir;
  const std::string p = dir / "bad.safetensors";
  write_bytes(p, raw_file("{not json", 0));
  expect_error<InputError>([&] { SafetensorsFile f(p); }, {p, "corrupt safetensors header"});
  write_bytes(p, raw_file(R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,12]}})", 12));
  expect_error<InputError>([&] { SafetensorsFile f(p); },
                           {p, "\"w\"", "do not match its dtype and shape"});
  write_bytes(p, raw_file(R"({"w":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[0,2]}})", 2));
  expect_error<InputError>([&] { SafetensorsFile f(p); }, {p, "\"w\"", "F8_E4M3"});
  write_bytes(p, raw_file(R"({"w":{"dtype":"F32","shape":[2]}})", 8));
  expect_error<InputError>([&] { SafetensorsFile f(p); }, {p, "\"w\"", "corrupt header entry"});
  write_bytes(p, raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                          R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                          12));
  expect_error<InputError>([&] { SafetensorsFile f(p); }, {p, "overlap"});
  expect_error<InputError>([&] { SafetensorsFile f(dir / "absent.safetensors"); },
                           {"absent.safetensors", "cannot open"});
}

TEST(Checkpoint, ShardedWriteReadsBackWithIndex) {
  TempDir dir;
  NamedTensors tensors;
  for (int i = 0; i < 5; ++i)
    tensors.emplace_back("layer." + std::to_string(i), torch::full({64}, float(i)));
  save_checkpoint(dir.str(), tensors, /*max_shard_bytes=*/600);  // 256 B each: 2 per shard
  EXPECT_FALSE(std::filesystem::exists(dir / kSingleFileName));
  ASSERT_TRUE(std::filesystem::exists(dir / kIndexFileName));
  EXPECT_TRUE(std::filesystem::exists(dir / "model-00003-of-00003.safetensors"));
  CheckpointReader reader(dir.str());
  ASSERT_EQ(reader.names().size(), 5u);
  EXPECT_EQ(std::filesystem::path(reader.file_of("layer.4")).filename(),
            "model-00003-of-00003.safetensors");
  for (const auto& [name, t] : tensors) EXPECT_TRUE(torch::equal(reader.view(name), t)) << name;

  // Saving again as one file replaces the index (a stale index would shadow the file).
  save_checkpoint(dir.str(), tensors);
  EXPECT_FALSE(std::filesystem::exists(dir / kIndexFileName));
  EXPECT_EQ(CheckpointReader(dir.str()).names().size(), 5u);
}

TEST(Checkpoint, IndexErrorsNameTheFile) {
  TempDir dir;
  expect_error<InputError>([&] { CheckpointReader r(dir.str()); },
                           {dir.str(), "not an HF checkpoint directory"});
  save_safetensors(dir / "model-00001-of-00001.safetensors", {{"x", torch::ones({2})}});
  write_checkpoint_index(
      dir.str(),
      {{"x", "model-00001-of-00001.safetensors"}, {"y", "model-00001-of-00001.safetensors"}}, 8);
  expect_error<InputError>([&] { CheckpointReader r(dir.str()); },
                           {"model-00001-of-00001.safetensors", "\"y\"", "not in this file"});
  write_checkpoint_index(dir.str(), {{"x", "gone.safetensors"}}, 8);
  expect_error<InputError>([&] { CheckpointReader r(dir.str()); },
                           {"gone.safetensors", "cannot open"});
  write_bytes(dir / kIndexFileName, "{\"weight_map\": ");
  expect_error<InputError>([&] { CheckpointReader r(dir.str()); },
                           {kIndexFileName, "corrupt index"});
}

}  // namespace
}  // namespace rlhf::models
