// Shared-memory path for large tensors between processes on one node: the sender copies the
// bytes once into a POSIX shared-memory segment and the message carries its name instead
// of the bytes; the receiver maps it (no copy), unlinks the name at once, and the tensor
// owns the mapping. Not for other nodes; a segment whose message is never received stays
// in /dev/shm until reboot (names start with /rlhf- so they can be found).
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace rlhf {

// Writes the contiguous CPU tensor's bytes into a new segment; returns its name
// ("/rlhf-<pid>-<n>"). Throws RuntimeError naming the failing call.
std::string shm_export(const torch::Tensor& contiguous_cpu);

// Maps segment `name` (which must look like shm_export's names and hold exactly `nbytes`),
// unlinks it, and returns a tensor over the mapping. Throws MessageError on a bad name or
// size, or when the segment cannot be opened.
torch::Tensor shm_import(const std::string& name, c10::ScalarType dtype,
                         const std::vector<int64_t>& shape, uint64_t nbytes);

// Whether `name` has the form shm_export produces (checked before any system call).
bool is_shm_name(const std::string& name);

}  // namespace rlhf
