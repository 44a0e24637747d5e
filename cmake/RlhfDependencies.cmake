# Every dependency comes from a Debian package (scripts/setup installs them).
find_package(Torch REQUIRED)
find_package(cppzmq REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
find_package(Boost 1.74 REQUIRED COMPONENTS filesystem)
find_package(Threads REQUIRED)

# NCCL: compiled wherever the CUDA toolkit ships nccl.h/libnccl; only run on a GPU.
# AUTO (default) turns it on when found; ON requires it; OFF skips the NCCL code paths.
set(RLHF_WITH_NCCL AUTO CACHE STRING "Compile the NCCL collective backend (AUTO, ON, OFF)")
set_property(CACHE RLHF_WITH_NCCL PROPERTY STRINGS AUTO ON OFF)
set(RLHF_HAVE_NCCL OFF)
if(NOT RLHF_WITH_NCCL STREQUAL "OFF")
  find_package(CUDAToolkit QUIET)
  find_path(NCCL_INCLUDE_DIR nccl.h
    HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include /usr/include)
  find_library(NCCL_LIBRARY nccl
    HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib /usr/local/cuda/lib64)
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
message(STATUS "rlhf: torch ${Torch_VERSION}, NCCL backend: ${RLHF_HAVE_NCCL}")
