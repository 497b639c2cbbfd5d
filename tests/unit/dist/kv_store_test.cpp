// The job's key-value store over TCP (dist/kv_store.h): in one process (puts and gets, a get that waits for
// a put from another thread, many threads' blocking gets at once, a timeout within its bound, a missing key,
// a server gone, bad addresses); under mpirun -np 2 and 4 (rank 0 serves, the address sent once with
// MPI_Bcast, every rank's puts read by every other from many threads, a peer that never puts seen as a
// timeout within the bound); and as the CUDA plugin's kv callbacks: a 2-node client's options (node_id,
// num_nodes, the three callbacks) accepted up to "No visible GPU devices" on this machine without a GPU.
#include "dist/kv_store.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "../xla/xla_test_util.h"
#include "core/error.h"
#include "dist/comm.h"
#include "mpi_test_util.h"
#include "xla/pjrt.h"

using namespace olmosft;
using namespace olmosft::dist;
using std::chrono::milliseconds;

namespace {

using olmosft::xla::testutil::error_of;
bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

TEST(KvStore, PutGetTryGetAndAWaitingGet) {
  KvServer server;
  ASSERT_GT(server.port(), 0);
  KvClient c("127.0.0.1:" + std::to_string(server.port()));
  EXPECT_EQ(c.try_get("a"), std::nullopt);
  c.put("a", "1");
  EXPECT_EQ(c.try_get("a"), "1");
  EXPECT_EQ(c.get("a", milliseconds(0)), "1");
  c.put("a", "2");  // a put replaces
  EXPECT_EQ(c.get("a", milliseconds(100)), "2");
  const std::string bin("\0\x01\xff binary", 10);
  c.put("global_topology/cuda", bin);
  EXPECT_EQ(c.try_get("global_topology/cuda"), bin);
  c.put("empty", "");
  EXPECT_EQ(c.try_get("empty"), "");
  // a get waits for a put from another thread
  const auto t0 = std::chrono::steady_clock::now();
  std::thread late([&] {
    std::this_thread::sleep_for(milliseconds(300));
    KvClient("localhost:" + std::to_string(server.port())).put("late", "here");
  });
  EXPECT_EQ(c.get("late", milliseconds(10000)), "here");
  EXPECT_GE(seconds_since(t0), 0.25);
  late.join();
  EXPECT_EQ(server.keys(), 4u);
}

// 32 threads block in gets of keys that 32 other threads put later, each through its own connection.
TEST(KvStore, ManyThreadsBlockInGetsAtOnce) {
  KvServer server;
  const std::string addr = "127.0.0.1:" + std::to_string(server.port());
  std::atomic<int> got{0};
  std::vector<std::thread> ts;
  for (int i = 0; i < 32; ++i)
    ts.emplace_back([&, i] {
      KvClient c(addr);
      if (c.get("k" + std::to_string(i), milliseconds(20000)) == "v" + std::to_string(i)) ++got;
    });
  std::this_thread::sleep_for(milliseconds(200));
  for (int i = 0; i < 32; ++i)
    ts.emplace_back([&, i] { KvClient(addr).put("k" + std::to_string(i), "v" + std::to_string(i)); });
  for (auto& t : ts) t.join();
  EXPECT_EQ(got.load(), 32);
}

// A key nobody puts: the get answers absent after its timeout (not before, and within a second after).
TEST(KvStore, AGetTimesOutWithinItsBound) {
  KvServer server;
  KvClient c("127.0.0.1:" + std::to_string(server.port()));
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(c.get("never", milliseconds(500)), std::nullopt);
  const double s = seconds_since(t0);
  EXPECT_GE(s, 0.45);
  EXPECT_LT(s, 1.5);
}

// No server: a call fails after the connect timeout naming the address; a server that goes away while a get
// waits answers it (absent) as it stops; bad addresses are refused by name.
TEST(KvStore, AServerGoneAndBadAddressesAreClearErrors) {
  int port = 0;
  {
    KvServer s;
    port = s.port();
  }
  KvClient gone("127.0.0.1:" + std::to_string(port), {.connect_timeout = milliseconds(300)});
  const auto t0 = std::chrono::steady_clock::now();
  const std::string e = error_of([&] { gone.try_get("x"); });
  EXPECT_TRUE(contains(e, "kv store at 127.0.0.1:" + std::to_string(port) + ": no connection within 300 ms"))
      << e;
  EXPECT_TRUE(contains(e, "is the serving process (rank 0) up?")) << e;
  EXPECT_LT(seconds_since(t0), 2.0);
  auto server = std::make_unique<KvServer>();
  KvClient c("127.0.0.1:" + std::to_string(server->port()));
  std::thread stopper([&] {
    std::this_thread::sleep_for(milliseconds(200));
    server.reset();
  });
  EXPECT_EQ(c.get("never", milliseconds(30000)), std::nullopt);
  stopper.join();
  EXPECT_EQ(error_of([] { KvClient("nohost"); }), "kv store address `nohost`: expected host:port");
  EXPECT_EQ(error_of([] { KvClient("h:x1"); }), "kv store address `h:x1`: port `x1` is not a number");
  EXPECT_EQ(error_of([] { KvClient("h:70000"); }),
            "kv store address `h:70000`: port 70000 is not in 1..65535");
  EXPECT_TRUE(contains(error_of([] { KvServer(0, "not-an-ip"); }), "bind address `not-an-ip`")) << "";
}

// ---------------------------------------------------------------------------------------------
// Under mpirun: rank 0 serves, the address goes out once with MPI_Bcast; every rank puts its key and reads
// every other rank's from one thread per rank at once; with OLMOSFT_KV_WORKER=absent rank 1 never puts and
// the others see a timeout within the bound.
TEST(KvWorker, Run) {
  const char* env = std::getenv("OLMOSFT_KV_WORKER");
  if (!env) GTEST_SKIP() << "only runs under mpirun, started by the KvMpi tests";
  const bool absent = std::string(env) == "absent";
  auto comm = make_comm();
  ASSERT_EQ(comm->name(), "mpi");
  std::unique_ptr<KvServer> server;
  char addr[64] = {};
  if (comm->rank() == 0) {
    server = std::make_unique<KvServer>();
    std::snprintf(addr, sizeof addr, "127.0.0.1:%d", server->port());
  }
  comm->broadcast(addr, sizeof addr, 0);
  KvClient c(addr);
  const int r = comm->rank(), n = comm->size();
  if (!(absent && r == 1)) c.put("rank/" + std::to_string(r), "value of " + std::to_string(r));
  std::atomic<int> got{0}, missing{0};
  std::vector<std::thread> ts;
  const auto t0 = std::chrono::steady_clock::now();
  for (int q = 0; q < n; ++q)
    ts.emplace_back([&, q] {
      const auto v = KvClient(addr).get("rank/" + std::to_string(q), milliseconds(absent ? 1000 : 30000));
      if (v == "value of " + std::to_string(q)) ++got;
      if (!v) ++missing;
    });
  for (auto& t : ts) t.join();
  const double waited = seconds_since(t0);
  std::printf("KV-WORKER rank=%d got=%d missing=%d waited_s=%.2f\n", r, got.load(), missing.load(), waited);
  EXPECT_EQ(got.load(), absent ? n - 1 : n);
  EXPECT_EQ(missing.load(), absent ? 1 : 0);
  if (absent) {
    EXPECT_LT(waited, 5.0);
  }
  c.put("done/" + std::to_string(r), "1");
  if (r == 0) {  // the store lives until every rank is done with it
    for (int q = 0; q < n; ++q) EXPECT_EQ(c.get("done/" + std::to_string(q), milliseconds(30000)), "1");
  }
  comm->barrier();
}

TEST(KvMpi, EveryRankReadsEveryOthersKeys) {
  if (std::system("command -v mpirun > /dev/null 2>&1") != 0) GTEST_SKIP() << "skipped: no mpirun launcher";
  const auto scratch =
      std::filesystem::temp_directory_path() / ("olmosft-kv-mpi-" + std::to_string(::getpid()));
  std::filesystem::create_directories(scratch);
  for (int np : {2, 4}) {
    const mpitest::MpiRun run =
        mpitest::mpirun_worker(np, "OLMOSFT_KV_WORKER=all", "KvWorker.Run", scratch, 120);
    EXPECT_EQ(run.rc, 0) << run.log;
    int lines = 0;
    for (size_t p = run.log.find("KV-WORKER"); p != std::string::npos; p = run.log.find("KV-WORKER", p + 1))
      ++lines;
    EXPECT_EQ(lines, np) << run.log;
    EXPECT_TRUE(contains(run.log, "got=" + std::to_string(np) + " missing=0")) << run.log;
  }
  const mpitest::MpiRun run =
      mpitest::mpirun_worker(4, "OLMOSFT_KV_WORKER=absent", "KvWorker.Run", scratch, 120);
  EXPECT_EQ(run.rc, 0) << run.log;
  EXPECT_TRUE(contains(run.log, "got=3 missing=1")) << run.log;
  std::filesystem::remove_all(scratch);
}

// The kv store as the CUDA plugin's callbacks: a 2-node client (node_id 0 of num_nodes 2) is created up to
// the plugin's "no GPU" refusal, so the option names, their int64 types and the three callbacks are what
// it takes (an unknown option is refused by name before that: xla_cuda_target_test); a 2-node client
// without a store is refused by olmosft before the plugin sees it.
TEST(KvStore, CudaPluginTakesATwoNodeClientsOptions) {
  namespace x = olmosft::xla;
  const std::string plugin = x::Plugin::resolve("cuda");
  if (!std::filesystem::exists(plugin)) GTEST_SKIP() << "skipped: no CUDA plugin at " << plugin;
  KvServer server;
  auto store = std::make_shared<KvClient>("127.0.0.1:" + std::to_string(server.port()));
  std::string e;  // "" on a machine with a GPU (and a peer)
  try {
    x::Client::create("cuda", x::ClientOptions{.node_id = 0, .num_nodes = 2, .kv_store = store});
  } catch (const Error& err) {
    e = err.what();
  }
  std::printf("2-node CUDA client: %s (%zu keys put)\n", e.c_str(), server.keys());
  EXPECT_TRUE(e.empty() || contains(e, "No visible GPU devices")) << e;  // "": a GPU (and a peer)
  EXPECT_EQ(error_of([] { x::Client::create("cuda", x::ClientOptions{.node_id = 0, .num_nodes = 2}); }),
            "xla: a client of 2 nodes needs a key-value store (ClientOptions::kv_store) to exchange their "
            "topologies");
  EXPECT_EQ(error_of([&] {
              x::Client::create("cuda", x::ClientOptions{.node_id = 2, .num_nodes = 2, .kv_store = store});
            }),
            "xla: node_id 2 is not one of the 2 nodes");
}
