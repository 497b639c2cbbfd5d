// The stop signals (SIGTERM, SIGINT) taken on one thread of their own.
//
// The kernel writes a signal frame below the stack pointer of whichever thread takes a signal. oneDNN
// 2.6's JIT fp32 GEMM (Debian's libdnnl, jit_avx512_common_gemm_f32 and its AVX2 twin) points %rsp into a
// heap workspace while it runs, so a SIGTERM handled on a thread inside it writes that frame into the
// heap: freed-chunk aborts, or (worse) a finite garbage gradient that trains and checkpoints a wrong model
// (oneDNN issue #4845, fixed upstream in PR #4855, not in 2.6.3). Measured here: a burst of SIGTERMs to one
// rank of a 4-process run corrupted 12 of 40 runs, to a 2-thread single process 2 of 30; with the signals
// routed, 0 of 80 and 0 of 30 (docs/train.md "Checkpoints").
//
// route_stop_signals() blocks both signals in the calling thread, which every thread started after it
// inherits, and starts one thread that has them unblocked and only waits: the process's handlers (the
// trainer's) run there and nowhere else, and with no handler the default action still ends the process.
#pragma once

namespace olmosft {

// Call first in main(), before any thread starts (threads started earlier keep their mask). Idempotent.
void route_stop_signals();
// Whether route_stop_signals() ran in this process.
bool stop_signals_routed();
// True on the routed signal thread (async-signal-safe: a handler may ask).
bool on_stop_signal_thread();

// Unblocks the stop signals in the calling thread for its scope: around starting a child process (a
// child inherits the mask; kubectl or duckdb must stay stoppable by SIGTERM and Ctrl-C).
class StopSignalsUnblocked {
 public:
  StopSignalsUnblocked();
  ~StopSignalsUnblocked();
  StopSignalsUnblocked(const StopSignalsUnblocked&) = delete;
  StopSignalsUnblocked& operator=(const StopSignalsUnblocked&) = delete;

 private:
  bool was_blocked_ = false;
};

}  // namespace olmosft
