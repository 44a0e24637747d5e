// Reading a Parquet dataset (what Hugging Face `datasets` and veRL write) as JSON rows, the
// shape JSONL rows have, so one prompt loader serves both. Reads; never writes or filters.
//
// Reader choice: Apache Arrow's C++ library (libarrow + libparquet) from the pinned `pyarrow`
// wheel, found through RLHF_PYTHON as LibTorch is (data/CMakeLists.txt). It reads every
// encoding, codec (snappy, zstd, gzip, brotli, lz4) and nested type writers produce; Debian 12
// packages no Arrow, and a decoder of our own (Thrift footer, Dremel repetition/definition
// levels, codecs) would be a large second implementation of it. ABI: pyarrow 22.0.0's
// manylinux_2_28 libraries use the C++11 std::string ABI (_GLIBCXX_USE_CXX11_ABI=1: they export
// arrow::io::ReadableFile::Open(std::__cxx11::basic_string const&)), as torch 2.11 does, need
// GLIBCXX <= 3.4.22 and export no symbol libtorch defines (only identical std template
// instantiations), so they link directly. 22.0.0 is pinned because Arrow 23+ headers need C++20.
// The libraries are versioned only (libarrow.so.2200): linked by full path, their directory in
// the RPATH. Built without pyarrow (RLHF_WITH_PARQUET), the reader throws saying so.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace rlhf::data {

// Every row of the Parquet file at `path`, in file order, as a JSON object {column: value}.
// Strings, integers, floats, bools and nulls map to their JSON kinds; lists (e.g. a chat
// `messages` list of {role, content} structs) to arrays; structs and maps with string keys
// to objects; dictionary-encoded columns to their values; all recursively.
// Reads the first `max_rows` rows when max_rows > 0, else all.
// Throws InputError naming the file and what is wrong: it cannot be opened, it is not a
// Parquet file or is damaged, or a column has a type not converted above (named with its
// Arrow type, e.g. "column 'image' has Arrow type binary"), or rlhf was built without Arrow.
std::vector<nlohmann::json> read_parquet_rows(const std::string& path, int64_t max_rows = 0);

// True when rlhf was built with Arrow (pyarrow found at configure time, RLHF_WITH_PARQUET).
bool parquet_reader_available();

}  // namespace rlhf::data
