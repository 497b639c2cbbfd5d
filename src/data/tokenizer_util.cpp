#include "data/tokenizer_util.h"

#include <fcntl.h>
#include <unistd.h>
#include <zstd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "io/atomic_file.h"

namespace olmosft::tok {

std::string read_zstd_file(const std::string& path) {
  std::string in = io::read_file(path);
  ZSTD_DCtx* dctx = ZSTD_createDCtx();
  std::string out;
  std::vector<char> buf(ZSTD_DStreamOutSize());
  ZSTD_inBuffer ib{in.data(), in.size(), 0};
  size_t last = 0;
  while (ib.pos < ib.size) {
    ZSTD_outBuffer ob{buf.data(), buf.size(), 0};
    last = ZSTD_decompressStream(dctx, &ob, &ib);
    if (ZSTD_isError(last)) {
      std::string msg = ZSTD_getErrorName(last);
      ZSTD_freeDCtx(dctx);
      fail(path, ": zstd decompression failed: ", msg);
    }
    out.append(buf.data(), ob.pos);
  }
  ZSTD_freeDCtx(dctx);
  if (last != 0) fail(path, ": truncated zstd stream");
  return out;
}

}  // namespace olmosft::tok
