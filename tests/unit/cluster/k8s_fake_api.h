// A tiny HTTP/1.1 server for tests: loopback only (127.0.0.1, port chosen by the kernel), one thread per
// connection, one request per connection ("Connection: close"), bounded: at most kMaxConnections
// connections and a hard deadline, after which it stops by itself. Handlers return a plain response or a
// streaming one (chunked transfer encoding; a stream can end cleanly or drop the connection mid-chunk).
#pragma once
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace fakeapi {

struct Request {
  std::string method, path, query, body;
  std::map<std::string, std::string> headers;  // lowercase names
  std::string param(const std::string& k) const {
    size_t pos = 0;
    while (pos < query.size()) {
      size_t amp = query.find('&', pos);
      std::string kv = query.substr(pos, amp == std::string::npos ? std::string::npos : amp - pos);
      auto eq = kv.find('=');
      if (kv.substr(0, eq) == k) return eq == std::string::npos ? "" : unescape(kv.substr(eq + 1));
      if (amp == std::string::npos) break;
      pos = amp + 1;
    }
    return "";
  }
  bool has_param(const std::string& k) const {
    return ("&" + query).find("&" + k + "=") != std::string::npos ||
           ("&" + query + "&").find("&" + k + "&") != std::string::npos;
  }
  static std::string unescape(const std::string& s) {
    std::string o;
    for (size_t i = 0; i < s.size(); ++i) {
      if (s[i] == '%' && i + 2 < s.size()) {
        o += static_cast<char>(std::stoi(s.substr(i + 1, 2), nullptr, 16));
        i += 2;
      } else {
        o += s[i] == '+' ? ' ' : s[i];
      }
    }
    return o;
  }
};

// Writes a chunked body; returns false once the server is stopping or the client went away.
class Stream {
 public:
  Stream(int fd, const std::atomic<bool>& stop) : fd_(fd), stop_(stop) {}
  bool chunk(const std::string& data) {
    if (stop_ || data.empty()) return !stop_;
    char head[32];
    std::snprintf(head, sizeof head, "%zx\r\n", data.size());
    return send_all(head) && send_all(data) && send_all("\r\n");
  }
  bool stopping() const { return stop_; }
  void drop() { dropped_ = true; }  // close without the terminating chunk (a broken stream)
  bool dropped() const { return dropped_; }
  bool send_all(const std::string& s) {
    size_t off = 0;
    while (off < s.size()) {
      ssize_t n = ::send(fd_, s.data() + off, s.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return false;
      off += static_cast<size_t>(n);
    }
    return true;
  }

 private:
  int fd_;
  const std::atomic<bool>& stop_;
  bool dropped_ = false;
};

struct Response {
  Response() = default;
  Response(int s, std::string b) : status(s), body(std::move(b)) {}
  int status = 200;
  std::string body;
  std::string content_type = "application/json";
  std::function<void(Stream&)> stream;  // set: chunked streaming response
};

inline const char* reason_phrase(int s) {
  switch (s) {
    case 200:
      return "OK";
    case 201:
      return "Created";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 409:
      return "Conflict";
    case 410:
      return "Gone";
    case 415:
      return "Unsupported Media Type";
    default:
      return "Status";
  }
}

inline std::string status_body(int code, const std::string& reason, const std::string& message) {
  return R"({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":")" + message +
         R"(","reason":")" + reason + R"(","code":)" + std::to_string(code) + "}";
}

class Server {
 public:
  using Handler = std::function<Response(const Request&)>;
  static constexpr int kMaxConnections = 5000;

  explicit Server(Handler h, double max_seconds = 60) : handler_(std::move(h)) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd_, 64) != 0)
      throw std::runtime_error("fake api: cannot bind 127.0.0.1");
    socklen_t len = sizeof a;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    deadline_ =
        std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                               std::chrono::duration<double>(max_seconds));
    acceptor_ = std::thread([this] { accept_loop(); });
  }
  ~Server() { stop(); }

  void stop() {
    stop_ = true;
    if (acceptor_.joinable()) acceptor_.join();
    std::vector<std::thread> ts;
    {
      std::lock_guard<std::mutex> g(mu_);
      ts.swap(threads_);
    }
    for (auto& t : ts) t.join();
    if (fd_ >= 0) ::close(fd_), fd_ = -1;
  }
  int port() const { return port_; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  int connections() const { return connections_; }

 private:
  void accept_loop() {
    while (!stop_ && std::chrono::steady_clock::now() < deadline_ && connections_ < kMaxConnections) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) continue;
      ++connections_;
      std::lock_guard<std::mutex> g(mu_);
      threads_.emplace_back([this, c] { serve(c); });
    }
    stop_ = true;  // deadline or connection budget reached: the server stops by itself
  }

  void serve(int c) {
    timeval tv{5, 0};
    ::setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    std::string in;
    char buf[8192];
    size_t hdr_end;
    while ((hdr_end = in.find("\r\n\r\n")) == std::string::npos && in.size() < (1 << 20)) {
      ssize_t n = ::recv(c, buf, sizeof buf, 0);
      if (n <= 0) {
        ::close(c);
        return;
      }
      in.append(buf, static_cast<size_t>(n));
    }
    Request rq;
    {
      std::string head = in.substr(0, hdr_end);
      size_t line_end = head.find("\r\n");
      std::string first = head.substr(0, line_end);
      auto s1 = first.find(' '), s2 = first.rfind(' ');
      rq.method = first.substr(0, s1);
      std::string target = first.substr(s1 + 1, s2 - s1 - 1);
      auto q = target.find('?');
      rq.path = target.substr(0, q);
      if (q != std::string::npos) rq.query = target.substr(q + 1);
      size_t pos = line_end + 2;
      while (pos < head.size()) {
        size_t e = head.find("\r\n", pos);
        if (e == std::string::npos) e = head.size();
        std::string h = head.substr(pos, e - pos);
        auto colon = h.find(':');
        if (colon != std::string::npos) {
          std::string k = h.substr(0, colon);
          for (auto& ch : k) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
          std::string v = h.substr(colon + 1);
          while (!v.empty() && v.front() == ' ') v.erase(0, 1);
          rq.headers[k] = v;
        }
        pos = e + 2;
      }
    }
    size_t want = rq.headers.count("content-length") ? std::stoul(rq.headers["content-length"]) : 0;
    rq.body = in.substr(hdr_end + 4);
    while (rq.body.size() < want) {
      ssize_t n = ::recv(c, buf, sizeof buf, 0);
      if (n <= 0) break;
      rq.body.append(buf, static_cast<size_t>(n));
    }
    Response r;
    try {
      r = handler_(rq);
    } catch (const std::exception& e) {
      r = Response{500, status_body(500, "InternalError", e.what())};
    }
    Stream w(c, stop_);
    std::string head = "HTTP/1.1 " + std::to_string(r.status) + " " + reason_phrase(r.status) +
                       "\r\nContent-Type: " + r.content_type + "\r\nConnection: close\r\n";
    if (r.stream) {
      head += "Transfer-Encoding: chunked\r\n\r\n";
      if (w.send_all(head)) {
        r.stream(w);
        if (!w.dropped()) w.send_all("0\r\n\r\n");
      }
    } else {
      head += "Content-Length: " + std::to_string(r.body.size()) + "\r\n\r\n";
      w.send_all(head + r.body);
    }
    ::shutdown(c, w.dropped() ? SHUT_RDWR : SHUT_WR);
    ::close(c);
  }

  Handler handler_;
  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> connections_{0};
  std::chrono::steady_clock::time_point deadline_;
  std::thread acceptor_;
  std::mutex mu_;
  std::vector<std::thread> threads_;
};

}  // namespace fakeapi
