# LibTorch comes from the torch wheel (scripts/python-env); everything else from Debian
# packages and the machine's CUDA toolkit (scripts/setup installs them).

# --- LibTorch 2.11 with CUDA --------------------------------------------------------------
# RLHF_PYTHON names the interpreter whose torch we build against; its
# torch.utils.cmake_prefix_path holds TorchConfig.cmake. Torch_DIR, when given, wins.
set(RLHF_TORCH_VERSION 2.11 CACHE STRING "The torch minor version rlhf is written against")
if(NOT RLHF_PYTHON)
  find_program(RLHF_PYTHON_FOUND NAMES python3 python)
  set(RLHF_PYTHON ${RLHF_PYTHON_FOUND})
endif()
set(RLHF_PYTHON ${RLHF_PYTHON} CACHE FILEPATH "Python with torch ${RLHF_TORCH_VERSION} (scripts/python-env)")
if(NOT Torch_DIR)
  execute_process(
    COMMAND ${RLHF_PYTHON} -c "import torch.utils; print(torch.utils.cmake_prefix_path)"
    OUTPUT_VARIABLE RLHF_TORCH_PREFIX OUTPUT_STRIP_TRAILING_WHITESPACE
    RESULT_VARIABLE torch_found ERROR_QUIET)
  if(NOT torch_found EQUAL 0)
    message(FATAL_ERROR "rlhf: ${RLHF_PYTHON} cannot import torch; run scripts/setup, or pass "
                        "-DRLHF_PYTHON=<python with torch ${RLHF_TORCH_VERSION}> or -DTorch_DIR=...")
  endif()
  list(APPEND CMAKE_PREFIX_PATH ${RLHF_TORCH_PREFIX})
endif()

# Without a GPU, torch's CUDA setup would target every architecture: A100 (8.0) and
# H100/H200 (9.0) are the ones we run on. Only CUDA sources of our own use this.
if(NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
  set(ENV{TORCH_CUDA_ARCH_LIST} "8.0;9.0")
endif()
set(RLHF_CUDA_ARCH_LIST "$ENV{TORCH_CUDA_ARCH_LIST}")
find_package(Torch REQUIRED)
if(NOT Torch_VERSION VERSION_GREATER_EQUAL RLHF_TORCH_VERSION OR
   Torch_VERSION VERSION_GREATER_EQUAL "${RLHF_TORCH_VERSION}.999")
  message(FATAL_ERROR "rlhf: needs torch ${RLHF_TORCH_VERSION}.x (LibTorch's C++ ABI changes "
                      "between minor versions), found ${Torch_VERSION} at ${Torch_DIR}")
endif()
# c10d's ProcessGroupGloo.hpp includes gloo's headers, which the wheel does not ship:
# Debian's libgloo-dev provides them (headers only; the gloo code is inside libtorch_cpu).
find_path(GLOO_INCLUDE_DIR gloo/algorithm.h)
if(NOT GLOO_INCLUDE_DIR)
  message(FATAL_ERROR "rlhf: gloo headers not found (apt-get install libgloo-dev)")
endif()

# The driver stub libcuda.so must not become a run-time dependency: the binary and the
# tests start on machines without an NVIDIA driver. torch's own targets keep torch_cpu and
# torch_cuda with --no-as-needed (their static initialisers register the kernels).
add_link_options(LINKER:--as-needed)
# The torch wheel is built with a devtoolset GCC whose libstdc++_nonshared.a pieces
# (std::filesystem, std::chrono::tzdb, ...) libtorch.so and libtorch_cpu.so export. Symbols
# resolve in NEEDED order, and libstdc++ would come last: std::filesystem::remove_all then
# bound to libtorch.so's copy and crashed (a null call). libstdc++ goes first in NEEDED.
add_link_options(LINKER:--push-state,--no-as-needed -lstdc++ LINKER:--pop-state)

# --- Debian packages -----------------------------------------------------------------------
find_package(cppzmq REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
find_package(Boost 1.74 REQUIRED COMPONENTS filesystem)
find_package(Threads REQUIRED)

# --- NCCL ----------------------------------------------------------------------------------
# Compiled wherever nccl.h/libnccl are found (the CUDA toolkit here; the nvidia-nccl wheel
# beside a pip torch on a GPU machine); only run on a GPU.
# AUTO (default) turns it on when found; ON requires it; OFF skips the NCCL code paths.
set(RLHF_WITH_NCCL AUTO CACHE STRING "Compile the NCCL collective backend (AUTO, ON, OFF)")
set_property(CACHE RLHF_WITH_NCCL PROPERTY STRINGS AUTO ON OFF)
set(RLHF_HAVE_NCCL OFF)
if(NOT RLHF_WITH_NCCL STREQUAL "OFF")
  get_filename_component(torch_site ${TORCH_INSTALL_PREFIX} DIRECTORY)
  find_package(CUDAToolkit QUIET)
  find_path(NCCL_INCLUDE_DIR nccl.h
    HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include /usr/include
          ${torch_site}/nvidia/nccl/include)
  find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2
    HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib /usr/local/cuda/lib64
          ${torch_site}/nvidia/nccl/lib)
  if(CUDAToolkit_FOUND AND NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
    set(RLHF_HAVE_NCCL ON)
    add_library(rlhf_nccl INTERFACE)
    target_include_directories(rlhf_nccl SYSTEM INTERFACE ${NCCL_INCLUDE_DIR})
    target_link_libraries(rlhf_nccl INTERFACE ${NCCL_LIBRARY} CUDA::cudart)
    target_compile_definitions(rlhf_nccl INTERFACE RLHF_HAVE_NCCL=1)
  elseif(RLHF_WITH_NCCL STREQUAL "ON")
    message(FATAL_ERROR "RLHF_WITH_NCCL=ON but the CUDA toolkit or NCCL was not found")
  endif()
endif()
message(STATUS "rlhf: torch ${Torch_VERSION} (${RLHF_PYTHON}), CUDA ${CUDAToolkit_VERSION}, "
               "arch ${RLHF_CUDA_ARCH_LIST}, NCCL backend: ${RLHF_HAVE_NCCL}")
