// Parquet -> JSON rows through Arrow's parquet::arrow::FileReader: the file is read in record
// batches (a row group at most per batch), each cell converted by its Arrow type.
#include "data/parquet_reader.h"

#include "core/errors.h"

#if RLHF_HAVE_PARQUET
#include <arrow/api.h>
#include <arrow/io/file.h>
#include <parquet/arrow/reader.h>
#include <parquet/exception.h>

#include <algorithm>
#endif

namespace rlhf::data {

#if RLHF_HAVE_PARQUET
namespace {

using nlohmann::json;

constexpr int64_t kBatchRows = 64 * 1024;  // Arrow's default batch size

// The part of `type` read_parquet_rows cannot convert, as Arrow names it; "" when every
// value of `type` converts (the kinds of to_json below).
std::string unsupported_part(const arrow::DataType& type) {
  switch (type.id()) {
    case arrow::Type::NA:
    case arrow::Type::BOOL:
    case arrow::Type::INT8:
    case arrow::Type::INT16:
    case arrow::Type::INT32:
    case arrow::Type::INT64:
    case arrow::Type::UINT8:
    case arrow::Type::UINT16:
    case arrow::Type::UINT32:
    case arrow::Type::UINT64:
    case arrow::Type::FLOAT:
    case arrow::Type::DOUBLE:
    case arrow::Type::STRING:
    case arrow::Type::LARGE_STRING:
    case arrow::Type::STRING_VIEW:
      return "";
    case arrow::Type::LIST:
    case arrow::Type::LARGE_LIST:
    case arrow::Type::FIXED_SIZE_LIST:
    case arrow::Type::STRUCT:
      for (const auto& field : type.fields()) {
        std::string part = unsupported_part(*field->type());
        if (!part.empty()) return part;
      }
      return "";
    case arrow::Type::MAP: {
      const auto& map = static_cast<const arrow::MapType&>(type);
      const auto key = map.key_type()->id();
      if (key != arrow::Type::STRING && key != arrow::Type::LARGE_STRING &&
          key != arrow::Type::STRING_VIEW) {
        return type.ToString() + " (JSON object keys must be strings)";
      }
      return unsupported_part(*map.item_type());
    }
    case arrow::Type::DICTIONARY:
      return unsupported_part(*static_cast<const arrow::DictionaryType&>(type).value_type());
    default:
      return type.ToString();
  }
}

template <typename ArrayType>
json scalar(const arrow::Array& array, int64_t i) {
  return static_cast<const ArrayType&>(array).Value(i);
}

template <typename ArrayType>
json text(const arrow::Array& array, int64_t i) {
  return std::string(static_cast<const ArrayType&>(array).GetView(i));
}

json to_json(const arrow::Array& array, int64_t i);

// Element i of a list array (offsets index into values(), which is not sliced).
template <typename ListArrayType>
json list(const arrow::Array& array, int64_t i) {
  const auto& lists = static_cast<const ListArrayType&>(array);
  json out = json::array();
  const int64_t begin = lists.value_offset(i);
  const int64_t end = begin + lists.value_length(i);
  for (int64_t k = begin; k < end; ++k) out.push_back(to_json(*lists.values(), k));
  return out;
}

// Row i of `array`, whose type unsupported_part() accepted.
json to_json(const arrow::Array& array, int64_t i) {
  if (array.IsNull(i)) return nullptr;
  switch (array.type_id()) {
    case arrow::Type::BOOL:
      return scalar<arrow::BooleanArray>(array, i);
    case arrow::Type::INT8:
      return scalar<arrow::Int8Array>(array, i);
    case arrow::Type::INT16:
      return scalar<arrow::Int16Array>(array, i);
    case arrow::Type::INT32:
      return scalar<arrow::Int32Array>(array, i);
    case arrow::Type::INT64:
      return scalar<arrow::Int64Array>(array, i);
    case arrow::Type::UINT8:
      return scalar<arrow::UInt8Array>(array, i);
    case arrow::Type::UINT16:
      return scalar<arrow::UInt16Array>(array, i);
    case arrow::Type::UINT32:
      return scalar<arrow::UInt32Array>(array, i);
    case arrow::Type::UINT64:
      return scalar<arrow::UInt64Array>(array, i);
    case arrow::Type::FLOAT:
      return scalar<arrow::FloatArray>(array, i);
    case arrow::Type::DOUBLE:
      return scalar<arrow::DoubleArray>(array, i);
    case arrow::Type::STRING:
      return text<arrow::StringArray>(array, i);
    case arrow::Type::LARGE_STRING:
      return text<arrow::LargeStringArray>(array, i);
    case arrow::Type::STRING_VIEW:
      return text<arrow::StringViewArray>(array, i);
    case arrow::Type::LIST:
      return list<arrow::ListArray>(array, i);
    case arrow::Type::LARGE_LIST:
      return list<arrow::LargeListArray>(array, i);
    case arrow::Type::FIXED_SIZE_LIST:
      return list<arrow::FixedSizeListArray>(array, i);
    case arrow::Type::STRUCT: {
      // field(k) is the child sliced to this array's offset: it shares the row index.
      const auto& structs = static_cast<const arrow::StructArray&>(array);
      json out = json::object();
      for (int k = 0; k < structs.num_fields(); ++k) {
        out[structs.struct_type()->field(k)->name()] = to_json(*structs.field(k), i);
      }
      return out;
    }
    case arrow::Type::MAP: {
      // Entries are (key, item) structs; through StructArray::field, which honours the
      // entries' own offset (MapArray::keys() does not).
      const auto& maps = static_cast<const arrow::MapArray&>(array);
      const auto& entries = static_cast<const arrow::StructArray&>(*maps.values());
      const auto keys = entries.field(0);
      const auto items = entries.field(1);
      json out = json::object();
      const int64_t begin = maps.value_offset(i);
      const int64_t end = begin + maps.value_length(i);
      for (int64_t k = begin; k < end; ++k) {
        out[to_json(*keys, k).get<std::string>()] = to_json(*items, k);
      }
      return out;
    }
    case arrow::Type::DICTIONARY: {
      const auto& dict = static_cast<const arrow::DictionaryArray&>(array);
      return to_json(*dict.dictionary(), dict.GetValueIndex(i));
    }
    default:  // NA (all null) and nothing else: unsupported_part() refused the rest
      return nullptr;
  }
}

// InputError "PATH: WHAT: <Arrow's message and detail (e.g. the errno)>" unless `status` is OK.
void check(const arrow::Status& status, const std::string& path, const std::string& what) {
  if (status.ok()) return;
  std::string message = status.message();
  if (status.detail()) message += " (" + status.detail()->ToString() + ")";
  throw InputError(path + ": " + what + ": " + message);
}

std::vector<json> read_rows(const std::string& path, int64_t max_rows) {
  auto file = arrow::io::ReadableFile::Open(path);
  check(file.status(), path, "cannot open the Parquet file");
  auto reader = parquet::arrow::OpenFile(*file, arrow::default_memory_pool());
  check(reader.status(), path, "not a readable Parquet file");
  std::shared_ptr<arrow::Schema> schema;
  check((*reader)->GetSchema(&schema), path, "cannot read the Parquet schema");
  for (const auto& field : schema->fields()) {
    const std::string part = unsupported_part(*field->type());
    if (!part.empty()) {
      throw InputError(path + ": column '" + field->name() + "' has Arrow type " +
                       field->type()->ToString() + ", which rlhf does not convert to JSON (" +
                       part + "); supported: strings, integers, floats, bools, lists, structs, " +
                       "maps with string keys, dictionary-encoded values of these");
    }
  }

  // A small max_rows decodes only the rows it needs from the first row group.
  (*reader)->set_batch_size(max_rows > 0 ? std::min(max_rows, kBatchRows) : kBatchRows);
  auto batches = (*reader)->GetRecordBatchReader();
  check(batches.status(), path, "cannot read the Parquet row groups");
  std::vector<json> rows;
  while (max_rows <= 0 || static_cast<int64_t>(rows.size()) < max_rows) {
    std::shared_ptr<arrow::RecordBatch> batch;
    check((*batches)->ReadNext(&batch), path, "cannot read Parquet rows");
    if (!batch) break;
    int64_t n = batch->num_rows();
    if (max_rows > 0) n = std::min(n, max_rows - static_cast<int64_t>(rows.size()));
    for (int64_t r = 0; r < n; ++r) {
      json row = json::object();
      for (int c = 0; c < batch->num_columns(); ++c) {
        row[batch->column_name(c)] = to_json(*batch->column(c), r);
      }
      rows.push_back(std::move(row));
    }
  }
  return rows;
}

}  // namespace

std::vector<nlohmann::json> read_parquet_rows(const std::string& path, int64_t max_rows) {
  try {
    return read_rows(path, max_rows);
  } catch (const parquet::ParquetException& e) {  // Arrow reports through Status, mostly
    throw InputError(path + ": not a readable Parquet file: " + e.what());
  }
}

bool parquet_reader_available() {
  return true;
}

#else  // built without pyarrow (data/CMakeLists.txt, RLHF_WITH_PARQUET)

std::vector<nlohmann::json> read_parquet_rows(const std::string& path, int64_t /*max_rows*/) {
  throw InputError(path + ": this rlhf was built without Parquet support (RLHF_PYTHON had no " +
                   "pyarrow of the version scripts/python-requirements.txt pins at configure " +
                   "time: run scripts/setup and configure again), or convert it to JSONL");
}

bool parquet_reader_available() {
  return false;
}

#endif

}  // namespace rlhf::data
