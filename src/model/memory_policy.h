// What a model keeps between its forward and backward: the activation-memory policy (recipe keys
// model.remat and model.saved_dtype; docs/model.md "Memory"). CausalLM::set_memory_policy applies it.
#pragma once
#include <string>

namespace olmosft::model {

// What a model keeps between its forward and backward (recipe keys model.remat and model.saved_dtype;
// docs/model.md "Memory"):
//   remat none: every layer unit keeps its Saved for the backward (the fastest; the most memory);
//         full: each block keeps only its input; its backward first re-runs the block's forward from it into
//               one Saved shared by all layers (one extra forward per step; the runbook's remat_policy=full);
//         attn: blocks keep their own tensors and the FFN's Saved, and the mixer (softmax attention / KDA)
//               re-runs its forward from its saved input before its backward.
//   Losses and gradients are bit-identical under every remat policy.
//   saved_dtype bf16: the activations kept between forward and backward are stored rounded to bf16 (per-token
//         statistics such as RMS-norm and softmax normalisers stay fp32); fp32 computes from fp32 copies.
enum class Remat { None, Full, Attn };
enum class SavedDtype { F32, BF16 };
struct MemoryPolicy {
  Remat remat = Remat::None;
  SavedDtype saved = SavedDtype::F32;
  bool operator==(const MemoryPolicy&) const = default;
};
// "none" | "full" | "attn" and "fp32" | "bf16"; anything else throws naming `where` and the choices.
Remat parse_remat(const std::string& text, const std::string& where);
SavedDtype parse_saved_dtype(const std::string& text, const std::string& where);
const char* remat_name(Remat r);
const char* saved_dtype_name(SavedDtype s);

}  // namespace olmosft::model
