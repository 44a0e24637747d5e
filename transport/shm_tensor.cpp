// POSIX shm_open/mmap behind the shared-memory tensor path.
#include "transport/shm_tensor.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstring>

#include "transport/message.h"

namespace rlhf {
namespace {

std::string errno_text() {
  return std::strerror(errno);
}

// Closes a descriptor on every path.
struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

bool is_shm_name(const std::string& name) {
  if (name.size() < 8 || name.size() > 64 || name.rfind("/rlhf-", 0) != 0) return false;
  for (size_t i = 6; i < name.size(); ++i)
    if (!std::isdigit(static_cast<unsigned char>(name[i])) && name[i] != '-') return false;
  return true;
}

std::string shm_export(const torch::Tensor& t) {
  static std::atomic<uint64_t> counter{0};
  TORCH_CHECK(t.is_contiguous() && t.device().is_cpu(), "shm_export needs a contiguous CPU tensor");
  const size_t nbytes = t.nbytes();
  const std::string name = "/rlhf-" + std::to_string(getpid()) + "-" + std::to_string(counter++);
  Fd fd{::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600)};
  if (fd.fd < 0) throw RuntimeError("shm_open(" + name + ") failed: " + errno_text());
  if (::ftruncate(fd.fd, static_cast<off_t>(nbytes)) != 0) {
    const std::string why = errno_text();
    ::shm_unlink(name.c_str());
    throw RuntimeError("ftruncate(" + name + ", " + std::to_string(nbytes) + ") failed: " + why);
  }
  if (nbytes > 0) {
    void* map =
        ::mmap(nullptr, nbytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd.fd, 0);
    if (map == MAP_FAILED) {
      const std::string why = errno_text();
      ::shm_unlink(name.c_str());
      throw RuntimeError("mmap(" + name + ") failed: " + why);
    }
    std::memcpy(map, t.data_ptr(), nbytes);
    ::munmap(map, nbytes);
  }
  return name;
}

torch::Tensor shm_import(const std::string& name, c10::ScalarType dtype,
                         const std::vector<int64_t>& shape, uint64_t nbytes) {
  if (!is_shm_name(name)) throw MessageError("bad shared-memory segment name \"" + name + "\"");
  Fd fd{::shm_open(name.c_str(), O_RDWR, 0)};
  if (fd.fd < 0) throw MessageError("shared-memory segment " + name + ": " + errno_text());
  ::shm_unlink(name.c_str());  // the mapping keeps the memory; the name is no longer needed
  struct stat st {};
  if (::fstat(fd.fd, &st) != 0) throw MessageError("fstat(" + name + ") failed: " + errno_text());
  if (static_cast<uint64_t>(st.st_size) != nbytes)
    throw MessageError("shared-memory segment " + name + " holds " + std::to_string(st.st_size) +
                       " bytes, header declares " + std::to_string(nbytes));
  const auto options = at::TensorOptions().dtype(dtype);
  if (nbytes == 0) return at::empty(shape, options);
  void* map = ::mmap(nullptr, nbytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd.fd, 0);
  if (map == MAP_FAILED) throw MessageError("mmap(" + name + ") failed: " + errno_text());
  return at::from_blob(
      map, shape, [nbytes](void* p) { ::munmap(p, nbytes); }, options);
}

}  // namespace rlhf
