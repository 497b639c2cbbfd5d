#include "core/signals.h"

#include <pthread.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "core/error.h"

namespace olmosft {

namespace {

std::atomic<long> g_signal_tid{0};  // the routed thread's kernel thread id; 0 = not routed
static_assert(std::atomic<long>::is_always_lock_free, "read in signal handlers");

sigset_t stop_set() {
  sigset_t s;
  sigemptyset(&s);
  sigaddset(&s, SIGTERM);
  sigaddset(&s, SIGINT);
  return s;
}

long this_tid() { return static_cast<long>(::syscall(SYS_gettid)); }

}  // namespace

void route_stop_signals() {
  if (g_signal_tid.load() != 0) return;
  const sigset_t s = stop_set();
  OLMO_CHECK(::pthread_sigmask(SIG_BLOCK, &s, nullptr) == 0, "route_stop_signals: pthread_sigmask failed");
  std::atomic<bool> up{false};
  std::thread([&up, s] {
    g_signal_tid.store(this_tid());
    ::pthread_sigmask(SIG_UNBLOCK, &s, nullptr);
    up.store(true);
    for (;;) ::pause();  // handlers run here; the process never joins this thread
  }).detach();
  while (!up.load()) std::this_thread::yield();
}

bool stop_signals_routed() { return g_signal_tid.load() != 0; }

bool on_stop_signal_thread() {
  const long t = g_signal_tid.load();
  return t != 0 && t == this_tid();
}

StopSignalsUnblocked::StopSignalsUnblocked() {
  if (!stop_signals_routed()) return;
  sigset_t cur;
  ::pthread_sigmask(SIG_SETMASK, nullptr, &cur);
  was_blocked_ = sigismember(&cur, SIGTERM) == 1;
  if (!was_blocked_) return;
  const sigset_t s = stop_set();
  ::pthread_sigmask(SIG_UNBLOCK, &s, nullptr);
}

StopSignalsUnblocked::~StopSignalsUnblocked() {
  if (!was_blocked_) return;
  const sigset_t s = stop_set();
  ::pthread_sigmask(SIG_BLOCK, &s, nullptr);
}

}  // namespace olmosft
