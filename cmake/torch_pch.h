// The torch headers every torch translation unit starts from, compiled once. Narrower than
// <torch/torch.h> by measurement (bench/RESULTS.md, "Torch precompiled header"): the PCH
// builds in 26 s instead of 36 s, is 444 MB instead of 570 MB, and each TU compiles 3-5 s
// (25-40%) faster with ~300 MB less RAM, including TUs that include <torch/torch.h> anyway.
// <torch/cuda.h>, <torch/utils.h> and <torch/version.h> are small and used by TUs that
// relied on the old all-of-torch PCH (torch::cuda::is_available, NoGradGuard, versions).
#pragma once
#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/cuda.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/types.h>
#include <torch/utils.h>
#include <torch/version.h>
