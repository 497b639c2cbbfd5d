#include "model/layer_pass.h"

#include "core/error.h"
#include "model/params.h"
#include "xla/hlo_loops.h"

namespace olmosft::model {

namespace {

using xla::Value;

bool same_kind(LayerSpec a, const LayerSpec& b) {
  return a.mixer == b.mixer && a.ffn == b.ffn && a.window == b.window && a.rope == b.rope &&
         a.pre_norm == b.pre_norm && a.post_norm == b.post_norm && a.ffn_hidden == b.ffn_hidden;
}

Value i32(xla::HloBuilder& b, int64_t v) { return b.scalar(xla::ElementType::kS32, double(v)); }

// X [dims...] as [1, 1, dims...] / [1, dims...].
Value lift(xla::HloBuilder& b, const Value& x, int n) {
  std::vector<int64_t> d(size_t(n), 1);
  d.insert(d.end(), x.type().dims.begin(), x.type().dims.end());
  return b.reshape(x, d);
}
std::vector<Value> at(xla::HloBuilder& b, std::vector<Value> lead, size_t rank) {
  while (lead.size() < rank) lead.push_back(i32(b, 0));
  return lead;
}
// Element G of a stacked [G, dims...] value, as [dims...].
Value slice_of(xla::HloBuilder& b, const Value& stacked, const Value& g) {
  std::vector<int64_t> sizes = stacked.type().dims;
  sizes[0] = 1;
  const Value s = b.dynamic_slice(stacked, at(b, {g}, sizes.size()), sizes);
  return b.reshape(s, std::vector<int64_t>(sizes.begin() + 1, sizes.end()));
}

// The group's weights at group G in e.w (the layers of the first group's slots), gathered.
void use_group(unit::Emit& e, const LayerScan& s, const std::vector<std::vector<Value>>& stacked,
               const Value& g, const PassLayout& lay) {
  for (int64_t j = 0; j < s.period; ++j)
    for (size_t k = 0; k < s.params[size_t(j)].size(); ++k)
      e.w[size_t(s.params[size_t(j)][k])] = lay.gather(slice_of(e.b, stacked[size_t(j)][k], g));
}

}  // namespace

LayerScan layer_scan(const ModelConfig& c) {
  const std::vector<LayerSpec> specs = layer_specs(c);
  const std::vector<ParamSpec> reg = param_registry(c);
  const int64_t L = static_cast<int64_t>(specs.size());
  LayerScan s;
  s.params.resize(size_t(L));
  for (size_t i = 0; i < reg.size(); ++i)
    if (reg[i].layer >= 0) s.params[size_t(reg[i].layer)].push_back(static_cast<int>(i));
  for (const LayerSpec& l : specs)
    OLMO_CHECK(l.ffn != FfnKind::Moe, c.model_type_name, ": xla.scan_layers: layer ", l.index,
               " is a MoE layer, whose statistics the scanned loop does not carry out yet; use "
               "xla.scan_layers false");
  for (int64_t P = 1; P <= L; ++P) {
    if (L % P != 0) continue;
    bool ok = true;
    for (int64_t l = P; ok && l < L; ++l) {
      const auto &a = s.params[size_t(l)], &b = s.params[size_t(l % P)];
      ok = same_kind(specs[size_t(l)], specs[size_t(l % P)]) && a.size() == b.size();
      for (size_t k = 0; ok && k < a.size(); ++k) ok = reg[size_t(a[k])].shape == reg[size_t(b[k])].shape;
    }
    if (!ok) continue;
    s.period = P;
    s.groups = L / P;
    return s;
  }
  fail("unreachable: a group of all layers always repeats");
}

ScannedForward scanned_forward(unit::Emit& e, const DecoderUnits& u, const LayerScan& s, const Value& h0,
                               const PassLayout& lay) {
  xla::HloBuilder& b = e.b;
  const int64_t P = s.period, G = s.groups;
  std::vector<std::vector<Value>> stacked(
      static_cast<size_t>(P));  // [j][k]: layer j's tensor k over the groups
  for (int64_t j = 0; j < P; ++j)
    for (size_t k = 0; k < s.params[size_t(j)].size(); ++k) {
      std::vector<Value> parts;
      for (int64_t g = 0; g < G; ++g)
        parts.push_back(lift(b, e.w[size_t(s.params[size_t(g * P + j)][k])], 1));
      stacked[size_t(j)].push_back(lay.stacked(G == 1 ? parts[0] : b.concatenate(parts, 0)));
    }
  const std::vector<Value> outer = e.w;
  const Value inputs0 = lay.inputs(b.constant({xla::ElementType::kF32, {G, P, e.N, e.d}}, 0.0));
  const auto fin = b.for_loop(
      G, {h0, inputs0},
      [&](xla::HloBuilder& b, const Value& g, const std::vector<Value>& c) {
        use_group(e, s, stacked, g, lay);
        Value h = c[0], inputs = c[1];
        for (int64_t j = 0; j < P; ++j) {
          inputs = b.dynamic_update_slice(inputs, lift(b, h, 2), at(b, {g, i32(b, j)}, 4));
          unit::Block::Emitted saved;
          h = lay.tokens(u.blocks[size_t(j)].emit_forward(e, h, saved));
        }
        return std::vector<Value>{h, lay.inputs(inputs)};
      },
      xla::kLayerScanLoop);
  e.w = outer;
  return ScannedForward{fin[0], fin[1], stacked};
}

Value scanned_backward(unit::Emit& e, const DecoderUnits& u, const LayerScan& s, const ScannedForward& f,
                       const Value& dy, const PassLayout& lay) {
  xla::HloBuilder& b = e.b;
  const int64_t P = s.period, G = s.groups;
  std::vector<Value> init{dy};
  for (int64_t j = 0; j < P; ++j)
    for (const Value& w : f.stacked_weights[size_t(j)])
      init.push_back(lay.stacked(b.constant(w.type(), 0.0)));
  const std::vector<Value> outer = e.w;
  const auto fin = b.for_loop(
      G, init,
      [&](xla::HloBuilder& b, const Value& i, const std::vector<Value>& c) {
        const Value g = b.sub(i32(b, G - 1), i);  // the groups in reverse
        use_group(e, s, f.stacked_weights, g, lay);
        Value dh = c[0];
        std::vector<Value> sums(c.begin() + 1, c.end());
        size_t at_sum = sums.size();
        for (int64_t j = P; j-- > 0;) {
          const std::vector<int>& idx = s.params[size_t(j)];
          at_sum -= idx.size();
          std::vector<int64_t> sizes{1, 1, e.N, e.d};
          const Value x = b.reshape(b.dynamic_slice(f.inputs, at(b, {g, i32(b, j)}, 4), sizes), {e.N, e.d});
          const std::vector<Value> fenced = b.optimization_barrier({x, dh});
          for (int k : idx) e.g[size_t(k)].reset();
          unit::Block::Emitted again;
          u.blocks[size_t(j)].emit_forward(e, fenced[0], again);
          dh = lay.tokens(u.blocks[size_t(j)].emit_backward(e, fenced[0], again, fenced[1]));
          for (size_t k = 0; k < idx.size(); ++k) {
            const Value& w = e.w[size_t(idx[k])];
            const Value term = e.g[size_t(idx[k])] ? *e.g[size_t(idx[k])] : b.constant(w.type(), 0.0);
            Value& sum = sums[at_sum + k];
            sum = b.dynamic_update_slice(sum, lift(b, term, 1), at(b, {g}, sum.type().rank()));
          }
        }
        std::vector<Value> out{dh};
        for (const Value& v : sums) out.push_back(lay.stacked(v));
        return out;
      },
      xla::kLayerScanLoop);
  e.w = outer;
  size_t n = 1;  // every layer's gradient, sliced out of its stacked sum
  for (int64_t j = 0; j < P; ++j)
    for (size_t k = 0; k < s.params[size_t(j)].size(); ++k, ++n)
      for (int64_t g = 0; g < G; ++g)
        e.g[size_t(s.params[size_t(g * P + j)][k])] = slice_of(b, fin[n], i32(b, g));
  return fin[0];
}

LayerPass::LayerPass(unit::Emit& e, const DecoderUnits& u, bool scan, PassLayout lay)
    : e_(e), u_(u), lay_(std::move(lay)) {
  if (scan) scan_ = layer_scan(e.c);
  OLMO_CHECK(
      !scan || e.remat == Remat::Full, e.c.model_type_name,
      ": xla.scan_layers keeps only each layer's input for the backward: it needs model.remat full (got ",
      remat_name(e.remat), ")");
}

Value LayerPass::forward(const Value& h0) {
  if (scan_) {
    scanned_ = scanned_forward(e_, u_, *scan_, h0, lay_);
    return scanned_->out;
  }
  h_ = {h0};
  saved_.resize(u_.blocks.size());
  for (size_t l = 0; l < u_.blocks.size(); ++l)
    h_.push_back(lay_.tokens(u_.blocks[l].emit_forward(e_, h_[l], saved_[l])));
  return h_.back();
}

Value LayerPass::backward(const Value& dy) {
  if (scan_) return scanned_backward(e_, u_, *scan_, *scanned_, dy, lay_);
  xla::HloBuilder& b = e_.b;
  Value dh = dy;
  for (size_t l = u_.blocks.size(); l-- > 0;) {
    if (e_.remat != Remat::Full) {
      dh = lay_.tokens(u_.blocks[l].emit_backward(e_, h_[l], saved_[l], dh));
      continue;
    }
    // remat full: the block's forward again from its input, fenced with the incoming gradient (its MoE
    // statistics were taken in the first forward)
    const std::vector<Value> fenced = b.optimization_barrier({h_[l], dh});
    const size_t stats = e_.moe_stats.size();
    unit::Block::Emitted again;
    u_.blocks[l].emit_forward(e_, fenced[0], again);
    e_.moe_stats.erase(e_.moe_stats.begin() + long(stats), e_.moe_stats.end());
    dh = lay_.tokens(u_.blocks[l].emit_backward(e_, fenced[0], again, fenced[1]));
  }
  return dh;
}

}  // namespace olmosft::model
