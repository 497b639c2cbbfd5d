#include "data/parquet_input.h"

#include <arrow/api.h>
#include <arrow/io/file.h>
#include <arrow/util/utf8.h>
#include <parquet/arrow/reader.h>
#include <parquet/arrow/schema.h>
#include <parquet/exception.h>

#include <algorithm>
#include <mutex>

#include "core/error.h"

namespace olmosft {

std::string arrow_version() { return ARROW_VERSION_STRING; }

namespace {
using nlohmann::json;

json value(const arrow::Array& a, int64_t i);

json list_items(const arrow::Array& values, int64_t off, int64_t len) {
  json out = json::array();
  for (int64_t j = 0; j < len; ++j) out.push_back(value(values, off + j));
  return out;
}

json string_value(std::string_view s) {
  if (!arrow::util::ValidateUTF8(s)) fail("a string value is not valid UTF8");
  return json(std::string(s));
}

template <class T>
json number(const arrow::Array& a, int64_t i) {
  return json(static_cast<const T&>(a).Value(i));
}

json map_value(const arrow::MapArray& m, int64_t i) {
  const int64_t off = m.value_offset(i), len = m.value_length(i);
  const bool string_keys = m.keys()->type_id() == arrow::Type::STRING;
  json out = string_keys ? json::object() : json::array();
  for (int64_t j = 0; j < len; ++j) {
    json k = value(*m.keys(), off + j), v = value(*m.items(), off + j);
    if (string_keys) {
      out[k.get<std::string>()] = std::move(v);
    } else {
      out.push_back(json::array({std::move(k), std::move(v)}));
    }
  }
  return out;
}

// Row i of `a` as JSON. Types without a natural JSON form (dates, decimals, ...) become Arrow's text.
json value(const arrow::Array& a, int64_t i) {
  using T = arrow::Type;
  if (a.type_id() == T::NA || a.IsNull(i)) return nullptr;
  switch (a.type_id()) {
    case T::BOOL:
      return static_cast<const arrow::BooleanArray&>(a).Value(i);
    case T::INT8:
      return number<arrow::Int8Array>(a, i);
    case T::INT16:
      return number<arrow::Int16Array>(a, i);
    case T::INT32:
      return number<arrow::Int32Array>(a, i);
    case T::INT64:
      return number<arrow::Int64Array>(a, i);
    case T::UINT8:
      return number<arrow::UInt8Array>(a, i);
    case T::UINT16:
      return number<arrow::UInt16Array>(a, i);
    case T::UINT32:
      return number<arrow::UInt32Array>(a, i);
    case T::UINT64:
      return number<arrow::UInt64Array>(a, i);
    case T::FLOAT:
      return number<arrow::FloatArray>(a, i);
    case T::DOUBLE:
      return number<arrow::DoubleArray>(a, i);
    case T::STRING:
    case T::BINARY:
      return string_value(static_cast<const arrow::BinaryArray&>(a).GetView(i));
    case T::LARGE_STRING:
    case T::LARGE_BINARY:
      return string_value(static_cast<const arrow::LargeBinaryArray&>(a).GetView(i));
    case T::STRING_VIEW:
    case T::BINARY_VIEW:
      return string_value(static_cast<const arrow::BinaryViewArray&>(a).GetView(i));
    case T::LIST: {
      const auto& l = static_cast<const arrow::ListArray&>(a);
      return list_items(*l.values(), l.value_offset(i), l.value_length(i));
    }
    case T::LARGE_LIST: {
      const auto& l = static_cast<const arrow::LargeListArray&>(a);
      return list_items(*l.values(), l.value_offset(i), l.value_length(i));
    }
    case T::FIXED_SIZE_LIST: {
      const auto& l = static_cast<const arrow::FixedSizeListArray&>(a);
      return list_items(*l.values(), l.value_offset(i), l.value_length(i));
    }
    case T::STRUCT: {
      const auto& s = static_cast<const arrow::StructArray&>(a);
      json out = json::object();
      for (int k = 0; k < s.num_fields(); ++k) out[s.type()->field(k)->name()] = value(*s.field(k), i);
      return out;
    }
    case T::MAP:
      return map_value(static_cast<const arrow::MapArray&>(a), i);
    case T::DICTIONARY: {
      const auto& d = static_cast<const arrow::DictionaryArray&>(a);
      return value(*d.dictionary(), d.GetValueIndex(i));
    }
    default: {
      auto s = a.GetScalar(i);
      OLMO_CHECK(s.ok(), "cannot read a value of type ", a.type()->ToString(), ": ", s.status().ToString());
      return (*s)->ToString();
    }
  }
}

template <class R>
auto check_result(R&& r, const std::string& what) {
  if (!r.ok()) fail(what, ": ", r.status().ToString());
  return std::move(r).ValueOrDie();
}

void leaves(const parquet::arrow::SchemaField& f, std::vector<int>& out) {
  if (f.column_index >= 0) out.push_back(f.column_index);
  for (const auto& c : f.children) leaves(c, out);
}

bool list_type(arrow::Type::type t) {
  using T = arrow::Type;
  return t == T::LIST || t == T::LARGE_LIST || t == T::FIXED_SIZE_LIST || t == T::LIST_VIEW ||
         t == T::LARGE_LIST_VIEW;
}
}  // namespace

struct ParquetInput::Impl {
  std::unique_ptr<parquet::arrow::FileReader> reader;
  std::shared_ptr<arrow::Schema> schema;
  std::unique_ptr<arrow::RecordBatchReader> batches;
  std::vector<std::string> selected;  // names being read, in the batches' column order
};

ParquetInput::ParquetInput(const std::string& path) : impl_(std::make_unique<Impl>()), path_(path) {
  static std::once_flag utf8_tables;
  std::call_once(utf8_tables, [] { arrow::util::InitializeUTF8(); });  // ValidateUTF8's lookup tables
  const std::string what = "input " + path;
  auto file = check_result(arrow::io::ReadableFile::Open(path), what);
  try {
    impl_->reader = check_result(parquet::arrow::OpenFile(file, arrow::default_memory_pool()), what);
    auto st = impl_->reader->GetSchema(&impl_->schema);
    if (!st.ok()) fail(what, ": ", st.ToString());
    num_rows_ = impl_->reader->parquet_reader()->metadata()->num_rows();
  } catch (const parquet::ParquetException& e) {
    fail(what, ": ", e.what());
  }
  for (const auto& f : impl_->schema->fields()) columns_.emplace_back(f->name(), f->type()->ToString());
}

ParquetInput::~ParquetInput() = default;

bool ParquetInput::has(const std::string& name) const { return impl_->schema->GetFieldIndex(name) >= 0; }

bool ParquetInput::is_list(const std::string& name) const {
  auto f = impl_->schema->GetFieldByName(name);
  return f && list_type(f->type()->id());
}

bool ParquetInput::next(const std::vector<std::string>& names, int64_t batch_rows,
                        std::vector<nlohmann::json>& rows) {
  const std::string what = "input " + path_;
  if (!impl_->batches) {
    // Parquet column indices are LEAF indices: list every leaf of each requested top-level field.
    std::vector<int> cols;
    const auto& fields = impl_->reader->manifest().schema_fields;
    for (size_t k = 0; k < fields.size(); ++k) {
      const std::string& n = impl_->schema->field(static_cast<int>(k))->name();
      if (std::find(names.begin(), names.end(), n) == names.end()) continue;
      leaves(fields[k], cols);
      impl_->selected.push_back(n);
    }
    impl_->reader->set_batch_size(std::max<int64_t>(1, batch_rows));
    impl_->reader->set_use_threads(true);
    std::vector<int> groups(static_cast<size_t>(impl_->reader->num_row_groups()));
    for (size_t g = 0; g < groups.size(); ++g) groups[g] = static_cast<int>(g);
    try {
      impl_->batches = check_result(impl_->reader->GetRecordBatchReader(groups, cols), what);
    } catch (const parquet::ParquetException& e) {
      fail(what, ": ", e.what());
    }
  }
  std::shared_ptr<arrow::RecordBatch> b;
  try {
    auto st = impl_->batches->ReadNext(&b);
    if (!st.ok()) fail(what, " (after row ", rows_read_, "): ", st.ToString());
  } catch (const parquet::ParquetException& e) {
    fail(what, " (after row ", rows_read_, "): ", e.what());
  }
  if (!b) return false;
  const int64_t n = b->num_rows(), base = static_cast<int64_t>(rows.size());
  rows.resize(static_cast<size_t>(base + n));
  std::vector<std::string> errors(static_cast<size_t>(n));
#pragma omp parallel for schedule(dynamic, 64)
  for (int64_t r = 0; r < n; ++r) {
    json row = json::object();
    for (int c = 0; c < b->num_columns(); ++c) {
      try {
        row[b->schema()->field(c)->name()] = value(*b->column(c), r);
      } catch (const std::exception& e) {
        errors[r] = "column '" + b->schema()->field(c)->name() + "': " + e.what();
        break;
      }
    }
    rows[static_cast<size_t>(base + r)] = std::move(row);
  }
  for (int64_t r = 0; r < n; ++r) {
    if (!errors[r].empty()) fail(what, ", row ", rows_read_ + r, ": ", errors[r]);
  }
  rows_read_ += n;
  return true;
}

}  // namespace olmosft
