// The job's key-value store over TCP (kv_store.h).
#include "dist/kv_store.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "core/error.h"

namespace olmosft::dist {

namespace {
constexpr uint32_t kMaxBytes = 64u << 20;
enum Status : uint8_t { kValue = 0, kAbsent = 1, kRefused = 2 };

// A socket closed when it goes out of scope.
struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

std::string err_text() { return std::strerror(errno); }

// Whole buffers over a blocking socket (its SO_RCVTIMEO / SO_SNDTIMEO bound each call); false on a closed
// connection, a timeout or an error.
bool send_all(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t k = ::send(fd, c, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    c += k, n -= size_t(k);
  }
  return true;
}
bool recv_all(int fd, void* p, size_t n) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t k = ::recv(fd, c, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    c += k, n -= size_t(k);
  }
  return true;
}
std::string u32_bytes(uint32_t v) {
  const char b[4] = {char(v & 0xff), char((v >> 8) & 0xff), char((v >> 16) & 0xff), char((v >> 24) & 0xff)};
  return std::string(b, 4);
}
bool recv_u32(int fd, uint32_t& v) {
  unsigned char b[4];
  if (!recv_all(fd, b, 4)) return false;
  v = uint32_t(b[0]) | uint32_t(b[1]) << 8 | uint32_t(b[2]) << 16 | uint32_t(b[3]) << 24;
  return true;
}
// A length-prefixed string of at most kMaxBytes.
bool recv_str(int fd, std::string& s) {
  uint32_t n = 0;
  if (!recv_u32(fd, n) || n > kMaxBytes) return false;
  s.resize(n);
  return n == 0 || recv_all(fd, s.data(), n);
}
std::string str_bytes(const std::string& s) { return u32_bytes(uint32_t(s.size())) + s; }
void set_timeout(int fd, std::chrono::milliseconds t) {
  timeval tv{};
  tv.tv_sec = time_t(t.count() / 1000);
  tv.tv_usec = suseconds_t((t.count() % 1000) * 1000);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}
}  // namespace

std::pair<std::string, int> parse_kv_address(const std::string& address) {
  const size_t colon = address.rfind(':');
  OLMO_CHECK(colon != std::string::npos && colon > 0 && colon + 1 < address.size(), "kv store address `",
             address, "`: expected host:port");
  const std::string host = address.substr(0, colon), port = address.substr(colon + 1);
  OLMO_CHECK(port.find_first_not_of("0123456789") == std::string::npos && port.size() <= 5,
             "kv store address `", address, "`: port `", port, "` is not a number");
  const int p = std::stoi(port);
  OLMO_CHECK(p >= 1 && p <= 65535, "kv store address `", address, "`: port ", p, " is not in 1..65535");
  return {host, p};
}

// ------------------------------------------------------------------------------------------------ server

struct KvServer::State {
  int listen_fd = -1, port = 0;
  std::atomic<bool> stop{false};
  mutable std::mutex m;
  std::condition_variable changed;  // a put, or stop
  std::map<std::string, std::string> kv;
  int active = 0;  // connections being served
  std::condition_variable idle;
  std::thread acceptor;

  void reply(int fd, Status s, const std::string& body) {
    std::string out(1, char(s));
    if (s != kAbsent) out += str_bytes(body);
    send_all(fd, out.data(), out.size());
  }
  // KEY's value once it is put, waiting up to WAIT (0: a try-get); nullopt if not put in time or on stop.
  std::optional<std::string> lookup(const std::string& key, std::chrono::milliseconds wait) {
    std::unique_lock<std::mutex> l(m);
    changed.wait_for(l, wait, [&] { return stop.load() || kv.count(key) > 0; });
    const auto it = kv.find(key);
    return it == kv.end() ? std::nullopt : std::optional<std::string>(it->second);
  }
  void serve(int fd) {
    const Fd owned(fd);
    set_timeout(fd, std::chrono::milliseconds(10000));  // a request arrives at once after the connect
    char op = 0;
    std::string key, value;
    if (!recv_all(fd, &op, 1) || !recv_str(fd, key)) return;
    if (op == 'P') {
      if (!recv_str(fd, value)) return;
      {
        std::lock_guard<std::mutex> l(m);
        kv[key] = std::move(value);
      }
      changed.notify_all();
      return reply(fd, kValue, "");
    }
    if (op != 'G' && op != 'T') return reply(fd, kRefused, std::string("unknown request `") + op + "`");
    uint32_t ms = 0;
    if (op == 'G' && !recv_u32(fd, ms)) return;
    const std::optional<std::string> v = lookup(key, std::chrono::milliseconds(ms));
    reply(fd, v ? kValue : kAbsent, v.value_or(""));
  }
  void accept_loop(const std::shared_ptr<State>& self) {
    while (!stop.load()) {
      pollfd p{listen_fd, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      const int fd = ::accept(listen_fd, nullptr, nullptr);
      if (fd < 0) continue;
      {
        std::lock_guard<std::mutex> l(m);
        ++active;
      }
      std::thread([self, fd] {
        self->serve(fd);
        std::lock_guard<std::mutex> l(self->m);
        if (--self->active == 0) self->idle.notify_all();
      }).detach();
    }
  }
};

KvServer::KvServer(int port, const std::string& bind) : s_(std::make_shared<State>()) {
  OLMO_CHECK(port >= 0 && port <= 65535, "kv store: port ", port, " is not in 0..65535");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  OLMO_CHECK(::inet_pton(AF_INET, bind.c_str(), &a.sin_addr) == 1, "kv store: bind address `", bind,
             "` is not an IPv4 address");
  s_->listen_fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  OLMO_CHECK(s_->listen_fd >= 0, "kv store: socket: ", err_text());
  const int one = 1;
  ::setsockopt(s_->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(s_->listen_fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::listen(s_->listen_fd, 256) != 0) {
    const std::string why = err_text();
    ::close(s_->listen_fd);
    fail("kv store: cannot listen on ", bind, ":", port, ": ", why);
  }
  socklen_t len = sizeof a;
  ::getsockname(s_->listen_fd, reinterpret_cast<sockaddr*>(&a), &len);
  s_->port = ntohs(a.sin_port);
  s_->acceptor = std::thread([s = s_] { s->accept_loop(s); });
}

KvServer::~KvServer() {
  s_->stop = true;
  s_->changed.notify_all();
  s_->acceptor.join();
  std::unique_lock<std::mutex> l(s_->m);
  s_->idle.wait(l, [&] { return s_->active == 0; });
  l.unlock();
  ::close(s_->listen_fd);
}

int KvServer::port() const { return s_->port; }

size_t KvServer::keys() const {
  std::lock_guard<std::mutex> l(s_->m);
  return s_->kv.size();
}

// ------------------------------------------------------------------------------------------------ client

KvClient::KvClient(const std::string& address, KvClientOptions options) : address_(address), o_(options) {
  std::tie(host_, port_) = parse_kv_address(address);
}

namespace {
// A connected socket to HOST:PORT, retrying until DEADLINE (the server may not be up yet).
int connect_to(const std::string& address, const std::string& host, int port,
               std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  std::string why;
  for (;;) {
    addrinfo hints{}, *res = nullptr;
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
    if (rc == 0) {
      const int fd = ::socket(res->ai_family, res->ai_socktype | SOCK_CLOEXEC, res->ai_protocol);
      const bool ok = fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) == 0;
      why = ok ? "" : err_text();
      ::freeaddrinfo(res);
      if (ok) return fd;
      if (fd >= 0) ::close(fd);
    } else {
      why = ::gai_strerror(rc);
    }
    if (std::chrono::steady_clock::now() >= deadline)
      fail("kv store at ", address, ": no connection within ", limit.count(), " ms (", why,
           "): is the serving process (rank 0) up?");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}
}  // namespace

namespace {
// One call: connect, send REQUEST, read the status and (for a value or a refusal) its body; WAIT is how long
// the server may hold the reply (a get's timeout).
std::optional<std::string> kv_call(const std::string& address, const std::string& host, int port,
                                   const KvClientOptions& o, const std::string& request,
                                   std::chrono::milliseconds wait, const std::string& what) {
  const Fd fd(connect_to(address, host, port, o.connect_timeout));
  set_timeout(fd.fd, wait + o.reply_margin);
  OLMO_CHECK(send_all(fd.fd, request.data(), request.size()), "kv store at ", address, ": ", what,
             ": the request could not be sent (", err_text(), ")");
  char st = 0;
  OLMO_CHECK(recv_all(fd.fd, &st, 1), "kv store at ", address, ": ", what,
             ": no reply (the connection closed or timed out: did the serving process die?)");
  if (st == kAbsent) return std::nullopt;
  std::string body;
  OLMO_CHECK((st == kValue || st == kRefused) && recv_str(fd.fd, body), "kv store at ", address, ": ", what,
             ": a malformed reply");
  OLMO_CHECK(st == kValue, "kv store at ", address, ": ", what, ": refused: ", body);
  return body;
}
}  // namespace

std::optional<std::string> KvClient::get(const std::string& key, std::chrono::milliseconds timeout) {
  OLMO_CHECK(key.size() <= kMaxBytes, "kv store: key of ", key.size(), " bytes (at most 64 MiB)");
  const auto ms = std::max<int64_t>(0, std::min<int64_t>(timeout.count(), int64_t(UINT32_MAX)));
  const std::string req = std::string(1, 'G') + str_bytes(key) + u32_bytes(uint32_t(ms));
  return kv_call(address_, host_, port_, o_, req, std::chrono::milliseconds(ms), "get " + key);
}

std::optional<std::string> KvClient::try_get(const std::string& key) {
  OLMO_CHECK(key.size() <= kMaxBytes, "kv store: key of ", key.size(), " bytes (at most 64 MiB)");
  return kv_call(address_, host_, port_, o_, std::string(1, 'T') + str_bytes(key),
                 std::chrono::milliseconds(0), "try-get " + key);
}

void KvClient::put(const std::string& key, const std::string& value) {
  OLMO_CHECK(key.size() <= kMaxBytes && value.size() <= kMaxBytes, "kv store: put ", key,
             ": key or value over 64 MiB");
  const auto r = kv_call(address_, host_, port_, o_, std::string(1, 'P') + str_bytes(key) + str_bytes(value),
                         std::chrono::milliseconds(0), "put " + key);
  OLMO_CHECK(r.has_value(), "kv store at ", address_, ": put ", key, ": not stored");
}

}  // namespace olmosft::dist
