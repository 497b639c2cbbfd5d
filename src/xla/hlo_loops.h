// Collectives inside loops of a partitioned program (issue #45 item 4: the runbook's KDA step spent 97.6% of
// its time in all-gathers the SPMD partitioner put inside every chunk-scan iteration). The check reads the
// HLO right after XLA's SPMD partitioner, before later passes: XLA:CPU's loop-invariant code motion hoists
// such a gather out of the loop afterwards, so the optimised CPU program looks clean while a TPU or GPU
// program keeps it (measured with JAX).
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "xla/pjrt.h"

namespace olmosft::xla {

// One collective found inside a while loop's body (or a computation the body calls).
struct LoopCollective {
  std::string opcode;       // all-gather, all-to-all, collective-permute, all-reduce, reduce-scatter (-start)
  std::string computation;  // the computation holding it
  std::string loop;         // the while instruction whose body reaches it
  std::string line;         // the HLO instruction, as dumped
};

// The collectives of HLO (HloModule text) reachable from a while body: through nested whiles and the
// computations they call (calls=, to_apply=, body=, condition=, branch_computations=).
std::vector<LoopCollective> collectives_in_loops(std::string_view hlo);

// Compiles MLIR on CLIENT as OPTIONS say, with the module dumped right after SPMD partitioning
// (xla_dump_to + xla_dump_hlo_pass_re through CompileOptions::env_option_overrides), and returns that HLO
// text. Throws when the plugin wrote no such dump (an unpartitioned compile: num_partitions 1).
std::string partitioned_hlo(const Client& client, std::string_view mlir, CompileOptions options);

}  // namespace olmosft::xla
