# Helpers that give every rlhf target the same warnings, include root and torch PCH.

set(RLHF_WARNINGS -Wall -Wextra -Wno-unused-parameter)  # torch's headers trip unused-parameter

# One precompiled torch header, built once and reused by every torch target
# (REUSE_FROM needs identical flags: keep per-target -D options out of torch targets).
add_library(rlhf_torch_pch OBJECT ${CMAKE_CURRENT_LIST_DIR}/torch_pch.cpp)
target_link_libraries(rlhf_torch_pch PUBLIC ${TORCH_LIBRARIES})
target_compile_options(rlhf_torch_pch PRIVATE ${RLHF_WARNINGS})
target_precompile_headers(rlhf_torch_pch PRIVATE ${CMAKE_CURRENT_LIST_DIR}/torch_pch.h)

# rlhf_library(NAME SOURCES ... [TORCH] [DEPS ...]): library rlhf_NAME rooted at the repo.
function(rlhf_library name)
  cmake_parse_arguments(ARG "TORCH" "" "SOURCES;DEPS" ${ARGN})
  add_library(rlhf_${name} STATIC ${ARG_SOURCES})
  target_include_directories(rlhf_${name} PUBLIC ${PROJECT_SOURCE_DIR})
  target_compile_options(rlhf_${name} PRIVATE ${RLHF_WARNINGS})
  target_link_libraries(rlhf_${name} PUBLIC ${ARG_DEPS})
  if(ARG_TORCH)
    target_link_libraries(rlhf_${name} PUBLIC ${TORCH_LIBRARIES})
    target_precompile_headers(rlhf_${name} REUSE_FROM rlhf_torch_pch)
  endif()
endfunction()

# rlhf_test(FOLDER SOURCES ... [TORCH] [DEPS ...]): GoogleTest binary rlhf_FOLDER_tests.
# Tests needing a GPU are named *_CUDA and skip themselves without one.
function(rlhf_test folder)
  cmake_parse_arguments(ARG "TORCH" "" "SOURCES;DEPS" ${ARGN})
  set(target rlhf_${folder}_tests)
  add_executable(${target} ${ARG_SOURCES})
  target_include_directories(${target} PRIVATE ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR}/tests)
  target_compile_options(${target} PRIVATE ${RLHF_WARNINGS})
  target_link_libraries(${target} PRIVATE ${ARG_DEPS} GTest::gtest GTest::gtest_main)
  if(ARG_TORCH)
    target_link_libraries(${target} PRIVATE ${TORCH_LIBRARIES})
    target_precompile_headers(${target} REUSE_FROM rlhf_torch_pch)
  endif()
  gtest_discover_tests(${target} DISCOVERY_TIMEOUT 120
    PROPERTIES LABELS ${folder} ENVIRONMENT "OMP_NUM_THREADS=1")
endfunction()
