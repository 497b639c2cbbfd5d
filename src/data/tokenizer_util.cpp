#include "data/tokenizer_util.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <unistd.h>
#include <zstd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "core/error.h"

namespace olmosft::tok {

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("cannot open ", path);
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) fail("error reading ", path);
  return ss.str();
}

std::string read_zstd_file(const std::string& path) {
  std::string in = read_file(path);
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

std::string sha256_hex(std::string_view data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (!EVP_Digest(data.data(), data.size(), md, &len, EVP_sha256(), nullptr)) fail("SHA-256 failed");
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (unsigned int i = 0; i < len; ++i) {
    s += hex[md[i] >> 4];
    s += hex[md[i] & 15];
  }
  return s;
}

void write_file_atomic(const std::string& path, std::string_view data) {
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) fail("cannot create ", tmp, ": ", std::strerror(errno));
  size_t off = 0;
  while (off < data.size()) {
    ssize_t w = ::write(fd, data.data() + off, data.size() - off);
    if (w < 0) {
      if (errno == EINTR) continue;
      int e = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      fail("write to ", tmp, " failed: ", std::strerror(e));
    }
    off += static_cast<size_t>(w);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    ::unlink(tmp.c_str());
    fail("fsync/close of ", tmp, " failed: ", std::strerror(errno));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    int e = errno;
    ::unlink(tmp.c_str());
    fail("rename ", tmp, " -> ", path, " failed: ", std::strerror(e));
  }
}

}  // namespace olmosft::tok
