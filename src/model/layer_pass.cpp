#include "model/layer_pass.h"

#include "core/error.h"
#include "model/params.h"
#include "model/xla_params.h"
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

// Segment SEG's group weights at group G in e.w (the first group's slots), gathered.
void use_group(unit::Emit& e, const LayerScan& s, const ScanSegment& seg,
               const std::vector<std::vector<Value>>& stacked, const Value& g, const PassLayout& lay) {
  for (int64_t j = 0; j < seg.period; ++j)
    for (size_t k = 0; k < s.params[size_t(seg.start + j)].size(); ++k) {
      const int i = s.params[size_t(seg.start + j)][k];
      const Value w = slice_of(e.b, stacked[size_t(j)][k], g);
      e.w[size_t(i)] = s.experts[size_t(i)] ? w : lay.gather(w);
    }
}

// Layers A and B repeat each other: same kind and the same tensor shapes in the same order.
bool repeats(const std::vector<LayerSpec>& specs, const XlaParams& xp, const LayerScan& s, int64_t a,
             int64_t b) {
  const auto &pa = s.params[size_t(a)], &pb = s.params[size_t(b)];
  if (!same_kind(specs[size_t(a)], specs[size_t(b)]) || pa.size() != pb.size()) return false;
  for (size_t k = 0; k < pa.size(); ++k)
    if (xp.list[size_t(pa[k])].shape != xp.list[size_t(pb[k])].shape) return false;
  return true;
}

// The MoE layers in SEG's group.
int64_t moe_count(const std::vector<LayerSpec>& specs, const ScanSegment& seg) {
  int64_t m = 0;
  for (int64_t j = 0; j < seg.period; ++j) m += specs[size_t(seg.start + j)].ffn == FfnKind::Moe;
  return m;
}

// BLOCK's forward again from X for its backward (remat); the MoE statistics it appends are dropped (the
// first forward took them).
unit::Block::Emitted reemit_forward(unit::Emit& e, const unit::Block& block, const Value& x) {
  const size_t stats = e.moe_stats.size();
  unit::Block::Emitted again;
  block.emit_forward(e, x, again);
  e.moe_stats.erase(e.moe_stats.begin() + long(stats), e.moe_stats.end());
  return again;
}

// SEG's stacked weights: [j][k] group layer j's tensor k over the groups, [G, ...].
std::vector<std::vector<Value>> stack_weights(unit::Emit& e, const LayerScan& s, const ScanSegment& seg,
                                              const PassLayout& lay) {
  xla::HloBuilder& b = e.b;
  std::vector<std::vector<Value>> stacked(static_cast<size_t>(seg.period));
  for (int64_t j = 0; j < seg.period; ++j)
    for (size_t k = 0; k < s.params[size_t(seg.start + j)].size(); ++k) {
      std::vector<Value> parts;
      for (int64_t g = 0; g < seg.groups; ++g)
        parts.push_back(lift(b, e.w[size_t(s.params[size_t(seg.start + g * seg.period + j)][k])], 1));
      stacked[size_t(j)].push_back(lay.stacked(b.concatenate(parts, 0)));
    }
  return stacked;
}

ScannedForward scanned_forward(unit::Emit& e, const DecoderUnits& u, const LayerScan& s,
                               const ScanSegment& seg, const Value& h0, const PassLayout& lay) {
  xla::HloBuilder& b = e.b;
  const int64_t P = seg.period, G = seg.groups;
  const std::vector<std::vector<Value>> stacked = stack_weights(e, s, seg, lay);
  const int64_t M = moe_count(layer_specs(e.c), seg);
  const std::vector<Value> outer = e.w;
  std::vector<Value> init{h0, lay.inputs(b.constant({xla::ElementType::kF32, {G, P, e.N, e.d}}, 0.0))};
  if (M > 0) init.push_back(b.constant({xla::ElementType::kF32, {G, M, 4}}, 0.0));
  const auto fin = b.for_loop(
      G, init,
      [&](xla::HloBuilder& b, const Value& g, const std::vector<Value>& c) {
        use_group(e, s, seg, stacked, g, lay);
        const size_t stats_before = e.moe_stats.size();
        Value h = c[0], inputs = c[1];
        for (int64_t j = 0; j < P; ++j) {
          inputs = b.dynamic_update_slice(inputs, lift(b, h, 2), at(b, {g, i32(b, j)}, 4));
          unit::Block::Emitted saved;
          h = lay.tokens(u.blocks[size_t(seg.start + j)].emit_forward(e, h, saved));
        }
        std::vector<Value> out{h, lay.inputs(inputs)};
        if (M > 0) {  // the group's statistics, one [4] per MoE layer, into the stacked [G, M, 4]
          Value st = c[2];
          for (int64_t m = 0; m < M; ++m)
            st = b.dynamic_update_slice(st, lift(b, e.moe_stats[stats_before + size_t(m)], 2),
                                        at(b, {g, i32(b, m)}, 3));
          out.push_back(st);
        }
        e.moe_stats.erase(e.moe_stats.begin() + long(stats_before),
                          e.moe_stats.end());  // the body's values: not visible after the loop
        return out;
      },
      xla::kLayerScanLoop);
  e.w = outer;
  for (int64_t g = 0; g < G; ++g)  // in layer order: group by group, the group's MoE layers in order
    for (int64_t m = 0; m < M; ++m)
      e.moe_stats.push_back(slice_of(b, slice_of(b, fin[2], i32(b, g)), i32(b, m)));
  return ScannedForward{fin[0], fin[1], stacked};
}

// The gradient w.r.t. the segment's first layer's input; every segment layer tensor's gradient set in e.g.
Value scanned_backward(unit::Emit& e, const DecoderUnits& u, const LayerScan& s, const ScanSegment& seg,
                       const ScannedForward& f, const Value& dy, const PassLayout& lay) {
  xla::HloBuilder& b = e.b;
  const int64_t P = seg.period, G = seg.groups;
  std::vector<Value> init{dy};
  for (int64_t j = 0; j < P; ++j)
    for (const Value& w : f.stacked_weights[size_t(j)])
      init.push_back(lay.stacked(b.constant(w.type(), 0.0)));
  const std::vector<Value> outer = e.w;
  const auto fin = b.for_loop(
      G, init,
      [&](xla::HloBuilder& b, const Value& i, const std::vector<Value>& c) {
        const Value g = b.sub(i32(b, G - 1), i);  // the groups in reverse
        use_group(e, s, seg, f.stacked_weights, g, lay);
        Value dh = c[0];
        std::vector<Value> sums(c.begin() + 1, c.end());
        size_t at_sum = sums.size();
        for (int64_t j = P; j-- > 0;) {
          const std::vector<int>& idx = s.params[size_t(seg.start + j)];
          const unit::Block& block = u.blocks[size_t(seg.start + j)];
          at_sum -= idx.size();
          std::vector<int64_t> sizes{1, 1, e.N, e.d};
          const Value x = b.reshape(b.dynamic_slice(f.inputs, at(b, {g, i32(b, j)}, 4), sizes), {e.N, e.d});
          const std::vector<Value> fenced = b.optimization_barrier({x, dh});
          for (int k : idx) e.g[size_t(k)].reset();
          const unit::Block::Emitted again = reemit_forward(e, block, fenced[0]);
          dh = lay.tokens(block.emit_backward(e, fenced[0], again, fenced[1]));
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
    for (size_t k = 0; k < s.params[size_t(seg.start + j)].size(); ++k, ++n)
      for (int64_t g = 0; g < G; ++g)
        e.g[size_t(s.params[size_t(seg.start + g * P + j)][k])] = slice_of(b, fin[n], i32(b, g));
  return fin[0];
}

}  // namespace

LayerScan layer_scan(const ModelConfig& c) {
  const std::vector<LayerSpec> specs = layer_specs(c);
  const XlaParams xp = xla_params(c);
  const int64_t L = static_cast<int64_t>(specs.size());
  LayerScan s;
  s.params.resize(size_t(L));
  for (size_t i = 0; i < xp.list.size(); ++i) {
    s.experts.push_back(xp.list[i].experts());
    if (xp.list[i].layer >= 0) s.params[size_t(xp.list[i].layer)].push_back(static_cast<int>(i));
  }
  for (int64_t at = 0; at < L;) {
    ScanSegment best{at, 1, 1};
    for (int64_t P = 1; 2 * P <= L - at; ++P) {
      auto next_repeats = [&](int64_t G) {  // layers AT + G * P .. repeat the group of P layers from AT
        for (int64_t j = 0; j < P; ++j)
          if (!repeats(specs, xp, s, at + j, at + G * P + j)) return false;
        return true;
      };
      int64_t G = 1;
      while (at + (G + 1) * P <= L && next_repeats(G)) ++G;
      if (P * (G - 1) > best.period * (best.groups - 1)) best = {at, P, G};
    }
    s.segments.push_back(best);
    at += best.period * best.groups;
  }
  return s;
}

LayerPass::LayerPass(unit::Emit& e, const DecoderUnits& u, bool scan, PassLayout lay)
    : e_(e), u_(u), lay_(std::move(lay)) {
  if (scan) scan_ = layer_scan(e.c);
  OLMO_CHECK(
      !scan || e.remat == Remat::Full, e.c.model_type_name,
      ": xla.scan_layers keeps only each layer's input for the backward: it needs model.remat full (got ",
      remat_name(e.remat), ")");
  // a scanned pass's single layers: their tensors gathered here, as the decoder gathers the unrolled pass's
  if (scan_)
    for (const ScanSegment& seg : scan_->segments)
      if (seg.groups == 1)
        for (int64_t l = seg.start; l < seg.start + seg.period; ++l)
          for (int k : scan_->params[size_t(l)])
            if (!scan_->experts[size_t(k)]) e_.w[size_t(k)] = lay_.gather(e_.w[size_t(k)]);
}

Value LayerPass::forward(const Value& h0) {
  h_.assign(u_.blocks.size(), std::nullopt);
  saved_.resize(u_.blocks.size());
  Value h = h0;
  auto one = [&](size_t l) {
    h_[l] = h;
    h = lay_.tokens(u_.blocks[l].emit_forward(e_, h, saved_[l]));
  };
  if (!scan_) {
    for (size_t l = 0; l < u_.blocks.size(); ++l) one(l);
    return h;
  }
  scanned_.assign(scan_->segments.size(), std::nullopt);
  for (size_t i = 0; i < scan_->segments.size(); ++i) {
    const ScanSegment& seg = scan_->segments[i];
    if (seg.groups == 1) {
      for (int64_t l = seg.start; l < seg.start + seg.period; ++l) one(size_t(l));
      continue;
    }
    scanned_[i] = scanned_forward(e_, u_, *scan_, seg, h, lay_);
    h = scanned_[i]->out;
  }
  return h;
}

Value LayerPass::remat_backward(size_t l, const Value& dh) {
  // the block's forward again from its input, fenced with the incoming gradient (its MoE statistics were
  // taken in the first forward)
  const std::vector<Value> fenced = e_.b.optimization_barrier({*h_[l], dh});
  const unit::Block::Emitted again = reemit_forward(e_, u_.blocks[l], fenced[0]);
  return lay_.tokens(u_.blocks[l].emit_backward(e_, fenced[0], again, fenced[1]));
}

Value LayerPass::backward(const Value& dy) {
  Value dh = dy;
  if (!scan_) {
    for (size_t l = u_.blocks.size(); l-- > 0;)
      dh = e_.remat == Remat::Full ? remat_backward(l, dh)
                                   : lay_.tokens(u_.blocks[l].emit_backward(e_, *h_[l], saved_[l], dh));
    return dh;
  }
  for (size_t i = scan_->segments.size(); i-- > 0;) {
    const ScanSegment& seg = scan_->segments[i];
    if (seg.groups > 1) {
      dh = scanned_backward(e_, u_, *scan_, seg, *scanned_[i], dh, lay_);
      continue;
    }
    for (int64_t l = seg.start + seg.period; l-- > seg.start;) dh = remat_backward(size_t(l), dh);
  }
  return dh;
}

}  // namespace olmosft::model
