// The subset of DuckDB's C API (duckdb.h, v1.5.x — the version of libduckdb.so shipped by the npm package
// @duckdb/node-bindings-linux-x64 1.5.6-r.1) that olmosft uses. No header ships with that package, so the
// declarations below restate duckdb.h's for exactly these functions and types; they must keep its ABI
// (struct layouts, enum values, by-value/by-pointer arguments). See https://duckdb.org/docs/api/c/api.
#pragma once
#include <cstdint>

extern "C" {

typedef uint64_t idx_t;
typedef enum { DuckDBSuccess = 0, DuckDBError = 1 } duckdb_state;
// duckdb_type values used here (duckdb.h DUCKDB_TYPE enum).
typedef int32_t duckdb_type;
enum : int32_t { DUCKDB_TYPE_VARCHAR = 17, DUCKDB_TYPE_LIST = 24, DUCKDB_TYPE_STRUCT = 25 };

typedef struct _duckdb_database {
  void* internal_ptr;
} * duckdb_database;
typedef struct _duckdb_connection {
  void* internal_ptr;
} * duckdb_connection;
typedef struct _duckdb_prepared_statement {
  void* internal_ptr;
} * duckdb_prepared_statement;
typedef struct _duckdb_data_chunk {
  void* internal_ptr;
} * duckdb_data_chunk;
typedef struct _duckdb_vector {
  void* internal_ptr;
} * duckdb_vector;

typedef struct {
  void* deprecated_data;
  bool* deprecated_nullmask;
  duckdb_type deprecated_type;
  char* deprecated_name;
  void* internal_data;
} duckdb_column;

// Passed by value to duckdb_fetch_chunk: the layout must match duckdb.h exactly (48 bytes on x86-64).
typedef struct {
  idx_t deprecated_column_count;
  idx_t deprecated_row_count;
  idx_t deprecated_rows_changed;
  duckdb_column* deprecated_columns;
  char* deprecated_error_message;
  void* internal_data;
} duckdb_result;

// VARCHAR vector element: strings of <= 12 bytes are inlined, longer ones point to the chunk's heap.
typedef struct {
  union {
    struct {
      uint32_t length;
      char prefix[4];
      char* ptr;
    } pointer;
    struct {
      uint32_t length;
      char inlined[12];
    } inlined;
  } value;
} duckdb_string_t;

const char* duckdb_library_version();
duckdb_state duckdb_open(const char* path, duckdb_database* out_database);
void duckdb_close(duckdb_database* database);
duckdb_state duckdb_connect(duckdb_database database, duckdb_connection* out_connection);
void duckdb_disconnect(duckdb_connection* connection);

duckdb_state duckdb_query(duckdb_connection connection, const char* query, duckdb_result* out_result);
void duckdb_destroy_result(duckdb_result* result);
const char* duckdb_result_error(duckdb_result* result);
idx_t duckdb_column_count(duckdb_result* result);
const char* duckdb_column_name(duckdb_result* result, idx_t col);
duckdb_type duckdb_column_type(duckdb_result* result, idx_t col);

duckdb_state duckdb_prepare(duckdb_connection connection, const char* query,
                            duckdb_prepared_statement* out_prepared_statement);
const char* duckdb_prepare_error(duckdb_prepared_statement prepared_statement);
void duckdb_destroy_prepare(duckdb_prepared_statement* prepared_statement);
duckdb_state duckdb_execute_prepared_streaming(duckdb_prepared_statement prepared_statement,
                                               duckdb_result* out_result);

duckdb_data_chunk duckdb_fetch_chunk(duckdb_result result);
idx_t duckdb_data_chunk_get_size(duckdb_data_chunk chunk);
duckdb_vector duckdb_data_chunk_get_vector(duckdb_data_chunk chunk, idx_t col_idx);
void* duckdb_vector_get_data(duckdb_vector vector);
uint64_t* duckdb_vector_get_validity(duckdb_vector vector);
void duckdb_destroy_data_chunk(duckdb_data_chunk* chunk);

}  // extern "C"

static_assert(sizeof(duckdb_result) == 48, "duckdb_result layout must match duckdb.h");
static_assert(sizeof(duckdb_string_t) == 16, "duckdb_string_t layout must match duckdb.h");
