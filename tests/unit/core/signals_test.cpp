// core/signals.h: SIGTERM and SIGINT are taken on the routed thread only, never on a thread computing in
// oneDNN's JIT GEMM (which points %rsp into the heap; a signal frame written there corrupts it).
#include "core/signals.h"

#include <gtest/gtest.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "kernels/gemm_onednn.h"

namespace olmosft {
namespace {

std::atomic<int> g_handled{0}, g_off_thread{0};

extern "C" void count_signal(int) {
  g_handled.fetch_add(1);
  if (!on_stop_signal_thread()) g_off_thread.fetch_add(1);
}

bool term_blocked_here() {
  sigset_t cur;
  pthread_sigmask(SIG_SETMASK, nullptr, &cur);
  return sigismember(&cur, SIGTERM) == 1;
}

// Each ctest case is its own process (gtest_discover_tests), so routing here is the process's first.
TEST(StopSignals, TakenOnTheRoutedThreadWhileOneDnnComputes) {
  route_stop_signals();
  route_stop_signals();  // idempotent: still one thread
  ASSERT_TRUE(stop_signals_routed());
  EXPECT_TRUE(term_blocked_here());
  EXPECT_FALSE(on_stop_signal_thread());
  struct sigaction sa {
  }, old_term{}, old_int{};
  sa.sa_handler = count_signal;
  sigemptyset(&sa.sa_mask);
  ASSERT_EQ(sigaction(SIGTERM, &sa, &old_term), 0);
  ASSERT_EQ(sigaction(SIGINT, &sa, &old_int), 0);

  // A shape whose oneDNN 2.6 kernel keeps %rsp in the heap: without routing, signals to this thread give
  // wrong products at once and then a corrupted heap (checked by disabling the routing).
  const int64_t M = 64, N = 128, K = 256;
  std::vector<float> a(size_t(M * K)), b(size_t(K * N)), ref(size_t(M * N)), c(size_t(M * N));
  for (size_t i = 0; i < a.size(); ++i) a[i] = float(i % 97) / 97.0f;
  for (size_t i = 0; i < b.size(); ++i) b[i] = float(i % 89) / 89.0f;
  onednn::matmul_f32(Trans::N, Trans::N, M, N, K, 1.0f, a.data(), K, b.data(), N, 0.0f, ref.data(), N);

  std::atomic<bool> stop{false};
  std::atomic<int> sent{0};
  std::thread sender([&] {  // started after routing: blocked too, so it never takes them itself
    while (!stop.load()) {
      ::kill(::getpid(), (sent.load() & 7) == 7 ? SIGINT : SIGTERM);  // process-directed, like kill(1)
      sent.fetch_add(1);
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  });
  int wrong = 0, runs = 0;
  const auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(1500) || g_handled.load() < 100) {
    onednn::matmul_f32(Trans::N, Trans::N, M, N, K, 1.0f, a.data(), K, b.data(), N, 0.0f, c.data(), N);
    wrong += std::memcmp(c.data(), ref.data(), c.size() * sizeof(float)) != 0;
    ++runs;
    if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(20)) break;
  }
  stop.store(true);
  sender.join();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the last ones land
  sigaction(SIGTERM, &old_term, nullptr);
  sigaction(SIGINT, &old_int, nullptr);
  std::printf("signals sent %d, handled %d (off the routed thread: %d), GEMMs %d\n", sent.load(),
              g_handled.load(), g_off_thread.load(), runs);
  EXPECT_GE(g_handled.load(), 100);
  EXPECT_EQ(g_off_thread.load(), 0);
  EXPECT_EQ(wrong, 0) << "a GEMM result changed while signals arrived";
}

TEST(StopSignals, UnblockedForAChildOnlyInItsScope) {
  {
    StopSignalsUnblocked none;
    EXPECT_FALSE(term_blocked_here());
  }  // not routed: nothing to undo
  route_stop_signals();
  EXPECT_TRUE(term_blocked_here());
  {
    const StopSignalsUnblocked child_mask;
    EXPECT_FALSE(term_blocked_here());
  }
  EXPECT_TRUE(term_blocked_here());
}

}  // namespace
}  // namespace olmosft
