#include "model/xla_params.h"

#include <algorithm>
#include <map>

#include "core/error.h"

namespace olmosft::model {

namespace {

// A routed expert's name without its index: "model.layers.3.mlp.experts.7.gate_proj.weight" ->
// "model.layers.3.mlp.experts.gate_proj.weight" (hf::expert's "experts.<e>." -> "experts.").
std::string stack_name(const std::string& name) {
  const std::string key = "experts.";
  const size_t at = name.find(key);
  OLMO_CHECK(at != std::string::npos, "xla_params: routed expert tensor ", name, " has no '", key, "'");
  const size_t dot = name.find('.', at + key.size());
  OLMO_CHECK(dot != std::string::npos, "xla_params: routed expert tensor ", name, " has no expert index");
  return name.substr(0, at + key.size()) + name.substr(dot + 1);
}

}  // namespace

XlaParams xla_params(const ModelConfig& c) {
  const std::vector<ParamSpec> reg = param_registry(c);
  XlaParams out;
  out.of.assign(reg.size(), -1);
  std::map<std::string, int> stacks;  // a stack's name -> its entry
  for (size_t i = 0; i < reg.size(); ++i) {
    const ParamSpec& s = reg[i];
    if (!s.routed_expert) {
      out.of[i] = int(out.list.size());
      out.list.push_back({s.name, s.shape, {int(i)}, s.layer, s.decay});
      continue;
    }
    const std::string name = stack_name(s.name);
    auto [it, fresh] = stacks.emplace(name, int(out.list.size()));
    if (fresh) out.list.push_back({name, s.shape, {}, s.layer, s.decay});
    XlaParam& p = out.list[size_t(it->second)];
    OLMO_CHECK(reg[size_t(p.members.empty() ? int(i) : p.members[0])].shape == s.shape && p.decay == s.decay,
               "xla_params: expert tensor ", s.name, " differs in shape or decay from the others of ", name);
    p.members.push_back(int(i));
    out.of[i] = it->second;
  }
  for (XlaParam& p : out.list)
    if (reg[size_t(p.members[0])].routed_expert) p.shape.insert(p.shape.begin(), int64_t(p.members.size()));
  return out;
}

int64_t numel(const XlaParam& p) { return shape_numel(p.shape); }

void pack(const XlaParam& p, const std::vector<const float*>& members, std::span<float> out) {
  OLMO_CHECK(members.size() == p.members.size() && int64_t(out.size()) == numel(p), "pack ", p.name, ": ",
             members.size(), " members into ", out.size(), " values");
  const size_t n = out.size() / members.size();  // the members share one shape (xla_params)
  for (size_t j = 0; j < members.size(); ++j) std::copy_n(members[j], n, out.data() + j * n);
}

void unpack(const XlaParam& p, std::span<const float> in, const std::vector<float*>& members) {
  OLMO_CHECK(members.size() == p.members.size() && int64_t(in.size()) == numel(p), "unpack ", p.name, ": ",
             in.size(), " values into ", members.size(), " members");
  const size_t n = in.size() / members.size();
  for (size_t j = 0; j < members.size(); ++j) std::copy_n(in.data() + j * n, n, members[j]);
}

}  // namespace olmosft::model
