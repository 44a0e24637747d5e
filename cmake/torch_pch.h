// The torch headers every torch translation unit starts from, compiled once (see NOTES.md:
// one <torch/torch.h> include costs ~24 s and 1.25 GB to compile on 2 cores).
#pragma once
#include <torch/torch.h>
