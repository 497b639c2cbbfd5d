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

// The names the decoder gives its loops (HloBuilder::for_loop's NAME; the while's op_name in HLO): the
// scanned layers' group loops, where per-layer weight gathers and gradient sums belong (FSDP), and the
// delta-rule (KDA, GDN) recurrences and chunk scans, where no collective may sit.
inline constexpr char kLayerScanLoop[] = "olmosft.layer_scan";
inline constexpr char kDeltaRuleLoop[] = "olmosft.delta_rule";
inline constexpr char kAttentionLoop[] = "olmosft.attention";  // blocks and rows of the blockwise attention
inline constexpr char kXentLoop[] = "olmosft.xent";            // the cross-entropy's vocabulary tiles

// One collective found inside a while loop's body (or a computation the body calls).
struct LoopCollective {
  std::string opcode;       // all-gather, all-to-all, collective-permute, all-reduce, reduce-scatter (-start)
  std::string computation;  // the computation holding it
  std::string loop;         // the while instruction whose body reaches it
  std::string loop_name;    // that while's op_name metadata (kLayerScanLoop, ...), "" when it has none
  std::string line;         // the HLO instruction, as dumped
};

// The collectives of HLO (HloModule text) reachable from a while body: through nested whiles and the
// computations they call (calls=, to_apply=, body=, condition=, branch_computations=).
std::vector<LoopCollective> collectives_in_loops(std::string_view hlo);
// Whether a collective inside loop NAME is one the decoder does not mean to have: any olmosft loop but the
// layer scan (XLA's own loops, e.g. libtpu's windowed einsums, are unnamed and not judged).
bool unwanted_loop_collective(const LoopCollective& c);

// A temporary folder a compile dumps its module into right after SPMD partitioning (xla_dump_to +
// xla_dump_hlo_pass_re through CompileOptions::env_option_overrides; any plugin's compile, with a client
// or for a topology), removed with the object.
class PartitionedDump {
 public:
  PartitionedDump();
  ~PartitionedDump();
  PartitionedDump(const PartitionedDump&) = delete;
  PartitionedDump& operator=(const PartitionedDump&) = delete;
  void add_to(CompileOptions& options) const;
  // The dumped HLO text; throws when the compile wrote none (an unpartitioned compile: num_partitions 1).
  std::string text(const CompileOptions& options) const;

 private:
  std::string dir_;
};

// Compiles MLIR on CLIENT as OPTIONS say and returns its HLO right after SPMD partitioning.
std::string partitioned_hlo(const Client& client, std::string_view mlir, CompileOptions options);

}  // namespace olmosft::xla
