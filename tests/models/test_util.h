// Helpers shared by the models tests: temporary directories, error-message checks and
// norm-relative tensor comparison.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <functional>
#include <string>

namespace rlhf::models::testing {

// A fresh directory under the system temp dir, removed when the test ends.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "rlhf_models_XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string str() const { return path_.string(); }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

// Runs `f`, expects an exception of type E whose message contains every `needles` entry.
template <typename E>
void expect_error(const std::function<void()>& f, const std::vector<std::string>& needles) {
  try {
    f();
    ADD_FAILURE() << "expected an exception";
  } catch (const E& e) {
    const std::string msg = e.what();
    for (const auto& n : needles)
      EXPECT_NE(msg.find(n), std::string::npos) << "message: " << msg << "\nmissing: " << n;
  }
}

// max |a - b| / max |b| (0 when both are all zero): the error relative to the tensor's scale,
// which stays meaningful where individual entries are near zero.
inline double relative_error(const torch::Tensor& a, const torch::Tensor& b) {
  auto ad = a.to(torch::kFloat64), bd = b.to(torch::kFloat64);
  double scale = bd.abs().max().item<double>();
  double diff = (ad - bd).abs().max().item<double>();
  return scale == 0 ? diff : diff / scale;
}

}  // namespace rlhf::models::testing
