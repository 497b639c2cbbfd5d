// The job's key-value store over TCP (issue #47, PJRT's distributed runtime): one process (rank 0) serves it
// for the whole job (KvServer) and every process, rank 0 included, reaches it through a KvClient, the
// xla::KeyValueStore an accelerator plugin's multi-node client calls (xla::ClientOptions::kv_store: the
// CUDA plugin exchanges its nodes' topologies, later NCCL ids, through it, from many threads at once, with
// blocking gets). Each call is one short TCP connection (so concurrent blocking gets never queue behind each
// other); a get waits on the server up to its timeout. Over MPI itself this does not work: the plugin blocks
// in a get from several threads while MPI is not thread-safe here.
//
// Wire format, one request and one reply per connection, integers little-endian u32:
//   request  op ('G' get, 'T' try-get, 'P' put), key length, key, then for P value length and value, for G
//            the timeout in ms;
//   reply    status (0 value: length and bytes follow; 1 absent: not put within the timeout, or no such key;
//            2 refused: a message follows), nothing more for a put's 0.
// Keys and values up to 64 MiB each; anything else is refused and the connection closed. Failures say the
// store's address and what failed: a server that does not answer within the client's connect timeout, a
// connection lost mid-call (the serving process died), a malformed reply.
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "xla/pjrt.h"

namespace olmosft::dist {

// "host:port" (host a name or an IPv4 address, port 1..65535), refused naming ADDRESS otherwise.
std::pair<std::string, int> parse_kv_address(const std::string& address);

class KvServer {
 public:
  // Listens on BIND:PORT (port 0: a free port, port() says which) and serves until destroyed; the
  // destructor wakes the gets still waiting (they answer absent) and waits for every connection to end.
  explicit KvServer(int port = 0, const std::string& bind = "0.0.0.0");
  ~KvServer();
  KvServer(const KvServer&) = delete;
  KvServer& operator=(const KvServer&) = delete;
  int port() const;
  size_t keys() const;  // keys put so far

 private:
  struct State;
  std::shared_ptr<State> s_;
};

struct KvClientOptions {
  // How long a call keeps retrying to connect (the server may start after its clients), and how long
  // beyond a get's own timeout (or, for try-get and put, at all) it waits for the reply.
  std::chrono::milliseconds connect_timeout{30000};
  std::chrono::milliseconds reply_margin{10000};
};

class KvClient final : public xla::KeyValueStore {
 public:
  explicit KvClient(const std::string& address, KvClientOptions options = {});
  std::optional<std::string> get(const std::string& key, std::chrono::milliseconds timeout) override;
  std::optional<std::string> try_get(const std::string& key) override;
  void put(const std::string& key, const std::string& value) override;
  const std::string& address() const { return address_; }

 private:
  std::string address_, host_;
  int port_ = 0;
  KvClientOptions o_;
};

}  // namespace olmosft::dist
